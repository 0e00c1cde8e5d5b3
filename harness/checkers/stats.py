"""Latency statistics of a run's client requests (numpy percentiles), for checkers' numbers and reports."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from harness.history import History

PERCENTILES = (50, 90, 99)


def percentiles(values: Iterable[float | None], points: tuple[int, ...] = PERCENTILES) -> dict[str, Any]:
    """{"n", "p50", "p90", "p99", "max"} of the non-None values, to the microsecond (None: no values)."""
    arr = np.array([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return {"n": 0, **{f"p{p}": None for p in points}, "max": None}
    got = np.percentile(arr, points)
    return {"n": int(arr.size), **{f"p{p}": round(float(v), 6) for p, v in zip(points, got, strict=True)},
            "max": round(float(arr.max()), 6)}


def latency_summary(history: History) -> dict[str, Any]:
    """Client-side latency and time to first token over every completed request, and over the good ones."""
    done = [r for r in history.request_list() if r.completed]
    good = [r for r in done if r.succeeded]
    return {
        "requests": len(done),
        "ok": len(good),
        "latency_s": percentiles(r.latency_s for r in done),
        "ok_latency_s": percentiles(r.latency_s for r in good),
        "ttft_s": percentiles(r.ttft_s for r in good),
    }
