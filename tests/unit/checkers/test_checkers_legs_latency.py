"""`legs_sequenced` (a decode leg only after a computed prefill), `legs_once` (a request reaches each role's
engines once) and `latency` (successful requests are not held up during a fault), on scripted histories."""

from __future__ import annotations

from test_checkers_builders import HB

from harness.checkers import (
    LatencyExpect,
    LegsOnceExpect,
    LegsSequencedExpect,
    check_latency,
    check_legs_once,
    check_legs_sequenced,
)


def _engines(hb: HB) -> None:
    hb.engine(0.0, "prefill-0", "A", "prefill")
    hb.engine(0.0, "decode-0", "D", "decode")


def test_legs_sequenced_passes_when_every_decode_followed_a_computed_prefill() -> None:
    hb = HB()
    _engines(hb)
    for i in range(3):
        hb.pd_request(1.0 + i, "A")
    hb.end(5.0)
    v = check_legs_sequenced(hb.history())
    assert v.status == "pass" and v.numbers["decode_requests"] == 3


def test_a_decode_leg_for_a_prefill_that_failed_is_the_routers_fault() -> None:
    hb = HB()
    _engines(hb)
    hb.pd_request(1.0, "A")
    tag = hb.request(2.0, 0.05, status=502)
    # The prefill answered 500 (no record); the router still sent the decode, which found no KV.
    hb.handoff(2.02, "decode-0", "decode", tag, "failed", "D", "A", None)
    hb.end(5.0)
    v = check_legs_sequenced(hb.history())
    assert v.status == "fail" and v.numbers["unsequenced"] == 1
    assert v.evidence[0].startswith("router side: decode-0 ran the decode leg of " + tag)
    assert check_legs_sequenced(hb.history(), LegsSequencedExpect(max_unsequenced=1)).status == "pass"


def test_a_pulled_kv_proves_the_prefill_ran_even_without_its_record() -> None:
    hb = HB()
    _engines(hb)
    tag = hb.request(1.0, 0.05)
    hb.handoff(1.02, "decode-0", "decode", tag, "pulled", "D", "A")
    hb.end(5.0)
    assert check_legs_sequenced(hb.history()).status == "pass"


def test_legs_sequenced_is_unknown_without_decode_records() -> None:
    hb = HB()
    _engines(hb)
    hb.request(1.0, 0.05)
    hb.end(5.0)
    assert check_legs_sequenced(hb.history()).status == "unknown"


def test_legs_once_passes_when_each_request_ran_once_per_role() -> None:
    hb = HB()
    _engines(hb)
    for i in range(3):
        hb.pd_request(1.0 + i, "A")
    hb.end(5.0)
    v = check_legs_once(hb.history())
    assert v.status == "pass" and v.numbers == {"requests": 3, "repeated": 0, "most_records_per_side": 1}


def test_a_request_run_again_after_its_decode_failed_is_the_routers_fault() -> None:
    hb = HB()
    _engines(hb)
    tag = hb.request(1.0, 0.5)
    # The first decode's pull failed; the router ran the whole request again: both sides saw it twice.
    for t, outcome in ((1.0, "failed"), (1.2, "pulled")):
        hb.handoff(t, "prefill-0", "prefill", tag, "computed", "A")
        hb.handoff(t + 0.05, "decode-0", "decode", tag, outcome, "D", "A")
    hb.end(5.0)
    v = check_legs_once(hb.history())
    assert v.status == "fail" and v.numbers["repeated"] == 2 and v.numbers["most_records_per_side"] == 2
    # Each leg as it reached its engine (its record's time less the leg's own 0.01 s).
    first = f"router side: {tag} reached the decodes 2 times (decode-0 failed at 1.04s"
    assert v.evidence[0].startswith(first)
    assert "the client got 200 after 0.5s" in v.evidence[0]
    assert check_legs_once(hb.history(), LegsOnceExpect(max_repeated=2)).status == "pass"


def test_legs_once_is_unknown_without_records() -> None:
    hb = HB()
    _engines(hb)
    hb.request(1.0, 0.05)
    hb.end(5.0)
    assert check_legs_once(hb.history()).status == "unknown"


def _wedge_run(slow_latency: float) -> HB:
    hb = HB()
    hb.fault("wedge@decode-0", "wedge", "decode-0", 1.0, 4.0)
    for i in range(10):
        hb.request(1.1 + 0.2 * i, 0.05)
    hb.request(2.0, slow_latency)  # one request that succeeded late
    hb.request(2.1, 1.0, status=504)  # failures are availability's business, not latency's
    hb.end(6.0)
    return hb


def test_latency_judges_successful_requests_during_the_fault() -> None:
    assert check_latency(_wedge_run(0.1).history(), LatencyExpect(max_latency_s=0.6)).status == "pass"
    v = check_latency(_wedge_run(1.8).history(), LatencyExpect(max_latency_s=0.6))
    assert v.status == "fail" and "succeeded after 1.8s" in v.evidence[0]
    # A quantile below 1 lets the odd slow one through: the 0.9 quantile of eleven requests is still fast.
    loose = LatencyExpect(max_latency_s=0.6, quantile=0.9)
    assert check_latency(_wedge_run(1.8).history(), loose).status == "pass"


def test_latency_without_a_fault_or_requests_is_unknown() -> None:
    hb = HB()
    hb.request(1.0, 0.05)
    hb.end(2.0)
    assert check_latency(hb.history()).status == "unknown"
    hb = HB()
    hb.fault("wedge@decode-0", "wedge", "decode-0", 1.0, 2.0)
    hb.end(3.0)
    assert check_latency(hb.history(), LatencyExpect(kinds=("wedge",))).status == "unknown"
    assert check_latency(hb.history(), LatencyExpect(quantile=0.0)).status == "unknown"
