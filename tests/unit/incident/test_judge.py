"""Reproduced means: the release fails a symptom checker and the reference passes them all."""

from __future__ import annotations

import pytest

from harness.incident.judge import NOT_REPRODUCED, REPRODUCED, SIM_ONLY, UNKNOWN, judge_world, overall

pytestmark = pytest.mark.unit

S = ["transfer_timeout", "handoff"]


def test_reproduced_needs_the_reference_to_pass() -> None:
    j = judge_world(
        "real",
        S,
        {"transfer_timeout": "fail", "handoff": "pass"},
        {"transfer_timeout": "pass", "handoff": "pass"},
    )
    assert j.outcome == REPRODUCED and "transfer_timeout" in j.reason
    j = judge_world("real", S, {"transfer_timeout": "fail"}, {"transfer_timeout": "fail", "handoff": "pass"})
    assert j.outcome == UNKNOWN and "reference" in j.reason


def test_a_race_counts_as_shown() -> None:
    both = {"transfer_timeout": "pass", "handoff": "pass"}
    assert judge_world("real", S, {**both, "handoff": "race"}, both).outcome == REPRODUCED


def test_not_reproduced_and_missing_verdicts() -> None:
    both = {"transfer_timeout": "pass", "handoff": "pass"}
    assert judge_world("real", S, both, both).outcome == NOT_REPRODUCED
    j = judge_world("real", S, {"transfer_timeout": "pass"}, both)
    assert j.outcome == UNKNOWN and "handoff" in j.reason


def test_overall() -> None:
    both = {"transfer_timeout": "pass", "handoff": "pass"}
    fail = {**both, "handoff": "fail"}
    real_no = judge_world("real", S, both, both)
    sim_yes = judge_world("sim", S, fail, both)
    assert overall(judge_world("real", S, fail, both), real_no)[0] == REPRODUCED
    assert overall(real_no, sim_yes)[0] == SIM_ONLY
    assert overall(real_no, judge_world("sim", S, both, both))[0] == NOT_REPRODUCED
    assert overall(None, None)[0] == UNKNOWN
