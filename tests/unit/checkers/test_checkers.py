"""Each checker's pass / fail / unknown on synthetic histories built with the real recorder."""

from __future__ import annotations

import pytest
from test_checkers_builders import HB, WALL0, restart_run

from harness.checkers import (
    AvailabilityExpect,
    HandoffExpect,
    NothingLostExpect,
    OutputExpect,
    ProbeScheduleExpect,
    Prompt503Expect,
    RecoveryExpect,
    TransferTimeoutExpect,
    check_availability,
    check_handoff,
    check_nothing_lost,
    check_output,
    check_probe_schedule,
    check_prompt_503,
    check_recovery,
    check_transfer_timeout,
    run_check,
)
from harness.checkers.probes import max_gap

# ----------------------------------------------------------------------------------------- recovery


def test_recovery_pass_reports_the_three_latencies() -> None:
    v = check_recovery(restart_run().history(), RecoveryExpect(max_recovery_s=2.0))
    assert v.status == "pass", v.reason
    f1 = v.numbers["faults"]["f1"]
    assert f1["heal_to_ready_s"] == pytest.approx(0.5)
    assert f1["ready_to_handoff_s"] == pytest.approx(0.11)
    assert f1["heal_to_handoff_s"] == pytest.approx(0.61)


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        ({"stale_after": True}, "no correct handoff"),
        ({"recompute_after": True}, "no correct handoff"),
        ({"never_ready": True}, "not seen Ready"),
    ],
)
def test_recovery_fails_when_the_worker_never_really_comes_back(variant: dict[str, bool], words: str) -> None:
    v = check_recovery(restart_run(**variant).history(), RecoveryExpect(max_recovery_s=2.0))
    assert v.status == "fail" and words in v.reason


def test_recovery_of_an_outage_the_router_never_saw_counts_from_the_heal() -> None:
    # Still Ready at the heal: back at once; the first correct handoff after the heal is what is timed.
    v = check_recovery(restart_run(unnoticed=True).history(), RecoveryExpect(max_recovery_s=2.0))
    assert v.status == "pass", v.reason
    assert v.numbers["faults"]["f1"]["heal_to_ready_s"] == 0.0


def test_recovery_too_slow_fails() -> None:
    v = check_recovery(restart_run().history(), RecoveryExpect(max_recovery_s=0.3))
    assert v.status == "fail" and "recovered in 0.61s" in v.reason


def test_recovery_bound_grows_by_the_probe_times_a_gateway_took() -> None:
    """Asked for 0.3 s probes (0.5 s timeout), a gateway took 1 s ones: a recovered worker may stay out
    (1 x 1 + 1) - (1 x 0.3 + 0.5) = 1.2 s longer, and the verdict says so."""
    asked = {"health_interval_s": 0.3, "health_timeout_s": 0.5, "failure_threshold": 1,
             "success_threshold": 1, "request_timeout_s": 5.0, "engines": {"transfer_timeout_s": 3.0}}
    v = check_recovery(restart_run(settings=asked).history(), RecoveryExpect(max_recovery_s=0.3))
    assert v.status == "fail" and "probe_slack_s" not in v.numbers
    hb = restart_run(settings=asked)
    hb.at(0.0).note("router contract", router_contract={"health_interval_s": 1.0, "health_timeout_s": 1.0})
    v = check_recovery(hb.history(), RecoveryExpect(max_recovery_s=0.3))
    assert v.status == "pass", v.reason
    assert v.numbers["probe_slack_s"] == pytest.approx(1.2)
    assert v.numbers["max_recovery_s"] == pytest.approx(1.5)
    assert "bound 0.3s + 1.2s for the probe times the router took" in v.reason
    # What the slack does not explain still fails, and says the bound it was held to.
    hb = restart_run(settings=asked, never_ready=True)
    hb.at(0.0).note("router contract", router_contract={"health_interval_s": 1.0, "health_timeout_s": 1.0})
    v = check_recovery(hb.history(), RecoveryExpect(max_recovery_s=0.3))
    assert v.status == "fail" and "within 1.5s of heal" in v.reason and "+ 1.2s" in v.reason


def test_recovery_unknown_when_run_ends_too_early() -> None:
    v = check_recovery(restart_run(end_t=3.05).history(), RecoveryExpect(max_recovery_s=2.0))
    assert v.status == "unknown" and "run ended before" in v.reason
    # Ended before the worker was Ready again: the reason says how long the run gave it.
    v = check_recovery(restart_run(end_t=2.8, never_ready=True).history(), RecoveryExpect(max_recovery_s=2.0))
    assert v.status == "unknown" and "it had 0.36 s after the heal" in v.reason
    assert "bound is 2.0s" in v.reason


