"""Requests that succeed are not held up: the latency of successful requests during each selected fault window
stays under a bound (a wedged worker must cost its own requests only, never those of healthy workers: bug
#12's "stalls the router for every request").

A physical bound: it does not scale with a settings preset (a healthy request takes the same milliseconds at
any probe interval)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.checkers._common import cap, rounded, select_faults
from harness.history import History
from harness.verdict import Verdict

NAME = "latency"


@dataclass(frozen=True)
class LatencyExpect:
    """`max_latency_s`: bound on the `quantile` (1.0: the slowest) of successful requests sent during each
    selected fault (from its application to its heal)."""

    max_latency_s: float = 1.0
    quantile: float = 1.0
    faults: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    min_requests: int = 5


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), on sorted values."""
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def check_latency(history: History, exp: LatencyExpect | None = None) -> Verdict:
    exp = exp or LatencyExpect()
    if not 0.0 < exp.quantile <= 1.0:
        return Verdict.unknown_(NAME, f"quantile must be in (0, 1], got {exp.quantile}")
    faults = select_faults(history, exp.faults, exp.kinds)
    if not faults:
        return Verdict.unknown_(NAME, "no selected fault was applied")
    numbers: dict[str, object] = {}
    problems: list[str] = []
    unknown: list[str] = []
    for f in faults:
        start, end = f.window(history.end_t)
        ok = [r for r in history.requests_started_in(start, end) if r.succeeded and r.latency_s is not None]
        if len(ok) < exp.min_requests:
            need = exp.min_requests
            unknown.append(f"{f.fault}: {len(ok)} successful request(s) in its window, need {need}")
            continue
        lat = sorted(float(r.latency_s or 0.0) for r in ok)
        q = _quantile(lat, exp.quantile)
        numbers[f.fault] = {"requests": len(ok), "quantile": exp.quantile, "latency_s": rounded(q),
                            "max_s": rounded(lat[-1])}
        if q > exp.max_latency_s:
            slow = sorted(ok, key=lambda r: -(r.latency_s or 0.0))
            problems += [f"{f.fault}: request {r.req} ({r.tag}) succeeded after {rounded(r.latency_s, 3)}s "
                         f"(bound {exp.max_latency_s}s)" for r in slow[:10]]
    if problems:
        return Verdict.fail(NAME, f"successful requests held up past {exp.max_latency_s}s during a fault",
                            numbers, cap(problems))
    if unknown:
        return Verdict.unknown_(NAME, "; ".join(unknown), numbers)
    return Verdict.ok(NAME, f"successful requests within {exp.max_latency_s}s during every fault", numbers)
