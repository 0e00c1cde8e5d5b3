"""Every probe and id read has a deadline, judged from how long the engines held them
(harness.checkers.call_deadlines)."""

from __future__ import annotations

import pytest
from test_checkers_contract import TIMEOUT, Run, healthy_run

from harness.checkers import check_call_deadlines


def _read(run: Run, t: float, duration: float, status: int = 499) -> None:
    run.read(t, duration, status)


def test_probes_and_reads_let_go_at_the_probe_timeout_pass() -> None:
    run = healthy_run()
    _read(run, 2.0, TIMEOUT)  # a wedged read the router let go at its deadline
    v = check_call_deadlines(run.history())
    assert v.status == "pass" and v.numbers["bound_s"] == TIMEOUT and v.numbers["longest_s"] == TIMEOUT, v


@pytest.mark.parametrize(("status", "words"), [(499, "let go"), (200, "answered 200")])
def test_a_read_held_past_the_probe_timeout_is_a_wait_without_a_deadline(status: int, words: str) -> None:
    run = healthy_run()
    _read(run, 2.0, 3.2, status)
    v = check_call_deadlines(run.history())
    assert v.status == "fail" and v.numbers["late"] == 1, v
    assert "prefill-0 held the router's server_info from t=2.000 for 3.200s" in v.evidence[0]
    assert words in v.evidence[0]


def test_a_call_the_engine_could_not_time_is_not_judged() -> None:
    # Frozen (SIGSTOP): the engine records the call only once it resumes, however soon the router left.
    run = healthy_run()
    run.hb.at(1.9).fault_applied("freeze", "wedge", "prefill-0", {"mode": "sigstop"}, {})
    run.hb.at(4.0).fault_healed("freeze", "wedge", "prefill-0")
    _read(run, 2.0, 2.1)
    assert check_call_deadlines(run.history()).status == "pass"
    # A wedged surface is judged: the engine sees the caller leave.
    run = healthy_run()
    run.hb.at(1.9).fault_applied("stall", "wedge", "prefill-0", {"surface": "metadata"}, {})
    run.hb.at(4.0).fault_healed("stall", "wedge", "prefill-0")
    _read(run, 2.0, 2.1)
    assert check_call_deadlines(run.history()).status == "fail"


def test_with_no_call_to_time_there_is_nothing_to_judge() -> None:
    assert check_call_deadlines(Run().history()).status == "unknown"
