"""Availability before, during and after each fault window: success ratios against thresholds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.checkers._common import cap, rounded, select_faults
from harness.history import FaultView, History, RequestView
from harness.verdict import Verdict

NAME = "availability"


@dataclass(frozen=True)
class AvailabilityExpect:
    """Minimum success ratios (None: measure only). `before` also judges a run without faults. Requests
    in flight when a fault is applied count as `during`. The `after` window starts `settle_s` after the
    heal (time to be seen Ready again) and ends at the next (selected) fault's start or the end; a request
    of it still running at the next fault's start belongs to that fault (its `during`), like a `before`
    request. A window with a threshold and fewer than `min_requests` finished requests is unknown.

    `exclude_in_flight_at_fault`: `during` leaves out requests already in flight at one of the fault's cut
    instants (sent before it, over at or after it): its application and, for a flapping link, every later
    `note` of the fault with `enabled: false`. They may be lost by any correct router (on the wire at the
    cut); they are reported apart as `in_flight` (ok/failed/pending) and judged by no threshold. A cut's
    record is written around the action, not at the instant it bites (after the kill, whose teardown takes
    a few ms; after the Toxiproxy call): a request in flight within `cut_slack_s` of a cut is in flight at
    it (measured: up to ~15 ms apart)."""

    before: float | None = 0.95
    during: float | None = None
    after: float | None = 0.95
    settle_s: float = 2.0
    min_requests: int = 1
    faults: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    exclude_in_flight_at_fault: bool = False
    cut_slack_s: float = 0.05


def outcome(history: History, r: RequestView) -> str:
    """ok | failed | pending (not finished and the history ended before it had to)."""
    if r.completed:
        return "ok" if r.succeeded else "failed"
    deadline = r.deadline_t
    if (deadline is not None and deadline <= history.end_t) or (deadline is None and history.complete):
        return "failed"
    return "pending"


def request_end(history: History, r: RequestView) -> float:
    """When the request stopped occupying the system: completion, else its deadline, else forever."""
    if r.completed_t is not None:
        return r.completed_t
    return r.deadline_t if r.deadline_t is not None else float("inf")


def requests_in(
    history: History, name: str, start: float, end: float, bounded: bool = False
) -> list[RequestView]:
    """`before` (and `after` when `bounded`: a next fault starts at `end`): started in [start, end) and
    over before `end` (a request the fault cut short belongs to the fault); `during`: overlapping
    [start, end]; `after` of the last fault (and a run without faults): started in [start, end). A request
    carrying the client's own mistake is not the service's to serve: left out."""
    reqs = history.requests_started_in(start, end) if name != "during" else history.request_list()
    reqs = [r for r in reqs if r.mistake is None]
    if name == "before" or bounded:
        return [r for r in reqs if request_end(history, r) < end]
    if name == "during":
        return [
            r for r in reqs if r.start_t is not None and r.start_t < end and request_end(history, r) >= start
        ]
    return reqs


def cut_instants(history: History, fault: FaultView) -> list[float]:
    """When the fault cut things off: its application, then each later `note` of it saying the link went
    down again (a flapping link, CONTRACTS §10)."""
    cuts = [fault.applied_t] if fault.applied_t is not None else []
    for r in history.of_type("note"):
        t = r.get("t")
        if r.get("fault") == fault.fault and r.get("enabled") is False and isinstance(t, int | float):
            cuts.append(float(t))
    return sorted(cuts)


def in_flight_at(history: History, r: RequestView, cuts: list[float], slack_s: float = 0.0) -> bool:
    """Running at some instant within `slack_s` of one of the cuts."""
    start = r.start_t
    end = request_end(history, r)
    return start is not None and any(start < c + slack_s and end >= c - slack_s for c in cuts)


def _counts(history: History, reqs: list[RequestView]) -> dict[str, int]:
    kinds = [outcome(history, r) for r in reqs]
    return {k: kinds.count(k) for k in ("ok", "failed", "pending")}


def _window(
    history: History,
    name: str,
    start: float,
    end: float,
    threshold: float | None,
    exp: AvailabilityExpect,
    bounded: bool = False,
    cuts: list[float] | None = None,
) -> tuple[dict[str, Any], str, str]:
    reqs = requests_in(history, name, start, end, bounded)
    aside: list[RequestView] = []
    if cuts is not None:
        aside = [r for r in reqs if in_flight_at(history, r, cuts, exp.cut_slack_s)]
        reqs = [r for r in reqs if not in_flight_at(history, r, cuts, exp.cut_slack_s)]
    kinds = [outcome(history, r) for r in reqs]
    ok = kinds.count("ok")
    failed = kinds.count("failed")
    total = ok + failed
    ratio = ok / total if total else None
    nums = {
        "window": [rounded(start, 3), rounded(end, 3)],
        "ok": ok,
        "failed": failed,
        "pending": kinds.count("pending"),
        "ratio": rounded(ratio),
        "threshold": threshold,
    }
    if cuts is not None:
        nums["in_flight"] = _counts(history, aside)
    if threshold is None:
        return nums, "pass", ""
    if total < exp.min_requests or ratio is None:
        return nums, "unknown", f"{name}: {total} finished request(s), need {exp.min_requests}"
    if ratio < threshold:
        bad = [str(r.req) for r, k in zip(reqs, kinds, strict=True) if k == "failed"]
        return nums, "fail", f"{name}: {ratio:.3f} < {threshold} (failed: {', '.join(cap(bad, 10))})"
    return nums, "pass", ""


def check_availability(history: History, exp: AvailabilityExpect | None = None) -> Verdict:
    exp = exp or AvailabilityExpect()
    faults = select_faults(history, exp.faults, exp.kinds)
    results: dict[str, Any] = {}
    fails: list[str] = []
    unknowns: list[str] = []

    def judge(
        key: str,
        name: str,
        start: float,
        end: float,
        threshold: float | None,
        bounded: bool = False,
        cuts: list[float] | None = None,
    ) -> None:
        nums, status, reason = _window(history, name, start, end, threshold, exp, bounded, cuts)
        nums["status"] = status
        results.setdefault(key, {})[name] = nums
        if status == "fail":
            fails.append(f"{key} {reason}")
        elif status == "unknown":
            unknowns.append(f"{key} {reason}")

    if not faults:
        judge("run", "steady", 0.0, history.end_t + 1e-9, exp.before)
    boundary = 0.0
    for i, f in enumerate(faults):
        applied, healed = f.window(history.end_t)
        next_start = faults[i + 1].window(history.end_t)[0] if i + 1 < len(faults) else history.end_t + 1e-9
        judge(f.fault, "before", boundary, applied, exp.before)
        cuts = cut_instants(history, f) if exp.exclude_in_flight_at_fault else None
        judge(f.fault, "during", applied, healed, exp.during, cuts=cuts)
        if f.healed_t is None:
            if exp.after is not None:
                unknowns.append(f"{f.fault} after: never healed")
        else:
            judge(f.fault, "after", healed + exp.settle_s, next_start, exp.after, bounded=i + 1 < len(faults))
        boundary = healed + exp.settle_s
    numbers = {"windows": results}
    if fails:
        return Verdict.fail(NAME, "; ".join(fails), numbers, cap(fails))
    if unknowns:
        return Verdict.unknown_(NAME, "; ".join(unknowns), numbers, cap(unknowns))
    return Verdict.ok(NAME, "availability within thresholds", numbers)
