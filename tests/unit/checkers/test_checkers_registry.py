"""Verdict composition, the checker registry and run_checks on whole histories."""

from __future__ import annotations

import pytest
from test_checkers_builders import HB, restart_run

from harness import checkers
from harness.checkers import (
    CHECKERS,
    CheckerError,
    CheckerSpec,
    OutputExpect,
    make_params,
    run_check,
    run_checks,
    validate_expect,
)
from harness.history import History
from harness.scenario import Expect
from harness.verdict import Verdict, combine, worst


def test_verdict_requires_reason_unless_pass_and_checks_status() -> None:
    with pytest.raises(ValueError):
        Verdict("x", "unknown")
    with pytest.raises(ValueError):
        Verdict("x", "fail", "  ")
    with pytest.raises(ValueError):
        Verdict("x", "maybe", "r")  # type: ignore[arg-type]
    v = Verdict.ok("x")
    assert v.passed and not v.failed and not v.unknown


def test_combine_order_fail_over_unknown_over_pass() -> None:
    p = Verdict.ok("a", numbers={"n": 1})
    u = Verdict.unknown_("b", "could not tell", evidence=["e1"])
    f = Verdict.fail("c", "broke", evidence=["r7"])
    assert combine([p, p]).status == "pass"
    both = combine([p, u])
    assert both.status == "unknown" and "b: could not tell" in both.reason
    allv = combine([u, f, p])
    assert allv.status == "fail" and allv.reason == "c: broke"
    assert allv.numbers["counts"] == {"pass": 1, "fail": 1, "unknown": 1, "race": 0}
    assert allv.evidence == [{"checker": "b", "item": "e1"}, {"checker": "c", "item": "r7"}]
    empty = combine([])
    assert empty.status == "unknown" and empty.reason
    assert worst([]) == "unknown" and worst(["pass", "fail"]) == "fail"
    # A race (split over repeated runs) is worse than a pass, but a cell that could not tell stays unknown.
    assert worst(["pass", "race"]) == "race" and worst(["race", "unknown"]) == "unknown"
    assert worst(["race", "fail"]) == "fail"


def test_verdict_dict_round_trip_and_bad_input() -> None:
    v = Verdict.fail("c", "broke", {"x": 1.5}, ["r"])
    assert Verdict.from_dict(v.to_dict()) == v
    odd = Verdict.from_dict({"name": "z", "status": "weird"})
    assert odd.status == "unknown" and odd.reason


def test_make_params_validates() -> None:
    exp = make_params("recovery", {"max_recovery_s": 3, "kinds": ["restart"]})
    assert exp.max_recovery_s == 3 and exp.kinds == ("restart",)
    with pytest.raises(CheckerError, match="unknown checker"):
        make_params("nope")
    with pytest.raises(CheckerError, match="unknown parameter"):
        make_params("output", {"min_chekced": 1})
    with pytest.raises(CheckerError, match="number"):
        make_params("recovery", {"max_recovery_s": "fast"})
    with pytest.raises(CheckerError, match="true/false"):
        make_params("handoff", {"allow_recompute": "yes"})
    assert validate_expect("output", {"min_checked": 2}) == []
    assert validate_expect("output", {"bad": 2})


def test_run_check_never_raises() -> None:
    h = restart_run().history()
    v = run_check(h, "recovery", {"max_recovery_s": "x"})
    assert v.status == "unknown" and "bad expectation" in v.reason
    assert run_check(h, "nope").status == "unknown"


def test_checker_exception_becomes_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(history: History, exp: OutputExpect) -> Verdict:
        raise KeyError("x")

    monkeypatch.setitem(CHECKERS, "boom", CheckerSpec("boom", OutputExpect, boom))
    v = run_check(restart_run().history(), "boom")
    assert v.status == "unknown" and "KeyError" in v.reason


def test_run_checks_defaults_and_expect_objects() -> None:
    h = restart_run().history()
    verdicts = run_checks(h)
    assert [v.name for v in verdicts] == ["run_complete", *checkers.DEFAULT_CHECKS]
    by_name = {v.name: v for v in verdicts}
    symptoms = [n for n in by_name if n not in checkers.CONTRACT_CHECKS]
    assert all(by_name[n].status == "pass" for n in symptoms), combine(verdicts).reason
    # This history tells neither the router's settings nor the engines' calls: the contract cannot be judged
    # (a router without events or counters of its own has none to be held to; error bodies need only the
    # client's records).
    own = ("router_events", "error_answers", "router_metrics")
    judged = [n for n in checkers.CONTRACT_CHECKS if n not in own]
    assert all(by_name[n].status == "unknown" for n in judged)
    assert all(by_name[n].status == "pass" for n in own)
    verdicts = run_checks(h, [Expect("recovery", {"max_recovery_s": 0.3}), ("output", {}), "nothing_lost"])
    assert [v.status for v in verdicts] == ["pass", "fail", "pass", "pass"]
    assert combine(verdicts).status == "fail"


def test_truncated_or_abnormal_run_cannot_pass() -> None:
    verdicts = run_checks(restart_run(ended=False).history(), ["output"])
    assert verdicts[0].status == "unknown" and "no run_ended" in verdicts[0].reason
    assert combine(verdicts).status == "unknown"
    hb = restart_run(ended=False)
    hb.end(8.0, reason="error: engine failed to start")
    v = run_checks(hb.history(), ["output"])[0]
    assert v.status == "unknown" and "abnormally" in v.reason
    v = run_checks(HB(started=False).history(), ["output"])[0]
    assert v.status == "unknown" and "run_started" in v.reason
