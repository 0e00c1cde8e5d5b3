"""Probe schedule kept while a worker is wedged (bugs #2, #12).

Every other worker keeps being probed at least every `interval * slack`; the wedged worker is probed
again once its probe timed out (a gap of at most `(interval + probe_timeout) * slack`).

Judged from the router's own `probe` events when it exposes them (stamped when each probe ends, so a probe
that never returns shows as a gap that never closes), else from the engines' side: their records of the
router's probes, stamped as each arrived (any router).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fake_engines.core.calls import PROBE_CALLS
from harness.checkers._common import cap, find_setting, rounded, select_faults
from harness.contract.reach import router_pauses
from harness.contract.settings import told
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


def max_gap(times: list[float], start: float, end: float,
            paused: Sequence[tuple[float, float]] = ()) -> float:
    """Longest time without a probe inside [start, end], counting from the last probe at or before start;
    the time the router's process was stopped (`paused`) does not count: it could not probe then."""

    def length(a: float, b: float) -> float:
        return (b - a) - sum(max(0.0, min(b, pe) - max(a, ps)) for ps, pe in paused)

    i = bisect_right(times, start)
    prev = times[i - 1] if i else start
    gap = 0.0
    for t in times[i:]:
        if t > end:
            break
        gap = max(gap, length(prev, t))
        prev = t
    return max(gap, length(prev, end))


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


def probe_times(history: History) -> tuple[str, dict[str, list[float]]] | None:
    """(source, probe times per worker): the router's probe events (by worker id) when it exposes them,
    else the engines' records of its probes (keyed by engine name); None: neither."""
    seen = history.router_calls(*PROBE_CALLS)
    if seen and not history.router_events_of("probe"):
        by_engine: dict[str, list[float]] = {}
        for call in seen:
            by_engine.setdefault(call.engine, []).append(call.at)
        layout = history.settings.get("engines_layout") or {}
        for engine in layout:
            by_engine.setdefault(engine, [])
        return "engines", by_engine
    events = history.router_events_of("probe")
    if not events:
        return None
    by_worker: dict[str, list[float]] = {}
    for p in events:
        if p.worker is not None:
            by_worker.setdefault(p.worker, []).append(p.at)
    for w in history.status:
        by_worker.setdefault(w, [])
    return "router events", by_worker


def check_probe_schedule(history: History, exp: ProbeScheduleExpect | None = None) -> Verdict:
    exp = exp or ProbeScheduleExpect()
    found = probe_times(history)
    if found is None:
        return Verdict.unknown_(
            NAME, "no probe seen: the engines recorded none and the router exposes no probe events")
    source, by_worker = found
    # The settings as the router's adapter says it took them (a gateway counts whole seconds).
    settings = told(history)
    interval = exp.interval_s if exp.interval_s is not None else find_setting(settings, INTERVAL_NAMES)
    timeout = (exp.probe_timeout_s if exp.probe_timeout_s is not None
               else find_setting(settings, TIMEOUT_NAMES))
    if interval is None or timeout is None:
        return Verdict.unknown_(
            NAME, "probe interval or timeout unknown (not in expectations or run settings)"
        )
    faults = select_faults(history, exp.faults, exp.kinds)
    if not faults:
        return Verdict.unknown_(NAME, "no wedge fault in the history")
    for times in by_worker.values():
        times.sort()
    paused = router_pauses(history)
    steady_limit = interval * exp.slack
    wedged_limit = (interval + timeout) * exp.slack
    per: dict[str, Any] = {}
    evidence: list[str] = []
    judged = 0
    for f in faults:
        start, end = f.window(history.end_t)
        wedged = {f.target} if source == "engines" else set(history.workers_for(f.target))
        gaps: dict[str, Any] = {}
        if not wedged:
            evidence_unknown = f"{f.fault}: no router worker for target {f.target!r}"
            per[f.fault] = {"note": evidence_unknown}
            continue
        for worker, times in by_worker.items():
            limit = wedged_limit if worker in wedged else steady_limit
            workers = history.workers_for(worker) if source == "engines" else [worker]
            if end - start < limit or any(_not_probed_by_design(history, w, start, end) for w in workers):
                continue
            gap = max_gap(times, start, end, paused)
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
    numbers = {"interval_s": interval, "probe_timeout_s": timeout, "slack": exp.slack, "faults": per,
               "source": source}
    if evidence:
        return Verdict.fail(
            NAME, f"probe schedule broken: {len(evidence)} gap(s) too long", numbers, cap(evidence)
        )
    if judged == 0:
        return Verdict.unknown_(
            NAME, "wedge windows too short (or unmapped) to judge the probe schedule", numbers
        )
    return Verdict.ok(NAME, f"probe schedule kept ({judged} worker-window(s) judged)", numbers)