def test_recovery_unknown_without_heal_or_faults_or_router_view() -> None:
    hb = HB()
    hb.fault("f1", "crash", "prefill-0", applied=1.0)
    hb.end(5.0)
    v = check_recovery(hb.history())
    assert v.status == "unknown" and "never healed" in v.reason

    assert check_recovery(HB().history()).status == "unknown"

    def no_view(other_worker: bool) -> HB:
        hb = HB()
        if other_worker:
            hb.status(0.5, "w-other", "ready", "http://elsewhere")
        hb.fault("f1", "restart", "prefill-0", applied=1.0, healed=1.5)
        tag = hb.request(2.0, 0.05)
        hb.handoff(2.01, "prefill-0", "prefill", tag, "computed", "B")
        hb.end(20.0)
        return hb

    # No router view at all: the first correct handoff alone decides.
    v = check_recovery(no_view(False).history())
    assert v.status == "pass" and v.numbers["faults"]["f1"]["heal_to_handoff_s"] == pytest.approx(0.51)
    assert v.numbers["faults"]["f1"]["ready_observed"] is False
    # A router view that does not show the target: cannot tell.
    hb = no_view(True)
    v = check_recovery(hb.history())
    assert v.status == "unknown" and "no router worker" in v.reason
    assert check_recovery(hb.history(), RecoveryExpect(require_ready=False)).status == "pass"


def test_recovery_unknown_without_traffic_after_ready() -> None:
    hb = restart_run(end_t=3.05)
    # No request after the worker was Ready again, though the run went on long enough: unknown, not a guess.
    hb.end(20.0)
    v = check_recovery(hb.history(), RecoveryExpect(max_recovery_s=2.0))
    assert v.status == "unknown" and "no requests" in v.reason


def test_recovery_kind_filter() -> None:
    v = check_recovery(restart_run().history(), RecoveryExpect(kinds=("wedge",)))
    assert v.status == "unknown" and "no faults" in v.reason


# ----------------------------------------------------------------------------------------- handoff


def test_handoff_pass_on_clean_restart() -> None:
    v = check_handoff(restart_run().history())
    assert v.status == "pass", v.reason
    assert v.numbers["outcomes"] == {"pulled": v.numbers["decodes"]}


def test_handoff_stale_engine_id_fails_outside_grace_only() -> None:
    h = restart_run(stale_after=True).history()
    v = check_handoff(h, HandoffExpect(grace_s=1.0))
    assert v.status == "fail"
    assert v.numbers["problems"]["stale_engine_id"] > 0 and v.numbers["problems"]["timed_out"] > 0
    assert v.numbers["excused_in_grace"]["stale_engine_id"] > 0  # those before heal + 1 s
    assert all(e["at"] > 3.5 for e in v.evidence if isinstance(e, dict))
    assert check_handoff(h, HandoffExpect(grace_s=100.0)).status == "pass"


def test_a_pull_broken_just_before_its_crash_was_stamped_is_excused() -> None:
    """A crash's `fault_applied` is stamped after the kill returned: the pull it reset ended a few ms
    before."""
    def run(gap_s: float) -> str:
        hb = HB()
        hb.engine(0.0, "prefill-0", "A", "prefill")
        hb.engine(0.0, "decode-0", "D", "decode")
        tag = hb.request(2.0, 0.05, status=500)
        hb.handoff(2.0, "prefill-0", "prefill", tag, "computed", "A")
        hb.handoff(2.02, "decode-0", "decode", tag, "failed", "D", "A", None)
        hb.fault("crash", "crash", "prefill-0", applied=2.02 + gap_s, healed=2.5)
        hb.end(10.0)
        return check_handoff(hb.history(), HandoffExpect(grace_s=0.5)).status

    assert run(0.008) == "pass"
    assert run(1.0) == "fail"  # a second before the fault: not the fault's doing


def test_handoff_silent_recompute() -> None:
    h = restart_run(recompute_after=True).history()
    v = check_handoff(h, HandoffExpect(grace_s=1.0))
    assert v.status == "fail" and "recomputed" in v.numbers["problems"]
    assert check_handoff(h, HandoffExpect(grace_s=1.0, allow_recompute=True)).status == "pass"


def test_handoff_digest_mismatch_is_never_excused() -> None:
    hb = HB()
    hb.fault("f1", "restart", "prefill-0", applied=0.0, healed=0.5)
    hb.pd_request(1.0, "A", kv_digest="other")
    v = check_handoff(hb.history(), HandoffExpect(grace_s=100.0))
    assert v.status == "fail" and v.numbers["problems"] == {"digest_mismatch": 1}


def test_handoff_stale_id_from_engine_state_when_prefill_record_missing() -> None:
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill")
    hb.engine(0.0, "decode-0", "D", "decode")
    hb.engine(1.0, "prefill-0", "B", "prefill")
    tag = hb.request(0.5, 0.05)
    hb.handoff(0.52, "decode-0", "decode", tag, "pulled", "D", "A_dp0")  # right id then, dp suffix
    tag2 = hb.request(2.0, 0.05)
    hb.handoff(2.02, "decode-0", "decode", tag2, "pulled", "D", "A")  # A is gone since t=1
    v = check_handoff(hb.history(), HandoffExpect(grace_s=0.0))
    assert v.status == "fail" and v.numbers["problems"] == {"stale_engine_id": 1}
    assert v.evidence[0]["tag"] == tag2


