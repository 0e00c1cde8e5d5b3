"""The router keeps to its probe slots, judged from when the engines saw its probes and reads open
(harness.checkers.probe_slots)."""

from __future__ import annotations

from test_checkers_contract import Run

from harness.checkers import check_probe_slots
from harness.contract.settings import contract_of


def _read(run: Run, t: float, duration: float, status: int = 200) -> None:
    run.read(t, duration, status, call="bootstrap_query")


def _staggered(slots: int | None) -> Run:
    """Each engine probed in turn, one at a time, 0.1 s each: never two open."""
    run = Run(max_concurrent_health_checks=slots)
    t = 0.1
    while t < 5.5:
        run.probe(t, "prefill-0", duration=0.1)
        run.probe(t + 0.1, "decode-0", duration=0.1)
        t += 0.3
    return run


def test_one_at_a_time_keeps_one_slot() -> None:
    v = check_probe_slots(_staggered(1).history())
    assert v.status == "pass" and v.numbers["most_open"] == 1 and v.numbers["limit"] == 1, v


def test_two_probes_open_at_once_over_one_slot_fail_with_both_named() -> None:
    run = _staggered(1)
    run.probe(3.05, "decode-0", duration=0.1)  # starts while prefill-0's probe of t=3.1 ... is open
    run.probe(2.85, "decode-0", duration=0.2)
    v = check_probe_slots(run.history())
    assert v.status == "fail" and v.numbers["most_open"] == 2, v
    assert "2 probes or reads were open, over the router's 1 slot(s)" in v.evidence[0]
    assert "health@decode-0" in v.evidence[0] and "health@prefill-0" in v.evidence[0]


def test_an_id_read_takes_a_slot_too() -> None:
    run = _staggered(1)
    _read(run, 1.05, 0.1)
    v = check_probe_slots(run.history())
    assert v.status == "fail" and "bootstrap_query@prefill-0" in v.evidence[0], v


def test_a_call_let_go_is_seen_ending_a_little_late() -> None:
    # The router gave up on a read at t=1.3 and probed the next engine at once; the engine saw its caller
    # leave 20 ms later (its watch). Within the slack: one slot kept.
    for read_s, status, verdict in ((0.32, 499, "pass"), (0.36, 499, "fail"), (0.32, 200, "fail")):
        run = Run(max_concurrent_health_checks=1)
        _read(run, 1.0, read_s, status)
        run.probe(1.3, "decode-0", duration=0.1)
        assert check_probe_slots(run.history()).status == verdict, (read_s, status)


def test_with_no_limit_set_there_is_nothing_to_hold() -> None:
    run = _staggered(None)
    run.probe(1.0, "decode-0", duration=0.3)
    v = check_probe_slots(run.history())
    assert v.status == "pass" and "no probe-slot limit" in v.reason, v


def test_with_no_call_to_time_there_is_nothing_to_judge() -> None:
    v = check_probe_slots(Run(max_concurrent_health_checks=2).history())
    assert v.status == "unknown", v


def test_a_gateway_without_the_flag_is_not_held_to_it() -> None:
    from harness.routers.gateways.adapters import SmgRouter
    from harness.scenario import RouterSettings

    took = SmgRouter("smg", version="1.13.0", flags=frozenset()).contract(
        RouterSettings(max_concurrent_health_checks=1))
    assert took is not None and took["max_concurrent_health_checks"] is None
    run = _staggered(1)
    run.hb.at(0.0).note("router contract", router_contract=took)
    contract = contract_of(run.history())
    assert contract is not None and contract.max_probes_in_flight is None
