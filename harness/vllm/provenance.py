"""Provenance records for real vLLM engines, in the fake engines' format (CONTRACTS.md §1), from two
observations: the legs the recording relay saw (`harness.worlds.real.relay`) and each decode's NIXL
scheduler log (vLLM's own DEBUG lines, routed to a file of their own by `logging_config`).

Why the log: vLLM's answer does not say whether a decode pulled its KV. From 0.32 `cached_tokens` on a
decode reports the prefill's cache hits, and the Prometheus counters (`prompt_tokens_by_source`) are per
engine, not per request. The NIXL scheduler logs, per request, `update_state_after_alloc:
num_external_tokens=N, kv_transfer_params={...}` with the `remote_request_id` the prefill answered: N > 0 is
a pull, N = 0 a local recompute (e.g. fewer remote tokens than vLLM's recompute threshold); a failed load
is logged as `NIXL transfer failure: <type> | Context: {... 'request_id': ...}`.

A decode leg that answered 200 but has no such line has no evidence: it gets no record (the checkers then
count it as unseen rather than guess).

A leg the engine refused (an HTTP error status, a gRPC status code before any message) or that its caller
cut before it began (499) is also a `generate` engine call (CONTRACTS.md §1), as the fakes record such a leg;
its failed handoff record stays, as the handoff and legs checkers have always read it, and leaves the leg's
shape to the call (one shape per leg for the contract checkers). A decode that answered an error after a
failed KV load (the NIXL log names it) ran: a failed handoff, no call, as a fake's failed pull.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_engines.core.calls import GENERATE, caller_of, make_call
from fake_engines.core.records import find_tag, make_record

NIXL_LOGGER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
_ALLOC_RE = re.compile(
    r"update_state_after_alloc: num_external_tokens=(\d+), kv_transfer_params=.*?"
    r"'remote_request_id': '([^']+)'")
# A failed load names the decode's own internal request id (`<answer id>-<n>-<hex>`).
_FAILURE_RE = re.compile(r"NIXL transfer failure: (\w+) \| Context: .*?'request_id': '([^']+)'")
_INTERNAL_SUFFIX = re.compile(r"-\d+-[0-9a-f]+$")


def logging_config(nixl_log: Path) -> dict[str, Any]:
    """A logging dictConfig for one vLLM server (VLLM_LOGGING_CONFIG_PATH): vLLM's INFO lines to stdout as
    usual, the NIXL connector's DEBUG lines to `nixl_log` (and nothing else at DEBUG)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(name)s] %(message)s"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "plain", "level": "INFO",
                        "stream": "ext://sys.stdout"},
            "nixl": {"class": "logging.FileHandler", "formatter": "plain", "level": "DEBUG",
                     "filename": str(nixl_log)},
        },
        "loggers": {
            "vllm": {"handlers": ["console"], "level": "INFO", "propagate": False},
            NIXL_LOGGER: {"handlers": ["nixl"], "level": "DEBUG", "propagate": True},
        },
    }


@dataclass
class NixlLog:
    """What a decode's NIXL log says: tokens planned to be pulled per remote_request_id (the largest count:
    once its KV is in, vLLM schedules the request again and logs 0), and its failed loads, keyed by the
    decode's answer id, with the failure type."""

    pulled: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def read(self, lines: Iterable[str]) -> NixlLog:
        for line in lines:
            m = _ALLOC_RE.search(line)
            if m:
                self.pulled[m.group(2)] = max(self.pulled.get(m.group(2), 0), int(m.group(1)))
                continue
            f = _FAILURE_RE.search(line)
            if f:
                self.failed.setdefault(_INTERNAL_SUFFIX.sub("", f.group(2)), f.group(1))
        return self


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def _tag(leg: Mapping[str, Any]) -> str | None:
    # Legs files from before the relays kept the tag have the prompt to find it in.
    return leg.get("tag") if "tag" in leg else find_tag(str(leg.get("prompt") or ""))


