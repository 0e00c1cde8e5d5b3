"""Handoff provenance records (CONTRACTS.md §1) and prompt tag extraction."""

from __future__ import annotations

import re
from typing import Any

TAG_RE = re.compile(r"\[pdchaos:[^\]]+\]")

ROLES = ("prefill", "decode", "both")
KINDS = ("prefill", "decode", "local")
OUTCOMES = ("computed", "pulled", "recomputed", "failed", "timed_out")


def find_tag(text: str) -> str | None:
    """The first ``[pdchaos:...]`` tag in ``text``, or None."""
    m = TAG_RE.search(text)
    return m.group(0) if m else None


def make_record(
    *,
    ts: float,
    engine: str,
    engine_id: str,
    generation: int,
    role: str,
    kind: str,
    request_id: str,
    tag: str | None,
    connector: str,
    prompt_digest: str,
    outcome: str,
    duration_s: float,
    output_digest: str | None,
    transfer_id: str | None = None,
    remote_engine_id: str | None = None,
    remote_request_id: str | None = None,
    kv_digest: str | None = None,
    error: str | None = None,
    peer: str | None = None,
    peer_engine_id: str | None = None,
    leg: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One provenance record with exactly the contract's keys (and the compatible extensions ``peer``:
    "host:port" a decode pulled from, ``peer_engine_id``: the engine id it addressed there; null when it
    pulled nothing; ``leg``: the shape of the leg as it reached the engine, `core.calls.leg_shape`); bad enum
    values raise ValueError."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    return {
        "ts": ts,
        "engine": engine,
        "engine_id": engine_id,
        "generation": generation,
        "role": role,
        "kind": kind,
        "request_id": request_id,
        "tag": tag,
        "connector": connector,
        "transfer_id": transfer_id,
        "remote_engine_id": remote_engine_id,
        "remote_request_id": remote_request_id,
        "prompt_digest": prompt_digest,
        "kv_digest": kv_digest,
        "outcome": outcome,
        "error": error,
        "duration_s": duration_s,
        "output_digest": output_digest,
        "peer": peer,
        "peer_engine_id": peer_engine_id,
        "leg": leg,
    }
