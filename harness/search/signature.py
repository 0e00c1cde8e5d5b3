"""Failure signatures: (checker, reason class). Shrinking keeps a signature, so the smaller scenario fails for
the same reason and not merely somewhere.

The reason class drops what varies between two runs of one failure (counts, times, engine names, fault
ids, engine ids, parenthesised detail) and keeps what names the mechanism ("not seen Ready", "request(s)
lost", "stale_engine_id").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Verdicts about the run itself, not about the router: never a signature.
HARNESS_VERDICTS = frozenset({"run_complete", "timeline", "faults", "determinism"})
# A handoff failure is classed by its worst problem, in this order.
HANDOFF_PROBLEMS = (
    "digest_mismatch", "stale_engine_id", "local_compute", "recomputed", "timed_out", "failed",
)

_PAREN = re.compile(r"\([^()]*\)")
_ENGINE = re.compile(r"\b(prefill|decode)-\d+\b")
_FAULT_ID = re.compile(r"\bf\d+_[a-z_]+\b")
_HEX = re.compile(r"\b[0-9a-f]{6,}\b")
_NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass(frozen=True, order=True)
class Signature:
    checker: str
    reason: str

    @property
    def text(self) -> str:
        return f"{self.checker}: {self.reason}"


def reason_class(checker: str, reason: str, numbers: dict[str, Any] | None = None) -> str:
    if checker in ("handoff", "handoff_strict"):
        problems = (numbers or {}).get("problems") or {}
        for p in HANDOFF_PROBLEMS:
            if p in problems:
                return p
    text = reason.split(";")[0]
    while _PAREN.search(text):
        text = _PAREN.sub("", text)
    # "f3_crash: prefill-0 not seen Ready ..." -> the part after the fault id
    text = _FAULT_ID.sub("<fault>", text)
    text = text.split("<fault>:", 1)[-1]
    text = _ENGINE.sub("<engine>", text)
    text = _HEX.sub("<id>", text)
    text = _NUMBER.sub("#", text)
    return " ".join(text.lower().split()).strip(" :")


def signatures(verdicts: Iterable[Any]) -> list[Signature]:
    """The failing checkers' signatures, in the order the verdicts came (the scenario's expectations)."""
    out: list[Signature] = []
    for v in verdicts:
        if v.status == "fail" and v.name not in HARNESS_VERDICTS:
            sig = Signature(v.name, reason_class(v.name, v.reason, v.numbers))
            if sig not in out:
                out.append(sig)
    return out


def run_is_sound(verdicts: Iterable[Any]) -> bool:
    """Every fault was applied and verified and every step fired: otherwise the run says nothing of the
    router (a schedule the world could not carry out)."""
    return all(v.status == "pass" for v in verdicts if v.name in ("timeline", "faults"))
