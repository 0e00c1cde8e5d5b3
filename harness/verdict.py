"""Verdicts: what a checker concludes from a history, and how several conclusions combine.

`unknown` is never a pass: it means the harness could not tell (run ended early, the router exposes no events,
nothing exercised the path). It always carries a reason so a reader knows what was missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

Status = Literal["pass", "fail", "unknown", "race"]
STATUSES: tuple[Status, ...] = ("pass", "fail", "unknown", "race")

# Higher wins when combining: one failure fails the whole; an unknown keeps a pass from being claimed. A race
# (a check that failed in some repeated runs of a cell and passed in others: `harness.races`) is a finding,
# below an unknown: a cell whose evidence is missing cannot claim to have split.
_RANK: dict[str, int] = {"pass": 0, "race": 1, "unknown": 2, "fail": 3}


@dataclass(frozen=True)
class Verdict:
    """One checker's conclusion.

    `numbers` holds measured values (JSON-able: floats, ints, None, nested dicts/lists), `evidence` short
    items a human can follow up (request ids, fault ids, record excerpts). `reason` is required for fail
    and unknown.
    """

    name: str
    status: Status
    reason: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"verdict status must be one of {STATUSES}, got {self.status!r}")
        if self.status != "pass" and not self.reason.strip():
            raise ValueError(f"a {self.status} verdict needs a reason ({self.name})")

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    @property
    def unknown(self) -> bool:
        return self.status == "unknown"

    @classmethod
    def ok(
        cls,
        name: str,
        reason: str = "",
        numbers: Mapping[str, Any] | None = None,
        evidence: Iterable[Any] | None = None,
    ) -> Verdict:
        return cls(name, "pass", reason, dict(numbers or {}), list(evidence or []))

    @classmethod
    def fail(
        cls,
        name: str,
        reason: str,
        numbers: Mapping[str, Any] | None = None,
        evidence: Iterable[Any] | None = None,
    ) -> Verdict:
        return cls(name, "fail", reason, dict(numbers or {}), list(evidence or []))

    @classmethod
    def unknown_(
        cls,
        name: str,
        reason: str,
        numbers: Mapping[str, Any] | None = None,
        evidence: Iterable[Any] | None = None,
    ) -> Verdict:
        """An unknown verdict (trailing underscore: `unknown` is the property)."""
        return cls(name, "unknown", reason, dict(numbers or {}), list(evidence or []))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "numbers": self.numbers,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        status = str(data.get("status", "unknown"))
        if status not in _RANK:
            status = "unknown"
        reason = str(data.get("reason") or "")
        if status != "pass" and not reason:
            reason = "no reason recorded"
        return cls(
            name=str(data.get("name", "")),
            status=cast(Status, status),
            reason=reason,
            numbers=dict(data.get("numbers") or {}),
            evidence=list(data.get("evidence") or []),
        )


def worst(statuses: Iterable[Status]) -> Status:
    """fail > unknown > race > pass; no statuses at all -> unknown (nothing was judged)."""
    found = list(statuses)
    if not found:
        return "unknown"
    return max(found, key=lambda s: _RANK[s])


def combine(verdicts: Iterable[Verdict], name: str = "overall") -> Verdict:
    """Fold checker verdicts into one: fail > unknown > race > pass.

    The reason lists the names (and reasons) of the verdicts that decided the outcome; numbers are keyed by
    checker name; evidence items are `{"checker": name, "item": ...}` from failing and unknown verdicts.
    An empty input is unknown: a run with nothing checked did not pass.
    """
    items = list(verdicts)
    if not items:
        return Verdict.unknown_(name, "no verdicts to combine")
    status = worst(v.status for v in items)
    deciding = [v for v in items if v.status == status]
    if status == "pass":
        reason = f"all {len(items)} checks passed"
    else:
        reason = "; ".join(f"{v.name}: {v.reason}" for v in deciding)
    numbers = {
        "counts": {s: sum(1 for v in items if v.status == s) for s in STATUSES},
        "by_checker": {v.name: v.status for v in items},
    }
    evidence = [{"checker": v.name, "item": e} for v in items if v.status != "pass" for e in v.evidence]
    return Verdict(name, status, reason, numbers, evidence)
