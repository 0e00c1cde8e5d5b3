"""The router's counters against its own events (harness.checkers.router_metrics), and the Prometheus text
read into a snapshot (harness.router_metrics)."""

from __future__ import annotations

import pytest
from test_checkers_builders import HB, WALL0

from harness.checkers import check_router_metrics
from harness.router_metrics import CounterTally, counters_of_text, snapshot

DISPATCHES = "pdchaos_router_dispatches_total"


def _dispatch(hb: HB, t: float, request_id: str) -> None:
    hb.at(t).router_event({"type": "dispatch", "request_id": request_id, "prefill": "w1", "decode": "w2",
                           "connector": "mooncake", "outcome": "ok", "status": 200, "ts": WALL0 + t})


def _history(value: float, connector: str = "mooncake", late: bool = False) -> object:
    hb = HB()
    for i in range(3):
        _dispatch(hb, 1.0 + i, f"r{i}")
    if late:  # counted by the router between the read's start and its end
        _dispatch(hb, 5.05, "r9")
    hb.at(5.1).router_metrics(snapshot((WALL0 + 5.0, WALL0 + 5.1),
                                       [(DISPATCHES, {"connector": connector, "outcome": "ok"}, value)]))
    hb.end(6.0)
    return hb.history()


def test_counters_that_count_the_events_pass() -> None:
    v = check_router_metrics(_history(3))  # type: ignore[arg-type]
    assert v.status == "pass" and v.numbers["counters"] == 1, v


@pytest.mark.parametrize(("value", "late", "ok"), [(3, True, True), (4, True, True), (5, True, False)])
def test_an_event_during_the_read_may_be_counted_or_not(value: float, late: bool, ok: bool) -> None:
    assert (check_router_metrics(_history(value, late=late)).status == "pass") == ok  # type: ignore[arg-type]


def test_a_miscounted_label_is_a_violation_with_both_sides() -> None:
    v = check_router_metrics(_history(3, connector="None"))  # type: ignore[arg-type]
    assert v.status == "fail" and v.numbers["wrong"] == 2, v
    assert any("{connector=None,outcome=ok} is 3, but its dispatch events say 0" in e for e in v.evidence)
    assert any("{connector=mooncake,outcome=ok} is 0, but its dispatch events say 3" in e for e in v.evidence)


RETRIES = "pdchaos_router_leg_retries_total"


@pytest.mark.parametrize(("counted", "ok"), [
    ({"leg": "prefill", "outcome": "retried"}, True),
    ({"leg": "prefill", "outcome": "None"}, False),  # a retry counted under no outcome
])
def test_prefill_legs_run_again_are_counted_at_least_as_the_dispatches_name_them(
    counted: dict[str, str], ok: bool
) -> None:
    hb = HB()
    hb.at(1.0).router_event({"type": "dispatch", "request_id": "r1", "prefill": "w2", "decode": "w3",
                             "connector": "mooncake", "outcome": "ok", "status": 200, "ts": WALL0 + 1.0,
                             "retried_from": ["w1"]})
    # One more counted for a request its client left before it ended (no dispatch): at least, not exactly.
    hb.at(5.1).router_metrics(snapshot((WALL0 + 5.0, WALL0 + 5.1), [
        (DISPATCHES, {"connector": "mooncake", "outcome": "ok"}, 1), (RETRIES, counted, 2)]))
    hb.end(6.0)
    v = check_router_metrics(hb.history())  # type: ignore[arg-type]
    assert (v.status == "pass") == ok, v
    if not ok:
        assert "{leg=prefill,outcome=retried} is 0, but its dispatch events name 1" in v.evidence[0]


def test_a_router_without_counters_has_nothing_to_hold() -> None:
    hb = HB()
    hb.end(2.0)
    assert check_router_metrics(hb.history()).status == "pass"  # type: ignore[arg-type]


def test_prometheus_text_and_increments_give_one_snapshot_shape() -> None:
    text = ('# HELP pdchaos_router_dispatches_total PD dispatches.\n'
            '# TYPE pdchaos_router_dispatches_total counter\n'
            'pdchaos_router_dispatches_total{connector="nixl",outcome="ok"} 7\n'
            '# TYPE pdchaos_router_workers gauge\npdchaos_router_workers{role="decode"} 2\n')
    assert counters_of_text(text) == [(DISPATCHES, {"connector": "nixl", "outcome": "ok"}, 7.0)]
    tally = CounterTally()
    for _ in range(7):
        tally.inc(DISPATCHES, {"outcome": "ok", "connector": "nixl"})
    assert snapshot((1.0, 1.0), tally.counters()) == snapshot((1.0, 1.0), counters_of_text(text))
    with pytest.raises(ValueError):
        counters_of_text("pdchaos_router_dispatches_total{connector=nixl 7\n")


@pytest.mark.parametrize(("outcome", "ok"), [("no_other_ready_worker", True), ("deadline_passed", True),
                                             ("request_may_have_reached_engine", False)])
def test_a_leg_retry_outcome_is_one_the_contract_documents(outcome: str, ok: bool) -> None:
    hb = HB()
    hb.at(5.1).router_metrics(snapshot((WALL0 + 5.0, WALL0 + 5.1), [
        (RETRIES, {"leg": "prefill", "outcome": outcome}, 3)]))
    hb.end(6.0)
    v = check_router_metrics(hb.history())  # type: ignore[arg-type]
    assert (v.status == "pass") == ok, v
    if not ok:
        assert f"outcome {outcome!r} is none of" in v.evidence[0]