def test_handoff_failed_pulls_and_unknown() -> None:
    hb = HB()
    hb.pd_request(1.0, "A", outcome="failed", status=500, text_ok=None)
    v = check_handoff(hb.history())
    assert v.status == "fail" and v.numbers["problems"] == {"failed": 1}
    assert check_handoff(hb.history(), HandoffExpect(allow_failed=True)).status == "pass"
    hb = HB()
    hb.request(1.0, 0.1)
    assert check_handoff(hb.history()).status == "unknown"


# ----------------------------------------------------------------------------------------- transfer timeout


def test_transfer_timeout_pass_and_timed_out_handoff_fails() -> None:
    assert check_transfer_timeout(restart_run().history()).status == "pass"
    v = check_transfer_timeout(restart_run(stale_after=True).history())
    assert v.status == "fail" and v.numbers["timed_out_handoffs"] > 0
    assert v.numbers["transfer_timeout_s"] == 3.0  # found in nested run settings


def test_transfer_timeout_by_latency_and_open_requests() -> None:
    hb = HB(settings={"transfer_timeout_s": 1.0})
    hb.request(0.0, 0.2)
    hb.request(0.5, 1.2)
    v = check_transfer_timeout(hb.history())
    assert v.status == "fail" and v.numbers["slow_requests"] == 1
    assert (
        check_transfer_timeout(hb.history(), TransferTimeoutExpect(transfer_timeout_s=5.0)).status == "pass"
    )

    hb = HB(settings={"transfer_timeout_s": 1.0})
    hb.request(0.0, 0.2)
    hb.request(0.5, 0.0, complete=False)
    hb.end(2.0)
    v = check_transfer_timeout(hb.history())
    assert v.status == "fail" and "still open" in v.evidence[0]


def test_transfer_timeout_counts_a_request_once_whichever_ways_it_shows() -> None:
    """A decode that waited the timeout out leaves a timed_out handoff and a slow request: one request."""
    hb = HB(settings={"transfer_timeout_s": 1.0})
    hb.pd_request(0.0, "A", outcome="timed_out", status=500, latency=1.1, text_ok=None)
    hb.pd_request(0.5, "A", outcome="timed_out", status=500, latency=1.2, text_ok=None)
    hb.request(1.0, 1.5)  # slow, no handoff
    v = check_transfer_timeout(hb.history())
    assert v.status == "fail" and v.reason.startswith("3 request(s) waited out the transfer timeout")
    assert v.numbers["timed_out_handoffs"] == 2 and v.numbers["slow_requests"] == 3
    # Handoffs without a tag cannot be matched to a request: each counts as its own.
    for t in (3.0, 3.5):
        hb.handoff(t, "decode-0", "decode", None, "timed_out", "D", "A")  # type: ignore[arg-type]
    v = check_transfer_timeout(hb.history())
    assert v.reason.startswith("5 request(s) waited out the transfer timeout"), v.reason


def test_transfer_timeout_unknown() -> None:
    assert check_transfer_timeout(HB().history()).status == "unknown"
    hb = HB()
    hb.request(0.0, 0.2)
    v = check_transfer_timeout(hb.history())
    assert v.status == "unknown" and "cannot tell" in v.reason


# ----------------------------------------------------------------------------------------- prompt 503


def outage_run(answer: tuple[int, float] = (503, 0.02), early: tuple[int, float] | None = None) -> HB:
    """The sole prefill crashes at 1.0, the router drops it at 1.3, it is back at 3.0."""
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill", "http://p0")
    hb.status(0.0, "w-p0", "ready", "http://p0")
    hb.request(0.5, 0.05)
    hb.fault("f1", "crash", "prefill-0", applied=1.0, healed=3.0)
    if early is not None:
        hb.request(1.1, early[1], status=early[0])
    hb.status(1.3, "w-p0", "not_ready", "http://p0")
    for i in range(6):
        hb.request(1.4 + 0.25 * i, answer[1], status=answer[0])
    hb.status(3.2, "w-p0", "ready", "http://p0")
    hb.request(3.5, 0.05)
    hb.end(4.0)
    return hb


def test_prompt_503_pass() -> None:
    v = check_prompt_503(outage_run().history(), Prompt503Expect(max_503_latency_s=0.5))
    assert v.status == "pass", v.reason
    f1 = v.numbers["faults"]["f1"]
    assert f1["503"] == 6 and f1["window"] == [1.3, 3.0]