def refused(leg: Mapping[str, Any], log: NixlLog) -> bool:
    """Whether a relayed leg never ran on its engine: refused with an error status, or cut by its caller
    before it began. 0 (the engine could not be reached) is no call the engine answered; a decode whose
    failed KV load the NIXL log names had begun."""
    status = leg.get("status")
    if not isinstance(status, int) or 200 <= status < 300 or status == 0:
        return False
    return not (leg.get("kind") == "decode" and str(leg.get("request_id")) in log.failed)


def leg_call(leg: Mapping[str, Any], log: NixlLog) -> dict[str, Any] | None:
    """The `generate` engine call of a refused leg (None: the leg ran), stamped when the leg arrived."""
    if not refused(leg, log):
        return None
    status = int(leg["status"])
    duration = float(leg.get("duration_s") or 0.0)
    shape = leg.get("leg")
    return make_call(
        ts=float(leg.get("ts") or 0.0) - duration, engine=str(leg.get("engine")),
        engine_id=str(leg.get("engine_id") or ""), generation=int(leg.get("generation") or 0),
        role=str(leg.get("role")), call=GENERATE, status=status, duration_s=duration,
        caller=caller_of(leg.get("caller")),
        detail={"request_id": leg.get("request_id"), "tag": _tag(leg),
                "leg": dict(shape) if isinstance(shape, Mapping) else None,
                "error": leg.get("error") or f"HTTP {status}"},
    )


def leg_record(leg: Mapping[str, Any], log: NixlLog) -> dict[str, Any] | None:
    """The provenance record of one relayed leg (None: no evidence of what the decode did). A decode that
    answered 200 after a failed load recomputed (vLLM's `recompute` policy); under `fail` it answers an
    error, a failed leg. The record carries the leg's shape unless its `generate` call does (`leg_call`)."""
    kind = str(leg.get("kind"))
    ok = leg.get("status") == 200 and not leg.get("error")
    told = leg.get("told") if isinstance(leg.get("told"), dict) else {}
    answered = leg.get("answered") if isinstance(leg.get("answered"), dict) else {}
    error = leg.get("error") or (None if ok else f"HTTP {leg.get('status')}")
    remote_engine_id = remote_request_id = None
    request_id = str(leg.get("request_id"))
    if kind == "prefill":
        ok = ok and bool(answered)
        outcome = "computed" if ok else "failed"
        error = None if ok else (error or "no kv_transfer_params in the answer")
        # The id a decode is told (`remote_request_id`) is the prefill's own name for the request.
        request_id = str(answered.get("remote_request_id") or request_id)
    elif kind == "decode":
        remote_engine_id = told.get("remote_engine_id")
        remote_request_id = told.get("remote_request_id")
        failure = log.failed.get(request_id)
        if not ok:
            outcome = "failed"
            error = f"{error} (NIXL: {failure})" if failure else error
        elif failure:
            outcome = "recomputed"
        else:
            n = log.pulled.get(str(remote_request_id))
            if n is None:
                return None
            outcome = "pulled" if n > 0 else "recomputed"
    else:
        kind, outcome = "local", ("computed" if ok else "failed")
    prompt = str(leg.get("prompt") or "")
    shape = leg.get("leg")
    return make_record(
        ts=float(leg.get("ts") or 0.0), engine=str(leg.get("engine")),
        engine_id=str(leg.get("engine_id") or ""),
        generation=int(leg.get("generation") or 0), role=str(leg.get("role")), kind=kind,
        request_id=request_id, tag=_tag(leg), connector=str(leg.get("connector")),
        prompt_digest=_digest(prompt), outcome=outcome, duration_s=float(leg.get("duration_s") or 0.0),
        output_digest=None, remote_engine_id=remote_engine_id, remote_request_id=remote_request_id,
        error=None if outcome in ("computed", "pulled", "recomputed") else error,
        leg=dict(shape) if isinstance(shape, Mapping) and not refused(leg, log) else None,
    )


def records_from(legs: Iterable[Mapping[str, Any]], log: NixlLog) -> list[dict[str, Any]]:
    """Each leg's handoff record (when there is evidence) and, for a refused leg, its `generate` call."""
    out = []
    for leg in legs:
        for rec in (leg_record(leg, log), leg_call(leg, log)):
            if rec is not None:
                out.append(rec)
    return out
