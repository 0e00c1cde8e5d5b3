"""Deadlines a timeline can never meet, found before the run: a step at `At(5.0)` with `deadline_s=1.0`, or
`RequestsCompleted(10**9)` due in a second, is missed every time (the run ends unknown), so it is a mistake in
the scenario, not an outcome.

Steps fire in order, so a step's earliest time is the latest of its predecessor's and its own condition's
clock bound (`At`, `After`). A `RequestsCompleted(n)` condition cannot hold before the workload has sent n
requests; how many it can have sent by a time is bounded by its mode (closed loop: each client at most one
request per think time; open loop: a Poisson count, bounded far in its tail).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.scenario.conditions import After, AllOf, At, Condition, RequestsCompleted
from harness.scenario.settings import Workload
from harness.scenario.timeline import Step

# How far into the Poisson tail an open-loop count is taken as impossible: mean + 10 standard deviations.
_POISSON_SIGMAS = 10.0
_POISSON_SLACK = 20


def _clock_bound(cond: Condition, earliest: dict[str, float]) -> float:
    if isinstance(cond, At):
        return cond.t
    if isinstance(cond, After):
        return earliest.get(cond.step, 0.0) + cond.delay_s
    if isinstance(cond, AllOf):
        return max((_clock_bound(c, earliest) for c in cond.conditions), default=0.0)
    return 0.0


def _requests_needed(cond: Condition) -> int:
    if isinstance(cond, RequestsCompleted):
        return cond.n
    if isinstance(cond, AllOf):
        return max((_requests_needed(c) for c in cond.conditions), default=0)
    return 0


def max_requests_by(w: Workload, t: float) -> float:
    """An upper bound on the requests the workload has sent by timeline time `t` (inf: none known)."""
    span = max(0.0, min(t, w.duration_s))
    if w.mode == "open":
        mean = w.rate_rps * span
        return math.floor(mean + _POISSON_SIGMAS * math.sqrt(mean) + _POISSON_SLACK)
    if w.think_time_s <= 0:
        return math.inf
    return w.concurrency * (math.floor(span / w.think_time_s) + 1)


def reach_problems(timeline: Sequence[Step], workload: Workload) -> list[str]:
    """Steps whose deadline comes before the earliest time they can fire, or whose request count the
    workload can never reach."""
    out: list[str] = []
    earliest: dict[str, float] = {}
    floor = 0.0
    for step in timeline:
        floor = max(floor, _clock_bound(step.when, earliest))
        earliest[step.name] = floor
        if step.deadline_s is not None and step.deadline_s < 0:
            out.append(f"step {step.name!r}: deadline_s {step.deadline_s} is negative")
            continue
        if step.deadline_s is not None and floor > step.deadline_s:
            out.append(f"step {step.name!r}: cannot fire before t={floor:g} s but its deadline is "
                       f"t={step.deadline_s:g} s")
            continue
        if workload.after_heal_s is None and floor > workload.duration_s:
            out.append(f"step {step.name!r}: cannot fire before t={floor:g} s, after the load ends at "
                       f"t={workload.duration_s:g} s: no request could show what it does")
            continue
        needed = _requests_needed(step.when)
        horizon = step.deadline_s if step.deadline_s is not None else workload.duration_s
        most = max_requests_by(workload, horizon)
        if needed > most:
            by = f"by its deadline t={horizon:g} s" if step.deadline_s is not None else "in the whole run"
            out.append(f"step {step.name!r}: RequestsCompleted({needed}) cannot hold: the workload sends "
                       f"at most {int(most)} requests {by}")
    return out