@pytest.mark.parametrize(("answer", "words"), [((503, 2.0), "503 after"), ((500, 0.02), "status 500")])
def test_prompt_503_fails_on_slow_or_wrong_answers(answer: tuple[int, float], words: str) -> None:
    v = check_prompt_503(outage_run(answer=answer).history(), Prompt503Expect(max_503_latency_s=0.5))
    assert v.status == "fail" and words in v.evidence[0]


def test_prompt_503_hang_fails() -> None:
    hb = outage_run()
    hb.at(2.0).request_invoked(99, "[pdchaos:hang]", deadline_s=1.0)
    hb.at(3.0).request_completed(
        99, "[pdchaos:hang]", status=0, ok=False, latency_s=1.0, error="deadline", timed_out=True
    )
    v = check_prompt_503(hb.history())
    assert v.status == "fail" and "hang" in v.evidence[0]


def test_prompt_503_window_starts_when_router_notices() -> None:
    hb = outage_run(early=(502, 0.02))
    assert check_prompt_503(hb.history()).status == "pass"
    v = check_prompt_503(hb.history(), Prompt503Expect(from_router_notice=False))
    assert v.status == "fail" and "status 502" in v.evidence[0]


def test_prompt_503_unknown() -> None:
    assert check_prompt_503(HB().history()).status == "unknown"
    v = check_prompt_503(outage_run(answer=(200, 0.05)).history())
    assert v.status == "unknown" and "no 503" in v.reason
    hb = HB()
    hb.fault("f1", "crash", "prefill-0", applied=1.0, healed=2.0)
    hb.request(2.5, 0.05)
    assert check_prompt_503(hb.history()).status == "unknown"


# ----------------------------------------------------------------------------------------- probe schedule

SETTINGS = {"router": {"health_interval_s": 0.2, "health_timeout_s": 0.5}}


def probe_run(wedged_probes: list[float], other_gap: float = 0.2) -> HB:
    hb = HB(settings=SETTINGS)
    hb.engine(0.0, "decode-0", "D", "decode", "http://w-d0")
    hb.status(0.0, "w-d0", "ready", "http://w-d0", role="decode")
    hb.status(0.0, "w-p0", "ready", "http://w-p0")
    t = 0.0
    while t < 5.0:
        hb.probe(t, "w-p0")
        t += other_gap
    for t in (0.0, 0.2, 0.4, 0.6, 0.8, *wedged_probes):
        hb.probe(t, "w-d0", ok=t < 1.0)
    hb.fault("f1", "wedge", "decode-0", applied=1.0, healed=4.0)
    hb.end(5.0)
    return hb


def test_probe_schedule_pass() -> None:
    v = check_probe_schedule(probe_run([1.5, 2.2, 2.9, 3.6]).history())
    assert v.status == "pass", v.reason
    workers = v.numbers["faults"]["f1"]["workers"]
    assert workers["w-d0"]["wedged"] and workers["w-d0"]["max_gap_s"] == pytest.approx(0.7)


def test_probe_schedule_holds_a_gateway_to_the_interval_it_took() -> None:
    """A gateway counting whole seconds probes every 1 s when told 0.2 s: its adapter's `router contract`
    note says so, and the schedule is judged against that."""
    hb = probe_run([1.5, 2.2, 2.9, 3.6], other_gap=1.0)
    assert check_probe_schedule(hb.history()).status == "fail"
    hb = probe_run([1.5, 2.2, 2.9, 3.6], other_gap=1.0)
    hb.at(0.0).note("router contract", router_contract={"health_interval_s": 1.0, "health_timeout_s": 1.0})
    v = check_probe_schedule(hb.history())
    assert v.status == "pass", v.evidence
    assert v.numbers["interval_s"] == 1.0


def test_probe_schedule_wedged_worker_never_probed_again_fails() -> None:
    v = check_probe_schedule(probe_run([]).history())
    assert v.status == "fail" and "wedged worker w-d0" in v.evidence[0]


def test_probe_schedule_starved_peer_fails() -> None:
    v = check_probe_schedule(probe_run([1.5, 2.2, 2.9, 3.6], other_gap=1.0).history())
    assert v.status == "fail" and any("worker w-p0" in e for e in v.evidence)


def test_probe_schedule_skips_draining_workers() -> None:
    hb = probe_run([1.5, 2.2, 2.9, 3.6])
    hb.status(0.5, "w-x", "draining", "http://w-x")  # never probed: by design
    assert check_probe_schedule(hb.history()).status == "pass"
    hb = probe_run([1.5, 2.2, 2.9, 3.6])
    hb.status(0.5, "w-x", "ready", "http://w-x")  # never probed although Ready: starved
    v = check_probe_schedule(hb.history())
    assert v.status == "fail" and any("w-x" in e for e in v.evidence)


