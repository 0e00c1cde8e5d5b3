"""Probe schedule kept while a worker is wedged (bugs #2, #12): from the router's `probe` events.

Every other worker keeps being probed at least every `interval * slack`; the wedged worker is probed
again once its probe timed out (a gap of at most `(interval + probe_timeout) * slack`). Probe events are
stamped when the probe ends, so a probe that never returns shows as a gap that never closes.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from harness.checkers._common import cap, find_setting, rounded, select_faults
from harness.history import History
from harness.verdict import Verdict

NAME = "probe_schedule"
INTERVAL_NAMES = ("health_interval_s", "health_check_interval_s", "health_check_interval_secs")
TIMEOUT_NAMES = ("health_timeout_s", "health_check_timeout_s", "health_check_timeout_secs")


@dataclass(frozen=True)
class ProbeScheduleExpect:
    """`interval_s`/`probe_timeout_s`: the router's probe settings (None: read from run settings).
    `faults`/`kinds` pick the wedge faults (default kind `wedge`)."""

    interval_s: float | None = None
    probe_timeout_s: float | None = None
    slack: float = 2.0
    faults: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = ("wedge",)


def max_gap(times: list[float], start: float, end: float) -> float:
    """Longest time without a probe inside [start, end], counting from the last probe at or before start."""
    i = bisect_right(times, start)
    prev = times[i - 1] if i else start
    gap = 0.0
    for t in times[i:]:
        if t > end:
            break
        gap = max(gap, t - prev)
        prev = t
    return max(gap, end - prev)


def _not_probed_by_design(history: History, worker: str, start: float, end: float) -> bool:
    """Draining workers are never probed, removed ones are gone: no schedule to keep."""
    for p in history.status_timeline(worker):
        if (
            p.t <= end
            and p.status in ("draining", "absent")
            and (p.t >= start or p is history.status_at(worker, start))
        ):
            return True
    return False


def check_probe_schedule(history: History, exp: ProbeScheduleExpect | None = None) -> Verdict:
    exp = exp or ProbeScheduleExpect()
    probes = history.router_events_of("probe")
    if not probes:
        return Verdict.unknown_(NAME, "the router under test exposes no probe events")
    interval = (
        exp.interval_s if exp.interval_s is not None else find_setting(history.settings, INTERVAL_NAMES)
    )
    timeout = (
        exp.probe_timeout_s
        if exp.probe_timeout_s is not None
        else find_setting(history.settings, TIMEOUT_NAMES)
    )
    if interval is None or timeout is None:
        return Verdict.unknown_(
            NAME, "probe interval or timeout unknown (not in expectations or run settings)"
        )
    faults = select_faults(history, exp.faults, exp.kinds)
    if not faults:
        return Verdict.unknown_(NAME, "no wedge fault in the history")
    by_worker: dict[str, list[float]] = {}
    for p in probes:
        if p.worker is not None:
            by_worker.setdefault(p.worker, []).append(p.at)
    for w in history.status:
        by_worker.setdefault(w, [])
    for times in by_worker.values():
        times.sort()
    steady_limit = interval * exp.slack
    wedged_limit = (interval + timeout) * exp.slack
    per: dict[str, Any] = {}
    evidence: list[str] = []
    judged = 0
    for f in faults:
        start, end = f.window(history.end_t)
        wedged = set(history.workers_for(f.target))
        gaps: dict[str, Any] = {}
        if not wedged:
            evidence_unknown = f"{f.fault}: no router worker for target {f.target!r}"
            per[f.fault] = {"note": evidence_unknown}
            continue
        for worker, times in by_worker.items():
            limit = wedged_limit if worker in wedged else steady_limit
            if end - start < limit or _not_probed_by_design(history, worker, start, end):
                continue
            gap = max_gap(times, start, end)
            judged += 1
            gaps[worker] = {
                "max_gap_s": rounded(gap, 3),
                "limit_s": rounded(limit, 3),
                "wedged": worker in wedged,
            }
            if gap > limit:
                role = "wedged worker" if worker in wedged else "worker"
                evidence.append(f"{f.fault}: {role} {worker} not probed for {gap:.2f}s (limit {limit:.2f}s)")
        per[f.fault] = {"window": [rounded(start, 3), rounded(end, 3)], "workers": gaps}
    numbers = {"interval_s": interval, "probe_timeout_s": timeout, "slack": exp.slack, "faults": per}
    if evidence:
        return Verdict.fail(
            NAME, f"probe schedule broken: {len(evidence)} gap(s) too long", numbers, cap(evidence)
        )
    if judged == 0:
        return Verdict.unknown_(
            NAME, "wedge windows too short (or unmapped) to judge the probe schedule", numbers
        )
    return Verdict.ok(NAME, f"probe schedule kept ({judged} worker-window(s) judged)", numbers)
