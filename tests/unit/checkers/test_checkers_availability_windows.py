"""availability: `after` windows bounded by the next fault, None thresholds, requests in flight at a cut."""

from __future__ import annotations

import dataclasses

import pytest
from test_checkers_builders import HB

from harness.checkers import (
    CHECKERS,
    AvailabilityExpect,
    CheckerError,
    check_availability,
    make_params,
    run_check,
)


def two_restarts(victim_status: int = 500) -> HB:
    """Restarts at 1.0 and 3.0 (healed 0.3 s later); one request sent in f1's after window is still running
    when f2 lands and fails because of it."""
    hb = HB()
    for i in range(5):
        hb.request(0.1 * i, 0.05)
    hb.fault("f1", "restart", "prefill-0", applied=1.0, healed=1.3)
    for i in range(5):
        hb.request(1.6 + 0.1 * i, 0.05)
    hb.request(2.9, 0.4, status=victim_status)  # sent before f2, cut by it
    hb.fault("f2", "restart", "prefill-0", applied=3.0, healed=3.3)
    for i in range(5):
        hb.request(3.6 + 0.1 * i, 0.05)
    hb.end(5.0)
    return hb


def test_after_window_leaves_the_next_faults_victims_to_it() -> None:
    v = check_availability(two_restarts().history(), AvailabilityExpect(settle_s=0.2, after=1.0))
    assert v.status == "pass", v.reason
    f1, f2 = v.numbers["windows"]["f1"], v.numbers["windows"]["f2"]
    assert (f1["after"]["ok"], f1["after"]["failed"]) == (5, 0)
    assert f1["after"]["window"] == [1.5, 3.0]
    assert f2["during"]["failed"] == 1
    assert (f2["after"]["ok"], f2["after"]["failed"]) == (5, 0)


def test_after_window_still_fails_on_its_own_failures() -> None:
    hb = two_restarts()
    hb.request(2.0, 0.1, status=500)  # sent and over inside f1's after window
    v = check_availability(hb.history(), AvailabilityExpect(settle_s=0.2, after=1.0))
    assert v.status == "fail"
    assert "f1 after" in v.reason


def test_last_faults_after_window_keeps_requests_running_at_the_end() -> None:
    hb = HB()
    hb.request(0.1, 0.05)
    hb.fault("f", "restart", "prefill-0", applied=1.0, healed=1.2)
    hb.request(2.0, 0.05)
    hb.request(2.5, 9.0, complete=False, deadline=1.0)  # deadline 3.5, before the end: failed
    hb.end(4.0)
    v = check_availability(hb.history(), AvailabilityExpect(settle_s=0.2, after=1.0))
    assert v.status == "fail"
    assert v.numbers["windows"]["f"]["after"]["failed"] == 1


# ----------------------------------------------------------------------------------------- None thresholds


def test_none_accepted_where_documented_as_measure_only() -> None:
    exp = make_params("availability", {"before": None, "during": None, "after": None})
    assert (exp.before, exp.during, exp.after) == (None, None, None)
    hb = two_restarts()
    hb.request(0.6, 0.1, status=500)  # a failed "before" request: measured, not judged
    v = run_check(hb.history(), "availability", {"before": None, "settle_s": 0.2})
    assert v.status == "pass", v.reason
    assert v.numbers["windows"]["f1"]["before"]["failed"] == 1
    assert v.numbers["windows"]["f1"]["before"]["threshold"] is None


def test_none_rejected_where_the_type_does_not_allow_it() -> None:
    with pytest.raises(CheckerError, match="settle_s may not be None"):
        make_params("availability", {"settle_s": None})
    with pytest.raises(CheckerError, match="min_requests"):
        make_params("availability", {"min_requests": None})
    with pytest.raises(CheckerError, match="true/false"):
        make_params("availability", {"exclude_in_flight_at_fault": 1})


def test_every_checkers_optional_parameters_accept_none() -> None:
    for name, spec in CHECKERS.items():
        for f in dataclasses.fields(spec.params):
            if "None" in str(f.type):
                assert getattr(make_params(name, {f.name: None}), f.name) is None, (name, f.name)


# ----------------------------------------------------------------------------------------- in flight at a cut


def cut_run(after_cut_status: int = 200) -> HB:
    hb = HB()
    for i in range(5):
        hb.request(0.1 * i, 0.05)
    hb.request(0.9, 0.3, status=502)  # on the wire at the cut: may be lost by a correct router
    hb.request(0.95, 0.2)  # in flight at the cut, but it made it
    hb.fault("cut", "link_down", "prefill-1", applied=1.0, healed=2.0)
    for i in range(8):
        hb.request(1.1 + 0.1 * i, 0.05)
    hb.request(1.5, 0.05, status=after_cut_status)
    for i in range(5):
        hb.request(2.5 + 0.1 * i, 0.05)
    hb.end(3.5)
    return hb


