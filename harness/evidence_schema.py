"""The shape of the engines' records, the evidence every engine-side checker reads (CONTRACTS §1): a handoff
provenance record and an engine call record, their keys and the kind of each value.

A record of another shape is damaged evidence: a checker reading it could pass what it should fail (a
handoff without its `connector` is judged as no handoff at all). The rules are the documented ones, apart
from the code that writes the records, so a fault in the writer shows instead of vouching for itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.value_checks import (
    Check,
    object_or_null,
    one_of,
    seconds,
    shape_problems,
    text,
    text_or_null,
    whole,
)

ROLES = frozenset({"prefill", "decode", "both"})
KINDS = frozenset({"prefill", "decode", "local"})
OUTCOMES = frozenset({"computed", "pulled", "recomputed", "failed", "timed_out"})

HANDOFF_FIELDS: dict[str, Check] = {
    "engine": text, "engine_id": text, "generation": whole, "role": one_of(ROLES), "kind": one_of(KINDS),
    "request_id": text, "tag": text_or_null, "connector": text, "transfer_id": text_or_null,
    "remote_engine_id": text_or_null, "remote_request_id": text_or_null, "prompt_digest": text,
    "kv_digest": text_or_null, "outcome": one_of(OUTCOMES), "error": text_or_null, "duration_s": seconds,
    "output_digest": text_or_null,
}
# Compatible extensions: absent in records from before them, of their kind when present.
HANDOFF_EXTENSIONS: dict[str, Check] = {"peer": text_or_null, "peer_engine_id": text_or_null,
                                        "leg": object_or_null}
CALL_FIELDS: dict[str, Check] = {
    "engine": text, "engine_id": text_or_null, "generation": whole, "role": text_or_null, "call": text,
    "status": lambda v: v is None or whole(v), "duration_s": seconds, "caller": text,
    "detail": lambda v: isinstance(v, dict),
}


def record_problems(kind: str, record: Mapping[str, Any]) -> list[str]:
    """What is wrong with one engine record's shape (`kind`: handoff | engine_call); empty when it is as
    documented."""
    if kind == "handoff":
        return shape_problems(HANDOFF_FIELDS, record, HANDOFF_EXTENSIONS)
    if kind == "engine_call":
        return shape_problems(CALL_FIELDS, record)
    return []
