"""Deadlines a timeline can never meet and requests a workload can never send (harness.scenario.reach)."""

from __future__ import annotations

import math

from harness.scenario import After, At, Heal, RequestsCompleted, Restart, Step, Workload
from harness.scenario.reach import max_requests_by, reach_problems


def test_earliest_times_follow_the_step_order() -> None:
    steps = (Step("a", Restart("prefill-0"), At(2.0)), Step("b", Heal("prefill-0"), At(1.0), deadline_s=1.5))
    [problem] = reach_problems(steps, Workload())
    assert "step 'b': cannot fire before t=2 s" in problem
    fine = (Step("a", Restart("prefill-0"), At(2.0)),
            Step("b", Heal("prefill-0"), After("a", 1.0), deadline_s=3.0))
    assert reach_problems(fine, Workload()) == []


def test_request_counts_are_bounded_by_the_workload() -> None:
    closed = Workload(mode="closed", concurrency=2, think_time_s=0.5, duration_s=10.0)
    assert max_requests_by(closed, 1.0) == 2 * 3
    assert max_requests_by(Workload(think_time_s=0.0), 1.0) == math.inf
    open_loop = Workload(mode="open", rate_rps=100.0, duration_s=2.0)
    assert 100 < max_requests_by(open_loop, 1.0) < 300
    assert reach_problems((Step("x", Heal("decode-0"), RequestsCompleted(6), deadline_s=1.0),), closed) == []
    [problem] = reach_problems((Step("x", Heal("decode-0"), RequestsCompleted(7), deadline_s=1.0),), closed)
    assert "at most 6 requests" in problem