def test_in_flight_at_the_cut_counted_apart() -> None:
    exp = AvailabilityExpect(during=1.0, settle_s=0.2, exclude_in_flight_at_fault=True)
    v = check_availability(cut_run().history(), exp)
    assert v.status == "pass", v.reason
    during = v.numbers["windows"]["cut"]["during"]
    assert (during["ok"], during["failed"], during["ratio"]) == (9, 0, 1.0)
    assert during["in_flight"] == {"ok": 1, "failed": 1, "pending": 0}


def test_in_flight_included_by_default() -> None:
    v = check_availability(cut_run().history(), AvailabilityExpect(during=1.0, settle_s=0.2))
    assert v.status == "fail"
    during = v.numbers["windows"]["cut"]["during"]
    assert (during["ok"], during["failed"]) == (10, 1)
    assert "in_flight" not in during


def test_a_request_sent_after_the_cut_still_fails_the_window() -> None:
    exp = AvailabilityExpect(during=1.0, settle_s=0.2, exclude_in_flight_at_fault=True)
    v = check_availability(cut_run(after_cut_status=503).history(), exp)
    assert v.status == "fail"
    assert "cut during" in v.reason
    assert v.numbers["windows"]["cut"]["during"]["in_flight"]["failed"] == 1


def test_every_down_transition_of_a_flapping_link_is_a_cut() -> None:
    hb = HB()
    for i in range(4):
        hb.request(0.1 * i, 0.05)
    hb.fault("flap", "link_flap", "prefill-1", applied=1.0, healed=3.0)
    hb.at(1.5).note("flap prefill-1/serve up", fault="flap", enabled=True)
    hb.at(2.0).note("flap prefill-1/serve down", fault="flap", enabled=False)
    hb.at(2.5).note("flap prefill-1/serve up", fault="flap", enabled=True)
    hb.at(1.7).note("unrelated", fault="other", enabled=False)
    hb.request(1.6, 0.3)  # over before the second cut
    hb.request(1.65, 0.2, status=502)  # over at 1.85: sent after the first cut, not in flight at the second
    hb.request(1.9, 0.3, status=502)  # on the wire at the second cut
    hb.request(2.6, 0.05)
    for i in range(4):
        hb.request(3.3 + 0.1 * i, 0.05)
    hb.end(4.0)
    exp = AvailabilityExpect(during=0.5, settle_s=0.2, exclude_in_flight_at_fault=True)
    v = check_availability(hb.history(), exp)
    during = v.numbers["windows"]["flap"]["during"]
    assert during["in_flight"] == {"ok": 0, "failed": 1, "pending": 0}
    assert (during["ok"], during["failed"]) == (2, 1)
    assert v.status == "pass", v.reason
    assert check_availability(hb.history(), dataclasses.replace(exp, during=1.0)).status == "fail"


def test_a_cut_recorded_a_few_ms_off_still_owns_its_victims() -> None:
    """The crash record is written after the kill (teardown takes ms) and a flap's note after the Toxiproxy
    call: a leg reset just after the recorded cut, or just before a `down` note, was on the wire at it."""
    hb = HB()
    for i in range(4):
        hb.request(0.1 * i, 0.05)
    hb.fault("crash", "crash", "prefill-1", applied=1.0, healed=2.0)
    hb.request(1.003, 0.008, status=502)  # connected while the engine was dying: reset
    hb.at(1.5).note("flap down", fault="crash", enabled=False)
    hb.request(1.48, 0.019, status=502)  # reset 1 ms before the note was written
    for i in range(5):
        hb.request(1.1 + 0.05 * i, 0.05)
    for i in range(4):
        hb.request(2.5 + 0.1 * i, 0.05)
    hb.end(3.5)
    exp = AvailabilityExpect(during=1.0, settle_s=0.2, exclude_in_flight_at_fault=True)
    v = check_availability(hb.history(), exp)
    assert v.status == "pass", v.reason
    assert v.numbers["windows"]["crash"]["during"]["in_flight"]["failed"] == 2
    exact = check_availability(hb.history(), dataclasses.replace(exp, cut_slack_s=0.0))
    assert exact.status == "fail"
    assert exact.numbers["windows"]["crash"]["during"]["failed"] == 2
    # Outside the slack: a request sent well after the cut is judged.
    assert check_availability(hb.history(), dataclasses.replace(exp, cut_slack_s=0.001)).status == "fail"