def test_probe_schedule_unknown_cases() -> None:
    hb = HB(settings=SETTINGS)
    hb.fault("f1", "wedge", "decode-0", applied=1.0, healed=4.0)
    assert "no probe events" in check_probe_schedule(hb.history()).reason
    h = probe_run([1.5]).history()
    assert check_probe_schedule(h, ProbeScheduleExpect(kinds=("crash",))).status == "unknown"
    hb = HB()
    hb.probe(1.0, "w")
    v = check_probe_schedule(hb.history())
    assert v.status == "unknown" and "interval" in v.reason
    v = check_probe_schedule(h, ProbeScheduleExpect(slack=20.0))  # window 3 s < every limit
    assert v.status == "unknown" and "too short" in v.reason


def test_max_gap() -> None:
    assert max_gap([0.0, 1.0, 2.0, 3.0], 0.5, 2.5) == 1.0
    assert max_gap([0.0, 1.0], 0.5, 4.0) == 3.0
    assert max_gap([], 1.0, 2.0) == 1.0
    assert max_gap([1.5], 1.0, 2.0) == 0.5
    # The time the router was stopped is no gap it could have filled.
    assert max_gap([0.0, 4.0, 4.5], 0.5, 5.0, paused=[(1.0, 3.5)]) == 1.5


# ----------------------------------------------------------------------------------------- availability


def test_availability_pass_and_windows() -> None:
    v = check_availability(restart_run().history())
    assert v.status == "pass", v.reason
    f1 = v.numbers["windows"]["f1"]
    assert f1["before"]["ratio"] == 1.0 and f1["during"]["ratio"] == 0.0 and f1["after"]["ratio"] == 1.0
    assert f1["after"]["window"][0] == 4.5


def test_availability_fail_after_and_during_threshold() -> None:
    v = check_availability(restart_run(stale_after=True).history())
    assert v.status == "fail" and "after" in v.reason
    v = check_availability(restart_run().history(), AvailabilityExpect(during=0.5))
    assert v.status == "fail" and "during" in v.reason


def test_availability_unknown_when_after_window_is_empty() -> None:
    v = check_availability(restart_run(end_t=4.0).history())
    assert v.status == "unknown" and "after" in v.reason


def test_availability_without_faults_and_pending_requests() -> None:
    hb = HB()
    hb.request(0.0, 0.1)
    hb.request(0.5, 0.0, complete=False, deadline=5.0)  # history ends before its deadline: not judged
    hb.at(1.0).note("cut")
    v = check_availability(hb.history())
    assert v.status == "pass" and v.numbers["windows"]["run"]["steady"]["pending"] == 1
    hb = HB()
    hb.request(0.0, 0.1)
    hb.request(0.5, 0.0, complete=False, deadline=1.0)
    hb.end(3.0)
    v = check_availability(hb.history())
    assert v.status == "fail" and "2" in v.reason


# ----------------------------------------------------------------------------------------- nothing lost


def test_nothing_lost_pass() -> None:
    v = check_nothing_lost(restart_run().history())
    assert v.status == "pass" and v.numbers["lost"] == 0


def test_nothing_lost_fails_with_request_ids() -> None:
    hb = HB()
    hb.request(0.0, 0.1)
    hb.request(0.1, 5.0, status=0, timed_out=True, deadline=5.0)
    hb.request(0.2, 0.0, complete=False, deadline=1.0)
    hb.request(0.3, 0.1, status=0)
    hb.request(0.4, 3.0, deadline=1.0)
    hb.end(6.0)
    v = check_nothing_lost(hb.history())
    assert v.status == "fail" and v.numbers["lost"] == 4
    assert [e.split(":")[0] for e in v.evidence] == ["2", "3", "4", "5"]
    v = check_nothing_lost(hb.history(), NothingLostExpect(no_response_is_lost=False))
    assert v.numbers["lost"] == 3


def test_nothing_lost_unknown_when_history_stops_early() -> None:
    hb = HB()
    hb.request(0.0, 0.1)
    hb.request(0.2, 0.0, complete=False, deadline=5.0)
    v = check_nothing_lost(hb.history())
    assert v.status == "unknown" and v.evidence == ["2"]
    assert check_nothing_lost(HB().history()).status == "unknown"


# ----------------------------------------------------------------------------------------- output


def test_output_checker() -> None:
    assert check_output(restart_run().history()).status == "pass"
    hb = HB()
    hb.request(0.0, 0.1, text_ok=True)
    hb.request(0.1, 0.1, text_ok=False)
    v = check_output(hb.history())
    assert v.status == "fail" and v.evidence == ["2 ([pdchaos:run:2])"]
    hb = HB()
    hb.request(0.0, 0.1, text_ok=None)
    assert check_output(hb.history()).status == "unknown"
    assert check_output(hb.history(), OutputExpect(min_checked=0)).status == "pass"


# ----------------------------------------------------------------------------------------- handoff_strict


