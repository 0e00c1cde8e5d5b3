"""The shape of a router's events (CONTRACTS §2): each documented type with its fields and their values.

An operator reads these during an outage, and tools parse them: an event with a field missing, a value of
another kind, or a type nobody documented misleads as much as a wrong one. The rules are the documented ones,
never the router's own code: a router under test cannot vouch for itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

STATUSES = frozenset({"pending", "ready", "not_ready", "failed", "draining", "removed"})
READ_OUTCOMES = frozenset({"id", "no_id", "error", "timeout"})
RAW_READS = frozenset({"complete", "partial", "error", "timeout"})
BREAKER_STATES = frozenset({"closed", "open", "half_open"})
BREAKER_REASONS = frozenset({"consecutive_failures", "open_elapsed", "trial_succeeded", "trial_failed",
                             "worker_recovered"})
MINT_SKIPPED_REASONS = frozenset({"no_engine_id", "connector_unknown", "no_bootstrap_port",
                                  "prefill_returned_no_kv_transfer_params"})
# What a complete or failed re-read may be recorded as (`metadata_read.outcome` against its raw `read`).
OUTCOMES_OF_READ = {"complete": {"id", "no_id"}, "partial": {"error"}, "error": {"error"},
                    "timeout": {"timeout"}}


def _text(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _text_or_null(v: Any) -> bool:
    return v is None or _text(v)


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


def _seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _one_of(values: frozenset[str], null: bool = False) -> Check:
    return lambda v: (null and v is None) or v in values


_WHERE: dict[str, Check] = {"worker": _text, "url": _text}
FIELDS: dict[str, dict[str, Check]] = {
    "probe": {**_WHERE, "ok": _flag, "duration_s": _seconds},
    "status_change": {**_WHERE, "from": _one_of(STATUSES, null=True), "to": _one_of(STATUSES)},
    "metadata_read": {**_WHERE, "outcome": _one_of(READ_OUTCOMES), "read": _one_of(RAW_READS),
                      "duration_s": _seconds},
    "engine_id": {**_WHERE, "old": _text_or_null, "new": _text_or_null, "confirmed": _flag, "reason": _text},
    "worker_suspect": {**_WHERE, "error": _text},
    "breaker": {**_WHERE, "from": _one_of(BREAKER_STATES), "to": _one_of(BREAKER_STATES),
                "reason": _one_of(BREAKER_REASONS), "failures": _count, "request_id": _text_or_null,
                "error": _text_or_null},
    "mint_skipped": {**_WHERE, "reason": _one_of(MINT_SKIPPED_REASONS), "request_id": _text},
    "dispatch": {"request_id": _text, "decode": _text, "status": _count},
}


def event_problems(kind: str | None, fields: Mapping[str, Any]) -> list[str]:
    """What is wrong with one event's shape: empty when it is as documented."""
    checks = FIELDS.get(str(kind))
    if checks is None:
        return [f"has a type the contract does not document ({kind!r})"]
    out = [f"has {name}={fields.get(name)!r}" if name in fields else f"lacks {name}"
           for name, ok in checks.items() if not ok(fields.get(name))]
    if out:
        return out
    if kind == "metadata_read" and fields["outcome"] not in OUTCOMES_OF_READ[fields["read"]]:
        out.append(f"records a {fields['read']} read as outcome {fields['outcome']!r}")
    if kind == "breaker" and fields["to"] == "open" and not _text(fields.get("error")):
        out.append("opens the breaker without the failure that opened it (error)")
    return out
