"""The shape of a router's events (CONTRACTS §2): each documented type with its fields and their values.

An operator reads these during an outage, and tools parse them: an event with a field missing, a value of
another kind, or a type nobody documented misleads as much as a wrong one. The rules are the documented ones,
never the router's own code: a router under test cannot vouch for itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.value_checks import Check, flag, one_of, seconds, shape_problems, text, text_or_null, whole

STATUSES = frozenset({"pending", "ready", "not_ready", "failed", "draining", "removed"})
CONNECTORS = frozenset({"mooncake", "nixl", "none"})
DISPATCH_OUTCOMES = frozenset({"ok", "prefill_failed", "decode_failed", "decode_stream_failed"})
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


def _id_or_null(v: object) -> bool:
    return v is None or text(v)


_WHERE: dict[str, Check] = {"worker": text, "url": text}
FIELDS: dict[str, dict[str, Check]] = {
    "probe": {**_WHERE, "ok": flag, "duration_s": seconds},
    "status_change": {**_WHERE, "from": one_of(STATUSES, null=True), "to": one_of(STATUSES)},
    "metadata_read": {**_WHERE, "outcome": one_of(READ_OUTCOMES), "read": one_of(RAW_READS),
                      "duration_s": seconds},
    "engine_id": {**_WHERE, "old": _id_or_null, "new": _id_or_null, "confirmed": flag, "reason": text},
    "worker_suspect": {**_WHERE, "error": text},
    "breaker": {**_WHERE, "from": one_of(BREAKER_STATES), "to": one_of(BREAKER_STATES),
                "reason": one_of(BREAKER_REASONS), "failures": whole, "request_id": _id_or_null,
                "error": _id_or_null},
    "mint_skipped": {**_WHERE, "reason": one_of(MINT_SKIPPED_REASONS), "request_id": text},
    "dispatch": {"request_id": text, "prefill": _id_or_null, "decode": text,
                 "connector": one_of(CONNECTORS, null=True), "transfer_id": _id_or_null,
                 "remote_engine_id": _id_or_null, "status": whole},
}
# Compatible extensions (CONTRACTS §2): absent is fine, present must be as documented.
OPTIONAL: dict[str, dict[str, Check]] = {
    "dispatch": {"prefill_url": text, "decode_url": text, "outcome": one_of(DISPATCH_OUTCOMES),
                 "error": text_or_null, "retried_from": lambda v: isinstance(v, list) and all(map(text, v))},
}


# The worker API record W (CONTRACTS §2): what `GET /workers` answers for each worker.
WORKER_FIELDS: dict[str, Check] = {
    "id": text, "url": text, "role": one_of(frozenset({"prefill", "decode", "regular"})),
    "transport": one_of(frozenset({"http", "grpc"})), "connector": _id_or_null,
    "bootstrap_port": lambda v: v is None or whole(v), "status": one_of(STATUSES - {"removed"}),
    "kv_engine_id": _id_or_null, "engine_id_confirmed": flag, "labels": lambda v: isinstance(v, dict),
    "priority": lambda v: isinstance(v, int) and not isinstance(v, bool), "dp_size": whole,
    "breaker": one_of(BREAKER_STATES),
}


def worker_problems(worker: Mapping[str, Any]) -> list[str]:
    """What is wrong with one worker API record's shape: empty when it is W as documented."""
    return shape_problems(WORKER_FIELDS, worker)


def event_problems(kind: str | None, fields: Mapping[str, Any]) -> list[str]:
    """What is wrong with one event's shape: empty when it is as documented."""
    checks = FIELDS.get(str(kind))
    if checks is None:
        return [f"has a type the contract does not document ({kind!r})"]
    # A documented field is there even when it is null: an event that leaves one out says nothing of it.
    out = [f"lacks {name}" for name in checks if name not in fields]
    out += shape_problems(checks, fields, OPTIONAL.get(str(kind)))
    if out:
        return sorted(set(out), key=out.index)
    if kind == "metadata_read" and fields["outcome"] not in OUTCOMES_OF_READ[fields["read"]]:
        out.append(f"records a {fields['read']} read as outcome {fields['outcome']!r}")
    if kind == "breaker" and fields["to"] == "open" and not text(fields.get("error")):
        out.append("opens the breaker without the failure that opened it (error)")
    if kind == "breaker" and fields["reason"] in _BY_A_REQUEST and not text(fields.get("request_id")):
        out.append(f"moves the breaker for {fields['reason']} without the request whose outcome moved it "
                   "(request_id)")
    return out


# Breaker moves a request's outcome makes: the event names that request.
_BY_A_REQUEST = frozenset({"consecutive_failures", "trial_succeeded", "trial_failed"})