def test_handoff_strict_only_listed_kinds_excuse() -> None:
    hb = HB()
    hb.fault("patch", "patch_worker", "prefill-0", applied=1.0, healed=1.0)
    hb.fault("slow", "fault:latency", "prefill-0", applied=3.0, healed=3.5)
    hb.pd_request(1.2, "A", told_id="", outcome="recomputed", kv_digest=None)  # right after the patch
    hb.pd_request(3.6, "A", told_id="", outcome="recomputed", kv_digest=None)  # right after the latency
    h = hb.history()
    assert check_handoff(h).status == "pass"  # plain: every fault excuses
    v = run_check(h, "handoff_strict", {"grace_s": 1.0, "excuse_kinds": ["latency"]})
    assert v.status == "fail" and v.numbers["problems"] == {"recomputed": 1}
    assert v.numbers["excused_in_grace"] == {"recomputed": 1} and v.evidence[0]["at"] == pytest.approx(1.22)
    v = run_check(h, "handoff_strict", {"grace_s": 1.0})
    assert v.numbers["problems"] == {"recomputed": 2}


# ----------------------------------------------------------------------------------------- metadata reads


def reads_run(n_reads: int) -> HB:
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill", "http://w-p0")
    hb.status(0.0, "w-p0", "ready", "http://w-p0")
    hb.fault("slow_health", "fault:latency", "prefill-0", applied=1.0)
    hb.at(1.0).router_event({"type": "metadata_read", "worker": "w-p0", "outcome": "id", "ts": WALL0 + 1.0})
    hb.heal("slow_health", "fault:latency", "prefill-0", 2.0)
    hb.at(2.0).note("heal prefill-0 latency", fault="heal_health")
    for i in range(n_reads):
        t = 2.1 + 0.3 * i
        hb.at(t).router_event(
            {"type": "metadata_read", "worker": "w-p0", "outcome": "no_id", "ts": WALL0 + t}
        )
    hb.end(6.0)
    return hb


def test_metadata_reads_bounded_after_a_heal_step() -> None:
    params = {"target": "prefill-0", "from_fault": "heal_health", "max_reads": 3}
    v = run_check(reads_run(2).history(), "metadata_reads", params)
    assert v.status == "pass" and v.numbers["reads"] == 2 and v.numbers["window"][0] == 2.0
    v = run_check(reads_run(12).history(), "metadata_reads", params)
    assert v.status == "fail" and v.numbers["outcomes"] == {"no_id": 12}
    v = run_check(reads_run(0).history(), "metadata_reads", {**params, "min_reads": 1})
    assert v.status == "fail" and "at least 1" in v.reason
    v = run_check(reads_run(12).history(), "metadata_reads", {**params, "until_fault": "slow_health"})
    assert v.status == "pass" and v.numbers["reads"] == 0  # window ends before it starts: nothing counted


def test_metadata_reads_unknown() -> None:
    h = reads_run(2).history()
    assert run_check(h, "metadata_reads", {}).status == "unknown"
    v = run_check(h, "metadata_reads", {"target": "prefill-0", "from_fault": "never"})
    assert v.status == "unknown" and "never happened" in v.reason
    assert run_check(h, "metadata_reads", {"target": "decode-9"}).status == "unknown"
    assert run_check(restart_run().history(), "metadata_reads", {"target": "prefill-0"}).status == "unknown"


# ----------------------------------------------------------------------------------------- in-flight victims


def in_flight_run(told: str) -> HB:
    """A request is prefilled by A at 1.0; A restarts at 1.05 (as B); the decode waits out the timeout."""
    hb = HB(settings={"transfer_timeout_s": 2.0})
    hb.engine(0.0, "prefill-0", "A", "prefill")
    tag = hb.request(0.99, 2.1, status=500, text_ok=None)
    hb.handoff(1.0, "prefill-0", "prefill", tag, "computed", "A")
    hb.fault("r", "restart", "prefill-0", applied=1.05, healed=1.2)
    hb.engine(1.2, "prefill-0", "B", "prefill")
    hb.handoff(3.05, "decode-0", "decode", tag, "timed_out", "D", told, kv_digest=None)
    hb.end(4.0)
    return hb


def test_source_lost_mid_handoff_is_excused_but_a_stale_id_is_not() -> None:
    h = in_flight_run(told="A").history()
    v = run_check(h, "handoff_strict", {"grace_s": 0.0})
    assert v.status == "pass" and v.name == "handoff_strict"
    assert v.numbers["excused_in_flight"] == {"timed_out": 1}
    v = check_transfer_timeout(h)
    assert v.status == "pass" and v.numbers["excused_in_flight"] == 1
    assert check_transfer_timeout(h, TransferTimeoutExpect(excuse_in_flight=False)).status == "fail"

    # Told an id that was not the computing prefill's: the router's fault, whatever happened meanwhile.
    h = in_flight_run(told="Z").history()
    assert run_check(h, "handoff_strict", {"grace_s": 0.0}).status == "fail"
    assert check_transfer_timeout(h).status == "fail"


def test_a_decode_crashed_under_its_own_request_excuses_that_failed_record() -> None:
    # Real vLLM's relay records the leg a crash cut; it began just before the crash's window opens.
    def run(crash_at: float) -> HB:
        hb = HB()
        hb.engine(0.0, "prefill-0", "A", "prefill")
        hb.engine(0.0, "decode-0", "D", "decode")
        tag = hb.request(0.99, 0.5, status=502, text_ok=None)
        hb.handoff(1.0, "prefill-0", "prefill", tag, "computed", "A")
        hb.handoff(1.45, "decode-0", "decode", tag, "failed", "D", "A", kv_digest=None, duration_s=0.4)
        hb.fault("c", "crash", "decode-0", applied=crash_at, healed=3.0)
        hb.end(4.0)
        return hb

    v = run_check(run(crash_at=1.2).history(), "handoff_strict", {"grace_s": 0.0})
    assert v.status == "pass" and v.numbers["excused_in_flight"] == {"failed": 1}
    # The crash came after the leg had failed: nothing explains it.
    assert run_check(run(crash_at=1.5).history(), "handoff_strict", {"grace_s": 0.0}).status == "fail"


def test_availability_counts_requests_cut_by_the_fault_as_during() -> None:
    hb = HB()
    for i in range(5):
        hb.request(0.1 * i, 0.05)
    hb.request(0.9, 0.5, status=500)  # in flight when the fault lands at 1.0
    hb.fault("f", "restart", "prefill-0", applied=1.0, healed=1.5)
    for i in range(5):
        hb.request(2.0 + 0.1 * i, 0.05)
    hb.end(3.0)
    v = check_availability(hb.history(), AvailabilityExpect(settle_s=0.2))
    assert v.status == "pass", v.reason
    windows = v.numbers["windows"]["f"]
    assert (windows["before"]["ok"], windows["before"]["failed"]) == (5, 0)
    assert windows["during"]["failed"] == 1


def test_recovery_of_a_crash_ended_by_a_respawn_step() -> None:
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill", "http://p0")
    hb.status(0.0, "w-p0", "ready", "http://p0")
    hb.fault("crash", "crash", "prefill-0", applied=1.0)
    hb.status(1.2, "w-p0", "failed", "http://p0")
    hb.fault("respawn", "respawn", "prefill-0", applied=2.0, healed=3.0)
    hb.heal("crash", "crash", "prefill-0", 3.0)
    hb.status(3.2, "w-p0", "ready", "http://p0")
    hb.pd_request(3.3, "B")
    hb.fault("again", "crash", "prefill-0", applied=3.5)  # a later outage does not hide the first recovery
    hb.end(6.0)
    v = check_recovery(hb.history(), RecoveryExpect(max_recovery_s=2.0, faults=("crash",)))
    assert v.status == "pass", v.reason
    assert v.numbers["faults"]["crash"]["heal_to_handoff_s"] == pytest.approx(0.31)


# ----------------------------------------------------------------------------------------- local compute


def local_run() -> HB:
    """No id to mint (partial read cleared it): the decode computes requests itself from t=2."""
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill")
    hb.engine(0.0, "decode-0", "D", "decode")
    hb.engine(0.0, "solo-0", "S", "both")
    hb.pd_request(0.5, "A")
    hb.fault("partial", "fault:fail_server_info", "prefill-0", applied=1.0, healed=1.5)
    for i in range(4):
        tag = hb.request(2.0 + 0.5 * i, 0.05)
        hb.handoff(2.02 + 0.5 * i, "decode-0", "local", tag, "computed", "D")
    tag = hb.request(4.5, 0.05)
    hb.handoff(4.52, "solo-0", "local", tag, "computed", "S")  # not a decode: a regular worker
    hb.end(5.0)
    return hb


def test_local_compute_on_a_decode_is_a_silent_recompute() -> None:
    h = local_run().history()
    v = run_check(h, "handoff_strict", {"grace_s": 1.0})
    assert v.status == "fail" and v.numbers["problems"] == {"local_compute": 4}
    assert v.numbers["outcomes"] == {"pulled": 1, "local": 4}
    v = run_check(h, "no_local_compute", {})
    assert v.status == "fail" and v.numbers["local_on_decodes"] == 4 and len(v.evidence) == 4
    v = run_check(h, "no_local_compute", {"excuse_kinds": ["fail_server_info"], "grace_s": 10.0})
    assert v.status == "pass"
    assert run_check(h, "handoff", {"allow_recompute": True}).status == "pass"


def test_no_local_compute_unknown_and_pass() -> None:
    assert run_check(HB().history(), "no_local_compute", {}).status == "unknown"
    assert run_check(restart_run().history(), "no_local_compute", {}).status == "pass"


# ----------------------------------------------------------------------------------------- balance


def balance_run(pairs: list[tuple[str, str]], n: int = 24) -> HB:
    hb = HB()
    for name in ("prefill-0", "prefill-1"):
        hb.engine(0.0, name, name.upper(), "prefill")
    for name in ("decode-0", "decode-1"):
        hb.engine(0.0, name, name.upper(), "decode")
    for i in range(n):
        p, d = pairs[i % len(pairs)]
        tag = hb.request(0.1 * i, 0.05)
        hb.handoff(0.1 * i + 0.01, p, "prefill", tag, "computed", p.upper())
        hb.handoff(0.1 * i + 0.02, d, "decode", tag, "pulled", d.upper(), p.upper())
    hb.end(0.1 * n + 1)
    return hb


def test_balance_round_robin_passes_and_shared_counter_fails() -> None:
    fair = [("prefill-0", "decode-0"), ("prefill-1", "decode-1")]
    v = run_check(balance_run(fair).history(), "balance", {})
    assert v.status == "pass" and v.numbers["roles"]["prefill"]["counts"] == {
        "prefill-0": 12,
        "prefill-1": 12,
    }
    # One counter shared by both legs: every request lands on prefill-0 and decode-1 (bug #10).
    v = run_check(balance_run([("prefill-0", "decode-1")]).history(), "balance", {})
    assert v.status == "fail" and v.numbers["roles"]["decode"]["skew"] == 1.0
    assert run_check(balance_run(fair, n=6).history(), "balance", {}).status == "unknown"
    assert run_check(restart_run().history(), "balance", {}).status == "unknown"  # one engine per role


# ----------------------------------------------------------------------------------------- reported engine id


def reported_run(shows_new: bool) -> HB:
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill", "http://p0")
    hb.at(0.0).router_status("w-p0", "http://p0", "prefill", "ready", "A")
    hb.fault("r", "restart", "prefill-0", applied=1.0, healed=1.2)
    hb.engine(1.2, "prefill-0", "B", "prefill", "http://p0")
    if shows_new:
        hb.at(1.6).router_status("w-p0", "http://p0", "prefill", "ready", "B_dp0")
    hb.end(8.0)
    return hb


def test_reported_engine_id() -> None:
    v = run_check(reported_run(True).history(), "reported_engine_id", {})
    assert v.status == "pass" and v.numbers["changes"]["prefill-0@1.20"]["lag_s"] == pytest.approx(0.4)
    v = run_check(reported_run(False).history(), "reported_engine_id", {"max_lag_s": 2.0})
    assert v.status == "fail" and "'A'" in v.evidence[0]
    v = run_check(reported_run(False).history(), "reported_engine_id", {"max_lag_s": 20.0})
    assert v.status == "unknown" and "run ended" in v.reason
    assert run_check(restart_run().history(), "reported_engine_id", {}).status == "unknown"  # no ids shown
    assert run_check(HB().history(), "reported_engine_id", {}).status == "unknown"


def test_reported_engine_id_shown_before_the_harness_saw_the_engine_change_is_not_late() -> None:
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill", "http://p0")
    hb.at(0.0).router_status("w-p0", "http://p0", "prefill", "ready", "A")
    hb.fault("r", "restart", "prefill-0", applied=1.0, healed=2.0)
    hb.at(1.5).router_status("w-p0", "http://p0", "prefill", "ready", "B")  # the router's probe was first
    hb.engine(2.0, "prefill-0", "B", "prefill", "http://p0")  # the pod's readiness, later
    hb.end(8.0)
    v = run_check(hb.history(), "reported_engine_id", {})
    assert v.status == "pass" and v.numbers["changes"]["prefill-0@2.00"]["lag_s"] == 0.0


@pytest.mark.parametrize(("serves_after", "status"), [(True, "pass"), (False, "fail")])
def test_a_router_pause_is_recovered_by_a_handoff_through_any_engine(serves_after: bool, status: str) -> None:
    hb = HB()
    hb.engine(0.0, "prefill-0", "A", "prefill", "http://p0")
    hb.engine(0.0, "decode-0", "D", "decode", "http://d0")
    hb.status(0.0, "w-p0", "ready", "http://p0")
    hb.status(0.0, "w-d0", "ready", "http://d0", role="decode")
    hb.pd_request(0.5, "A")
    hb.fault("stall", "pause_router", "router", applied=1.0, healed=2.0)
    for i in range(8):
        if serves_after:
            hb.pd_request(2.2 + 0.25 * i, "A")
        else:
            hb.request(2.2 + 0.25 * i, 0.01, status=503)
    hb.end(5.0)
    v = check_recovery(hb.history(), RecoveryExpect(max_recovery_s=2.0))
    assert v.status == status, v.reason
    if serves_after:
        assert v.numbers["faults"]["stall"]["heal_to_handoff_s"] == pytest.approx(0.2, abs=0.05)
