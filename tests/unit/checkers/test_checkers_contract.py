"""The contract checkers (status machine, leg shape, handoff parameters) on synthetic histories that hold only
the engines' own records: probes answered, legs served or refused, as a router exposing nothing leaves."""

from __future__ import annotations

from typing import Any

import pytest
from test_checkers_builders import HB, WALL0

from harness.checkers import (
    BreakerContractExpect,
    HandoffParamsExpect,
    LegShapeExpect,
    MetadataReadsExpect,
    ProbeScheduleExpect,
    RequestContractExpect,
    RouterEventsExpect,
    StatusContractExpect,
    check_breaker_contract,
    check_error_answers,
    check_handoff_params,
    check_leg_shape,
    check_legs_once,
    check_metadata_reads,
    check_probe_schedule,
    check_request_contract,
    check_router_events,
    check_status_contract,
)
from harness.checkers.attribution import blame
from harness.contract.breaker_model import (
    EITHER,
    FAILURE,
    INITIAL,
    NEUTRAL,
    SUCCESS,
    BreakerRules,
    hidden_failures,
    on_outcome,
    on_pick,
    surely_admits,
    surely_refuses,
)
from harness.contract.reach import DOWN, LOSSY, MURKY, Window, probe_windows
from harness.contract.settings import contract_of
from harness.contract.status_model import (
    FAILED,
    NOT_READY,
    PENDING,
    READY,
    Outcome,
    Thresholds,
    WorkerState,
    apply,
    apply_failures,
    statuses,
    step,
)

Shape = dict[str, Any]
INTERVAL = 0.3
TIMEOUT = 0.5


TOP = ("health_interval_s", "health_timeout_s", "failure_threshold", "success_threshold", "request_timeout_s")


def settings(failure: int = 1, success: int = 1, **router: Any) -> dict[str, Any]:
    r = {"health_interval_s": INTERVAL, "health_timeout_s": TIMEOUT, "failure_threshold": failure,
         "success_threshold": success, "request_timeout_s": 8.0, "identity_check_interval_s": 1.0, **router}
    return {
        **{k: r[k] for k in TOP},
        "router": r,
        "workload": {"max_tokens": 6},
        "engines_layout": {"prefill-0": {"role": "prefill", "url": "http://p0"},
                           "decode-0": {"role": "decode", "url": "http://d0"}},
        "observe_interval_s": 0.15,
    }


class Run:
    """A 1p1d run told through the engines' records only."""

    def __init__(self, failure: int = 1, success: int = 1, connector: str = "mooncake",
                 transport: str = "http", **router: Any) -> None:
        self.hb = HB(started=False)
        self.hb.at(0.0).run_started("contract", "1p1d", connector, transport, "gateway", 1,
                                    settings(failure, success, **router))
        self.transport = transport
        self.connector = connector
        self.hb.engine(0.0, "prefill-0", "A", "prefill", "http://p0")
        self.hb.engine(0.0, "decode-0", "D", "decode", "http://d0")

    def probe(self, t: float, engine: str, healthy: bool = True, duration: float = 0.002,
              caller: str = "router") -> None:
        call = "grpc_health" if self.transport == "grpc" else "health"
        status = 200 if healthy or self.transport == "grpc" else 503
        self.hb.at(t + duration).engine_call({
            "record": "engine_call", "ts": WALL0 + t, "engine": engine, "engine_id": "A", "generation": 1,
            "role": "prefill", "call": call, "status": status, "duration_s": duration, "caller": caller,
            "detail": {"healthy": healthy},
        })

    def read(self, t: float, duration: float, status: int = 200, call: str = "server_info") -> None:
        """The router's id read of prefill-0, as the engine timed it (status 499: the router let it go)."""
        self.hb.at(t + duration).engine_call({
            "record": "engine_call", "ts": WALL0 + t, "engine": "prefill-0", "engine_id": "A",
            "generation": 1, "role": "prefill", "call": call, "status": status, "duration_s": duration,
            "caller": "router", "detail": {},
        })

    def probes(self, engine: str, start: float, end: float, healthy: bool = True) -> None:
        t = start
        while t < end:
            self.probe(t, engine, healthy)
            t += INTERVAL

    def leg(self, t: float, engine: str, kind: str, tag: str, leg: dict[str, Any], **fields: Any) -> None:
        rec = {"ts": WALL0 + t + 0.01, "engine": engine, "engine_id": fields.pop("engine_id", "A"),
               "generation": 1, "role": kind, "kind": kind, "request_id": f"r-{tag}", "tag": tag,
               "connector": self.connector, "transfer_id": None, "remote_engine_id": None,
               "remote_request_id": None, "prompt_digest": "pd",
               "kv_digest": "pd" if kind == "decode" else None,
               "outcome": "pulled" if kind == "decode" else "computed", "error": None, "duration_s": 0.01,
               "output_digest": "o", "leg": leg, **fields}
        self.hb.at(t + 0.01).handoff(rec)

    def pd(self, t: float, prefill_leg: Shape | None = None, decode_leg: Shape | None = None,
           decode_fields: Shape | None = None, prefill_id: str = "A") -> str:
        tag = self.hb.request(t, 0.05)
        transfer = f"xfer-{tag}"
        p = prefill_leg if prefill_leg is not None else {
            "stream": False, "max_tokens": 1, "ignore_eos": True,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "transfer_id": transfer}}
        d = decode_leg if decode_leg is not None else {
            "stream": False, "max_tokens": 6,
            "kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": True,
                                   "transfer_id": transfer, "remote_engine_id": "A"}}
        self.leg(t, "prefill-0", "prefill", tag, p, transfer_id=transfer, engine_id=prefill_id)
        kv = d.get("kv_transfer_params") or {}
        self.leg(t + 0.02, "decode-0", "decode", tag, d, engine_id="D", transfer_id=kv.get("transfer_id"),
                 remote_engine_id=kv.get("remote_engine_id"), **(decode_fields or {}))
        return tag

    def history(self, end: float = 6.0) -> Any:
        self.hb.end(end)
        return self.hb.history()


def healthy_run(**kw: Any) -> Run:
    run = Run(**kw)
    run.probes("prefill-0", 0.1, 5.9)
    run.probes("decode-0", 0.1, 5.9)
    return run


# ------------------------------------------------------------------------------------ the status machine


def test_the_state_machine_follows_the_contract() -> None:
    th = Thresholds(failure=2, success=2)
    s = WorkerState(PENDING)
    s = step(s, True, th)
    assert s.status == PENDING
    s = step(s, True, th)
    assert s == WorkerState(READY)
    s = step(step(s, False, th), False, th)
    assert s.status == NOT_READY
    for _ in range(4):  # 3 x failure in a row since Ready
        s = step(s, False, th)
    assert s.status == FAILED
    s = step(step(s, True, th), True, th)
    assert s == WorkerState(READY), "Failed is not terminal"
    pending = WorkerState(PENDING)
    for _ in range(19):
        pending = step(pending, False, th)
    assert pending.status == PENDING
    assert step(pending, False, th).status == FAILED
    # On its last chance a worker proven healthy is promoted, not failed.
    almost = WorkerState(PENDING, 1, 0, 19)
    assert step(almost, True, th).status == READY


def test_an_either_outcome_keeps_both_and_failures_come_in_a_range() -> None:
    th = Thresholds(1, 1)
    both = apply({WorkerState(READY)}, Outcome.EITHER, th)
    assert statuses(both) == {READY, NOT_READY}
    th3 = Thresholds(3, 2)
    ranged = apply_failures({WorkerState(READY)}, 3, 5, th3)
    assert statuses(ranged) == {NOT_READY}
    assert statuses(apply_failures({WorkerState(READY)}, 0, 2, th3)) == {READY}
    with pytest.raises(ValueError):
        Thresholds(0, 1)


# ------------------------------------------------------------------------------------ reach windows


def test_fault_windows_follow_what_the_fault_does_to_probes() -> None:
    hb = HB(settings=settings())
    hb.engine(0.0, "prefill-0", "A", "prefill")
    hb.fault("crash", "crash", "prefill-0", applied=1.0, healed=3.0)
    hb.at(4.0).fault_applied("side", "link_down", "prefill-0", {"link": "side_channel"}, {})
    hb.at(4.5).fault_applied("freeze", "wedge", "prefill-0", {"mode": "sigstop"}, {})
    hb.at(5.0).fault_healed("freeze", "wedge", "prefill-0")
    hb.at(6.0).fault_applied("slow", "latency", "prefill-0", {"surface": "health", "ms": 900}, {})
    hb.at(6.5).fault_healed("slow", "latency", "prefill-0")
    hb.at(7.0).fault_applied("meta", "wedge", "prefill-0", {"surface": "metadata"}, {})
    hb.end(9.0)
    h = hb.history()
    contract = contract_of(h)
    assert contract is not None
    windows = probe_windows(h, "prefill-0", contract)
    kinds = [(round(w.start, 2), round(w.end, 2), w.kind) for w in windows]
    assert (1.0, 3.0, DOWN) in kinds, "a crash: down until it serves again"
    assert (4.5, 5.0, DOWN) in kinds, "a frozen process answers nothing"
    assert (6.0, 6.5, LOSSY) in kinds, "a slowed health surface: its probes' records may come too late"
    assert not any(w.start >= 7.0 for w in windows), "a side channel or metadata fault leaves probes alone"
    assert not any(4.0 <= w.start < 4.5 for w in windows)
    least, most = Window(1.0, 3.0, DOWN, "crash").hidden(contract)
    assert least == 1 and most >= 7
    assert Window(1.0, 3.0, MURKY, "link").hidden(contract)[0] == 0


# ------------------------------------------------------------------------------------ status_contract


def test_a_router_that_follows_the_probes_passes() -> None:
    run = healthy_run()
    for i in range(10):
        run.pd(1.0 + 0.4 * i)
    v = check_status_contract(run.history())
    assert v.status == "pass", v.evidence
    assert v.numbers["legs"] == 20 and v.numbers["detection_bound_s"] > 0


def test_a_leg_to_a_worker_its_own_probes_took_out_is_a_violation() -> None:
    run = Run()
    run.probes("decode-0", 0.1, 5.9)
    run.probes("prefill-0", 0.1, 2.0)
    run.probes("prefill-0", 2.0, 4.0, healthy=False)  # seen failures: it answers unhealthy
    tag = run.pd(3.0)
    v = check_status_contract(run.history())
    assert v.status == "fail"
    assert tag in v.evidence[0] and "not Ready since t=2.002" in v.evidence[0]


def test_a_threshold_of_two_allows_one_failure() -> None:
    run = Run(failure=2)
    run.probes("decode-0", 0.1, 5.9)
    run.probes("prefill-0", 0.1, 2.0)
    run.probe(2.05, "prefill-0", healthy=False)
    run.probes("prefill-0", 2.3, 5.9)
    run.pd(2.1)
    assert check_status_contract(run.history()).status == "pass"


def test_a_probe_answered_too_late_counts_as_failed() -> None:
    run = Run()
    run.probes("decode-0", 0.1, 5.9)
    run.probes("prefill-0", 0.1, 2.0)
    run.probe(2.05, "prefill-0", healthy=True, duration=0.9)  # past the 0.5 s probe timeout
    run.pd(2.7)
    v = check_status_contract(run.history())
    assert v.status == "fail", v.reason


def test_hidden_failures_during_a_crash_excuse_nothing_the_router_does_inside() -> None:
    run = Run()
    run.probes("decode-0", 0.1, 5.9)
    run.probes("prefill-0", 0.1, 2.0)
    run.hb.fault("crash", "crash", "prefill-0", applied=2.0, healed=4.0)
    run.probes("prefill-0", 4.1, 5.9)
    run.hb.status(2.05, "w-p0", "ready", "http://p0")
    run.hb.at(2.05).router_status("w-p0", "http://p0", "prefill", "not_ready", None, engine="prefill-0")
    v = check_status_contract(run.history())
    assert v.status == "pass", v.evidence


def test_a_worker_still_shown_ready_past_the_detection_bound_is_a_violation() -> None:
    run = Run()
    run.probes("decode-0", 0.1, 5.9)
    run.probes("prefill-0", 0.1, 2.0)
    run.hb.fault("crash", "crash", "prefill-0", applied=2.0, healed=5.0)
    run.hb.at(4.9).router_status("w-p0", "http://p0", "prefill", "ready", None, engine="prefill-0")
    v = check_status_contract(run.history())
    assert v.status == "pass", "inside the outage: hidden probes may still be few"
    run = Run()
    run.probes("decode-0", 0.1, 5.9)
    run.probes("prefill-0", 0.1, 2.0)
    run.hb.fault("crash", "crash", "prefill-0", applied=2.0, healed=5.0)
    run.hb.at(5.2).router_status("w-p0", "http://p0", "prefill", "ready", None, engine="prefill-0")
    v = check_status_contract(run.history())
    assert v.status == "fail" and "showed prefill-0 ready" in v.evidence[0]


def test_a_failed_worker_kept_out_after_it_answers_again_is_a_violation() -> None:
    run = Run(success=2)
    run.probes("decode-0", 0.1, 5.9)
    run.probes("prefill-0", 0.1, 1.0)
    run.hb.fault("crash", "crash", "prefill-0", applied=1.0, healed=3.0)
    run.probes("prefill-0", 3.1, 5.9)
    run.hb.at(5.0).router_status("w-p0", "http://p0", "prefill", "failed", None, engine="prefill-0")
    v = check_status_contract(run.history())
    assert v.status == "fail" and "allows ready" in v.evidence[0]


def test_a_503_while_every_role_was_surely_ready_kept_workers_out() -> None:
    run = healthy_run()
    tag = run.hb.request(3.0, 0.01, status=503)
    v = check_status_contract(run.history())
    assert v.status == "fail" and tag in v.evidence[0] and "stayed Ready" in v.evidence[0]
    lenient = StatusContractExpect(check_kept_out=False)
    assert check_status_contract(run.hb.history(), lenient).status != "fail"


def test_the_harness_own_probes_do_not_count_and_no_probe_is_unknown() -> None:
    run = Run()
    run.probe(1.0, "prefill-0", caller="harness")
    v = check_status_contract(run.history())
    assert v.status == "unknown" and "no engine recorded a probe" in v.reason
    assert check_status_contract(HB().history()).status == "unknown"


# ------------------------------------------------------------------------------------ leg_shape


def test_legs_shaped_as_the_contract_says_pass_on_both_transports() -> None:
    for transport in ("http", "grpc"):
        run = healthy_run(transport=transport)
        run.pd(1.0)
        v = check_leg_shape(run.history())
        assert v.status == "pass", (transport, v.evidence)


@pytest.mark.parametrize(("leg", "words"), [
    ({"stream": True, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "x"}},
     "streamed"),
    ({"stream": False, "max_tokens": 6, "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "x"}},
     "max_tokens 6"),
    ({"stream": False, "max_tokens": 1, "min_tokens": 2,
      "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "x"}},
     "min_tokens 2 above max_tokens 1"),
    ({"stream": False, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}, "no transfer_id"),
    ({"stream": False, "max_tokens": 1,
      "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "x"}},
     "not tagged for a remote decode"),
    ({"stream": False, "max_tokens": 1, "stop": ["alpha"],
      "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "x"}},
     "stop strings kept ['alpha']"),
    ({"stream": False, "max_tokens": 1, "ignored": ["N"],
      "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "x"}},
     "fields the engine ignores ['N']"),
])
def test_a_prefill_leg_shaped_otherwise_is_a_violation(leg: dict[str, Any], words: str) -> None:
    run = healthy_run()
    run.pd(1.0, prefill_leg=leg)
    v = check_leg_shape(run.history())
    assert v.status == "fail" and words in v.evidence[0], v.evidence


def test_a_prefill_leg_with_min_tokens_within_its_one_token_passes() -> None:
    """vllm-router 0.1.17 sends min_tokens 1 beside max_tokens 1: nothing vLLM would refuse."""
    run = healthy_run()
    kv = {"do_remote_decode": True, "transfer_id": "xfer-[pdchaos:run:1]"}
    run.pd(1.0, prefill_leg={"stream": False, "max_tokens": 1, "min_tokens": 1, "kv_transfer_params": kv})
    v = check_leg_shape(run.history())
    assert v.status == "pass", v.evidence


def test_a_decode_leg_must_carry_the_clients_parameters() -> None:
    run = healthy_run()
    run.pd(1.0, decode_leg={"stream": False, "max_tokens": 1,
                            "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "x"}})
    v = check_leg_shape(run.history())
    assert v.status == "fail" and "max_tokens 1 (the client asked 6)" in v.evidence[0]


def test_a_prefill_leg_must_ignore_end_of_sequence_on_both_transports() -> None:
    kv = {"do_remote_decode": True, "transfer_id": "x"}
    for transport in ("http", "grpc"):
        run = healthy_run(transport=transport)
        run.pd(1.0, prefill_leg={"stream": False, "max_tokens": 1, "kv_transfer_params": kv})
        v = check_leg_shape(run.history(), LegShapeExpect(roles=("prefill",)))
        assert v.status == "fail" and "ignore_eos not set, nor min_tokens 1" in v.evidence[0], transport
        # min_tokens 1 masks end of sequence for the one token: protected too (vllm-router's way).
        run = healthy_run(transport=transport)
        run.pd(1.0, prefill_leg={"stream": False, "max_tokens": 1, "min_tokens": 1, "kv_transfer_params": kv})
        assert check_leg_shape(run.history()).status == "pass", transport


def test_a_decode_leg_with_a_kv_key_no_connector_reads_is_a_violation() -> None:
    run = healthy_run()
    kv = {"do_remote_prefill": True, "transfer_id": "x"}
    run.pd(1.0, decode_leg={"stream": False, "max_tokens": 6, "kv_transfer_params": kv,
                            "ignored": ["kv_transfer_params.DO_REMOTE_DECODE"]})
    v = check_leg_shape(run.history(), LegShapeExpect(roles=("decode",)))
    assert v.status == "fail", v.evidence
    assert "fields the engine ignores ['kv_transfer_params.DO_REMOTE_DECODE']" in v.evidence[0]
    assert "decode fields the engine ignores" in v.reason


def test_leg_shape_is_unknown_without_any_leg_shape() -> None:
    assert check_leg_shape(healthy_run().history()).status == "unknown"


# ------------------------------------------------------------------------------------ handoff_params


def test_minted_params_that_match_the_prefill_pass() -> None:
    run = healthy_run()
    run.hb.at(0.2).engine_call({
        "record": "engine_call", "ts": WALL0 + 0.2, "engine": "prefill-0", "engine_id": "A", "generation": 1,
        "role": "prefill", "call": "bootstrap_query", "status": 200, "duration_s": 0.001, "caller": "router",
        "detail": {"engine_ids": ["A"]}})
    run.pd(1.0)
    v = check_handoff_params(run.history(), HandoffParamsExpect())
    assert v.status == "pass", v.evidence


def test_a_decode_told_another_transfer_or_an_id_never_seen_is_a_violation() -> None:
    run = healthy_run()
    run.pd(1.0, decode_leg={"stream": False, "max_tokens": 6, "kv_transfer_params": {
        "do_remote_prefill": True, "transfer_id": "xfer-other", "remote_engine_id": "A"}})
    run.pd(2.0, decode_leg={"stream": False, "max_tokens": 6, "kv_transfer_params": {
        "do_remote_prefill": True, "transfer_id": "xfer-[pdchaos:run:2]", "remote_engine_id": "Z"}})
    v = check_handoff_params(run.history())
    assert v.status == "fail"
    assert any("transfer xfer-other" in e for e in v.evidence)
    assert any("minted engine id Z" in e for e in v.evidence)


def test_nixl_params_must_be_relayed_from_the_prefill_that_computed() -> None:
    run = healthy_run(connector="nixl")
    run.pd(1.0, prefill_leg={"stream": False, "max_tokens": 1,
                             "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}},
           decode_leg={"stream": False, "max_tokens": 6})
    v = check_handoff_params(run.history())
    assert v.status == "fail" and "were not relayed" in v.evidence[0]


def test_nixl_params_missing_after_a_prefill_leg_that_kept_stop_strings_says_why() -> None:
    run = healthy_run(connector="nixl")
    run.pd(1.0, prefill_leg={"stream": False, "max_tokens": 1, "stop": ["alpha"],
                             "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}},
           decode_leg={"stream": False, "max_tokens": 6})
    v = check_handoff_params(run.history())
    assert v.status == "fail" and "kept stop strings ['alpha']" in v.evidence[0], v.evidence


@pytest.mark.parametrize(("addr", "words"), [
    ("http://p0:8998", None),
    ("http://[127.0.0.1]:8998", "which is no URL"),  # an IPv4 host in brackets: no HTTP client reads it
    ("http://d0:8998", "but prefill-0 runs on host p0"),
])
def test_the_bootstrap_address_minted_names_the_prefill_s_host(addr: str, words: str | None) -> None:
    run = healthy_run()
    run.pd(1.0, decode_leg={"stream": False, "max_tokens": 6, "kv_transfer_params": {
        "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": "xfer-[pdchaos:run:1]",
        "remote_engine_id": "A", "remote_bootstrap_addr": addr}})
    v = check_handoff_params(run.history())
    if words is None:
        assert v.status == "pass", v.evidence
    else:
        assert v.status == "fail" and words in v.evidence[0], v.evidence


@pytest.mark.parametrize(("told", "silent", "ok"), [
    ("", True, True),  # the prefill answered with no id (fault no_engine_id): relayed as it said
    ("A", True, False),  # throughout the fault its answer said "", so "A" is not what it said
    ("", False, False),  # without the fault its answer named A
])
def test_nixl_engine_id_relayed_is_what_the_prefill_s_answer_said(told: str, silent: bool, ok: bool) -> None:
    run = healthy_run(connector="nixl")
    if silent:
        run.hb.at(0.5).fault_applied("mute", "no_engine_id", "prefill-0", {}, {})
        run.hb.at(2.0).fault_healed("mute", "no_engine_id", "prefill-0")
    run.pd(1.0, prefill_leg={"stream": False, "max_tokens": 1,
                             "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}},
           decode_leg={"stream": False, "max_tokens": 6,
                       "kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": True,
                                              "remote_engine_id": told}})
    v = check_handoff_params(run.history())
    assert (v.status == "pass") == ok, v.evidence
    if not ok:
        assert "its answer said" in v.evidence[0], v.evidence


# ------------------------------------------------------------------------------------ from the engines' side


def test_the_probe_schedule_is_judged_from_the_engines_when_the_router_exposes_no_probe() -> None:
    def run(stall: bool) -> Any:
        r = Run()
        r.hb.at(1.0).fault_applied("wedge", "wedge", "prefill-0", {"surface": "metadata"}, {})
        r.hb.at(4.0).fault_healed("wedge", "wedge", "prefill-0")
        r.probes("prefill-0", 0.1, 5.9)
        r.probes("decode-0", 0.1, 1.5)
        r.probes("decode-0", 3.5 if stall else 1.5, 5.9)
        return r.history()

    v = check_probe_schedule(run(stall=False), ProbeScheduleExpect())
    assert v.status == "pass" and v.numbers["source"] == "engines", v.reason
    v = check_probe_schedule(run(stall=True), ProbeScheduleExpect())
    assert v.status == "fail" and "decode-0 not probed for 2." in v.evidence[0]


def test_metadata_reads_from_the_engines_allow_the_identity_checks_on_top() -> None:
    def run(reads_every: float) -> Any:
        r = Run()
        r.hb.at(1.0).fault_applied("no_id", "fault:no_engine_id", "prefill-0", {}, {})
        t = 1.05
        while t < 5.0:
            r.hb.at(t).engine_call({
                "record": "engine_call", "ts": WALL0 + t, "engine": "prefill-0", "engine_id": "A",
                "generation": 1, "role": "prefill", "call": "server_info", "status": 200, "duration_s": 0.001,
                "caller": "router", "detail": {"kv_engine_id": ""}})
            t += reads_every
        return r.history(end=5.0)

    exp = MetadataReadsExpect(target="prefill-0", from_fault="no_id", max_reads=2)
    v = check_metadata_reads(run(reads_every=1.0), exp)  # one identity check a second
    assert v.status == "pass" and v.numbers["source"] == "engines", v.reason
    v = check_metadata_reads(run(reads_every=0.3), exp)  # one read every probe
    assert v.status == "fail" and "and the identity checks" in v.reason


# ------------------------------------------------------------------------- request_contract, legs_once


def refused(run: Run, t: float, engine: str, role: str, tag: str | None, status: int,
            duration: float = 0.005) -> None:
    run.hb.at(t + duration + 0.005).engine_call({
        "record": "engine_call", "ts": WALL0 + t, "engine": engine, "engine_id": "A", "generation": 1,
        "role": role, "call": "generate", "status": status, "duration_s": duration, "caller": "router",
        "detail": {"request_id": f"r-{tag}", "tag": tag, "leg": {"stream": False, "max_tokens": 1},
                   "error": f"status {status}"}})


def test_a_leg_an_engine_refused_counts_once_so_running_it_again_elsewhere_is_a_violation() -> None:
    run = healthy_run()
    tag = run.pd(2.0)
    refused(run, 1.95, "prefill-0", "prefill", tag, 500)  # refused, then run again (served) on its retry
    v = check_legs_once(run.history())
    assert v.status == "fail" and "prefill-0 refused 500" in v.evidence[0], v.evidence


def test_refusals_before_any_leg_must_be_prompt() -> None:
    run = healthy_run()
    run.hb.request(2.0, 0.02, status=503)
    assert check_request_contract(run.history(), RequestContractExpect()).status == "pass"
    run = healthy_run()
    tag = run.hb.request(2.0, 2.5, status=503)
    v = check_request_contract(run.history())
    assert v.status == "fail" and tag in v.evidence[0]
    assert "refused 503 before any leg after 2.500s" in v.evidence[0]


def test_the_time_a_router_was_paused_is_not_counted_against_its_refusals_or_deadline() -> None:
    run = healthy_run()
    run.hb.at(1.9).fault_applied("stall", "pause_router", "router", {"pause_s": 2.0}, {})
    run.hb.at(3.9).fault_healed("stall", "pause_router", "router")
    run.hb.request(2.0, 2.05, status=503)  # arrived while it was stopped: refused 0.15 s after the resume
    assert check_request_contract(run.history()).status == "pass"


def test_a_client_error_an_engine_refused_reaches_the_client_as_its_own() -> None:
    for client_status, verdict in ((400, "pass"), (502, "fail")):
        run = healthy_run()
        tag = run.hb.request(2.0, 0.05, status=client_status)
        refused(run, 2.01, "prefill-0", "prefill", tag, 400)
        v = check_request_contract(run.history())
        assert v.status == verdict, (client_status, v.evidence)
        assert v.numbers["client_errors"] == 1


def test_a_leg_the_router_hung_up_on_is_no_refusal_of_the_clients_mistake() -> None:
    """A 499 is the router letting go of a leg (its timeout on a wedged engine), not the engine refusing
    the client's mistake: the 504 that follows is no server error for a client's mistake (found by the
    search on the reference router)."""
    run = healthy_run()
    tag = run.hb.request(2.0, 2.0, status=504, mistake="unknown_model")
    refused(run, 2.01, "prefill-0", "prefill", tag, 499)
    v = check_request_contract(run.history())
    assert v.status == "pass" and v.numbers["client_errors"] == 0, v.evidence


def test_a_refusal_a_cut_link_may_have_lost_is_not_judged() -> None:
    """An engine refused the client's mistake while its serving link was reset: the router may never have
    heard the 404, so the 502 it answered is what it knew (found by the search on the reference router)."""
    for link, judged in (("serve", 0), ("side_channel", 1)):
        run = healthy_run()
        run.hb.at(1.9).fault_applied("cut", "link_reset", "prefill-0", {"link": link}, {})
        run.hb.at(2.4).fault_healed("cut", "link_reset", "prefill-0")
        tag = run.hb.request(2.0, 0.05, status=502)
        refused(run, 2.01, "prefill-0", "prefill", tag, 404)
        v = check_request_contract(run.history())
        assert v.numbers["client_errors"] == judged, (link, v.evidence)
        assert v.status == ("pass" if judged == 0 else "fail")


def test_an_error_answer_without_the_documented_body_is_a_violation() -> None:
    run = healthy_run()
    run.hb.request(1.0, 0.02, status=503)
    tag = run.hb.request(2.0, 0.02, status=502, body_problem="its error.message is None, not a text")
    v = check_error_answers(run.history())
    assert v.status == "fail" and v.numbers == {"error_answers": 2, "without_body": 1}
    assert v.evidence == [f"router side: {tag} got 502, but its error.message is None, not a text"]
    assert check_request_contract(run.history()).status == "pass"  # a finding of its own


@pytest.mark.parametrize(("body", "problem"), [
    ({"error": {"message": "no Ready decode worker", "type": "server_error", "code": "no_available_workers"}},
     None),
    ({"error": {"message": "bad", "type": "invalid_request_error", "code": 400}}, None),
    ({"error": {"message": None, "type": "server_error", "code": "x"}}, "error.message is None"),
    ({"error": {"message": "m", "code": "x"}}, "error.type is None"),
    ({"error": {"message": "m", "type": "t", "code": [1]}}, "error.code is [1]"),
    ({"error": "no workers"}, "not a JSON object with an `error` object"),
    (None, "not a JSON object with an `error` object"),
])
def test_the_error_body_shape(body: Any, problem: str | None) -> None:
    from harness.value_checks import error_body_problem

    got = error_body_problem(body)
    assert (got is None) if problem is None else (problem in str(got)), got


def test_the_router_answers_within_its_own_deadline_when_the_client_waits_longer() -> None:
    run = healthy_run()  # request timeout 8 s: its deadline is 16 s (prefill and decode legs)
    run.hb.request(1.0, 17.0, status=504, deadline=30.0)
    v = check_request_contract(run.history(end=20.0))
    assert v.status == "fail" and "past the router's own deadline" in v.evidence[0]
    run = healthy_run()
    run.hb.request(1.0, 6.0, status=504, deadline=6.0)  # the client gave up first: nothing to judge
    v = check_request_contract(run.history())
    assert v.status == "pass" and v.numbers["deadline_judged"] == 0


def _regular_run(legs: list[dict[str, Any]]) -> Any:
    """A router in regular mode (`1r`): one engine in both roles; each of `legs` reached it for a request."""
    hb = HB(started=False)
    layout = {"engines_layout": {"regular-0": {"role": "regular", "url": "http://r0"}}}
    hb.at(0.0).run_started("contract", "1r", "mooncake", "http", "gateway", 1, {**settings(), **layout})
    hb.engine(0.0, "regular-0", "R", "regular", "http://r0")
    tag = hb.request(1.0, 0.05)
    for i, leg in enumerate(legs):
        hb.at(1.01 + i / 100).handoff({
            "ts": WALL0 + 1.0 + i / 100, "engine": "regular-0", "engine_id": "R", "generation": 1,
            "role": "both", "kind": "local", "request_id": f"r-{tag}-{i}", "tag": tag, "connector": "none",
            "transfer_id": None, "remote_engine_id": None, "remote_request_id": None, "prompt_digest": "pd",
            "kv_digest": None, "outcome": "computed", "error": None, "duration_s": 0.01,
            "output_digest": "o", "leg": leg})
    hb.end(6.0)
    return hb.history()


def test_a_regular_leg_carries_the_client_s_parameters_and_no_handoff_params() -> None:
    plain = {"stream": False, "max_tokens": 6}
    v = check_leg_shape(_regular_run([plain]))
    assert v.status == "pass" and v.numbers["legs"] == 1
    handed = {**plain, "kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": True}}
    v = check_leg_shape(_regular_run([handed]))
    assert v.status == "fail" and "handoff params on a regular leg" in v.evidence[0]
    v = check_leg_shape(_regular_run([{**plain, "max_tokens": 1}]))
    assert v.status == "fail" and "max_tokens 1 (the client asked 6)" in v.evidence[0]
    assert check_legs_once(_regular_run([plain])).status == "pass"
    v = check_legs_once(_regular_run([plain, plain]))
    assert v.status == "fail" and "reached the regulars 2 times" in v.evidence[0]
    assert check_handoff_params(_regular_run([plain])).status == "pass"


# ------------------------------------------------------------------------------------ breaker_contract


def test_the_breaker_model_opens_on_own_failures_and_admits_a_trial_after_its_period() -> None:
    rules = BreakerRules(threshold=2, open_s=5.0)
    s = INITIAL
    s = on_outcome(s, FAILURE, 1.0, rules)
    s = on_outcome(s, NEUTRAL, 1.5, rules)  # a client's 4xx neither counts nor resets
    assert surely_admits(s, 1.6, rules)
    s = on_outcome(s, FAILURE, 2.0, rules)
    assert surely_refuses(s, 2.1, rules) and surely_refuses(s, 6.9, rules)
    assert surely_admits(s, 7.1, rules), "half-open: its one trial may go"
    s = on_pick(s, 7.2, rules)
    assert not surely_admits(s, 7.3, rules), "the trial is out"
    assert surely_admits(on_outcome(INITIAL, SUCCESS, 1.0, rules), 1.0, rules)
    hidden = hidden_failures(INITIAL, 3.0, 4.0, rules)
    assert not surely_admits(hidden, 4.5, rules) and not surely_refuses(hidden, 4.5, rules)


@pytest.mark.parametrize(("kind", "link", "held"), [
    ("link_timeout", "serve", True), ("link_latency", "serve", True), ("link_reset", "serve", False),
    ("link_timeout", "side_channel", False),
])
def test_a_link_that_holds_legs_bends_their_outcomes_until_a_request_timeout_after_it(
    kind: str, link: str, held: bool
) -> None:
    """A leg sent into a link that holds it fails when its request timeout runs out, after the heal: the
    router counts that failure then (a breaker it opens then is the contract's; found by the search)."""
    from harness.contract.evidence import EngineView
    from harness.contract.reach import leg_windows

    run = Run(circuit_breaker_failures=2, circuit_breaker_open_s=0.5)
    run.hb.at(1.0).fault_applied("cut", kind, "prefill-0", {"link": link}, {})
    run.hb.at(1.5).fault_healed("cut", kind, "prefill-0")
    history = run.history(end=10.0)
    view = EngineView.of(history)
    assert view is not None
    last = max((w.end for w in leg_windows(history, "prefill-0", view.contract)), default=0.0)
    assert (last >= 1.5 + view.contract.request_timeout_s) == held, last


def breaker_run(decode_answers: list[int], refused_at: float | None = None) -> Any:
    """A 1p1d run with a breaker of 2 failures kept open 5 s; the decode refuses legs with these statuses."""
    run = Run(circuit_breaker_failures=2, circuit_breaker_open_s=5.0)
    run.probes("prefill-0", 0.1, 9.9)
    run.probes("decode-0", 0.1, 9.9)
    t = 1.0
    for status in decode_answers:
        tag = run.hb.request(t, 0.05, status=502 if status >= 500 else status)
        run.leg(t, "prefill-0", "prefill", tag, {"stream": False, "max_tokens": 1})
        refused(run, t + 0.02, "decode-0", "decode", tag, status)
        t += 0.2
    if refused_at is not None:
        run.hb.request(refused_at, 0.01, status=503)
    return run.history(end=10.0)


def test_a_leg_to_a_worker_its_breaker_keeps_out_is_a_violation() -> None:
    v = check_breaker_contract(breaker_run([500, 500, 500]), BreakerContractExpect())
    assert v.status == "fail" and "surely kept it out" in v.evidence[0] and "[pdchaos:run:3]" in v.evidence[0]
    assert check_breaker_contract(breaker_run([500, 400, 500])).status == "pass", "a 4xx does not count"


def test_a_refusal_while_the_breaker_surely_admits_kept_a_worker_out() -> None:
    v = check_breaker_contract(breaker_run([400, 400, 400], refused_at=3.0))
    assert v.status == "fail" and "breakers surely admitted" in v.evidence[0]
    assert check_breaker_contract(breaker_run([500, 500], refused_at=3.0)).status == "pass", "opened: a 503"
    v = check_breaker_contract(breaker_run([500, 500], refused_at=7.0))
    assert v.status == "fail", "its open period was over: it admits a trial"


def slow_failures_run(trial_at: float) -> Any:
    """A 1p1d run with a breaker of 2 failures kept open 1 s. The decode is slowed (an engine latency fault):
    each of its legs fails with 500 0.4 s after it arrived. The second failure comes back at 1.62."""
    run = Run(circuit_breaker_failures=2, circuit_breaker_open_s=1.0)
    run.probes("prefill-0", 0.1, 5.9)
    run.probes("decode-0", 0.1, 5.9)
    run.hb.at(0.9).fault_applied("slow", "latency", "decode-0", {"surface": "generate", "ms": 400}, {})
    for t in (1.0, 1.2, trial_at):
        tag = run.hb.request(t - 0.02, 0.45, status=502)
        run.leg(t - 0.02, "prefill-0", "prefill", tag, {"stream": False, "max_tokens": 1})
        refused(run, t, "decode-0", "decode", tag, 500, duration=0.4)
    return run.history()


@pytest.mark.parametrize(("trial_at", "verdict"), [(2.4, "fail"), (2.8, "pass")])
def test_a_slow_failure_opens_the_breaker_when_its_answer_comes_back(trial_at: float, verdict: str) -> None:
    """Open from the answer (1.62 to 2.62), not from when the leg was sent (a router that starts the open
    period at the request's start lets a trial through 0.4 s early). An engine's added latency hides no
    outcome from the router: it sees each slow answer."""
    v = check_breaker_contract(slow_failures_run(trial_at))
    assert v.status == verdict, v
    if verdict == "fail":
        assert "sent a refused leg to decode-0 at t=2.400 while its circuit breaker surely kept it out" \
            in v.evidence[0]


def test_a_leg_the_router_gave_up_on_counts_at_its_request_timeout() -> None:
    from harness.checkers.breaker_contract import outcome_of, router_end
    from harness.contract.evidence import EngineView

    run = healthy_run()
    tag = run.hb.request(0.98, 12.0, status=504)
    refused(run, 1.0, "decode-0", "decode", tag, 500, duration=11.0)
    view = EngineView.of(run.history(end=13.0))
    assert view is not None
    (leg,) = [leg for leg in view.legs() if leg.engine == "decode-0"]
    assert router_end(leg, view.contract.request_timeout_s) == pytest.approx(9.0)  # 1.0 + the 8 s timeout
    assert outcome_of(leg, view.contract.request_timeout_s, "http") == FAILURE
    assert outcome_of(leg, 11.0, "http") == EITHER, "ended at the timeout: given up on, or answered"


@pytest.mark.parametrize(("in_flight", "verdict"), [(False, "fail"), (True, "pass")])
def test_a_window_with_no_request_in_flight_hides_no_failure(in_flight: bool, verdict: str) -> None:
    """Legs fail unseen only for a client's request: a link that held nothing hides no breaker move, so a
    503 once it healed, with every worker Ready, kept routable workers out."""
    run = Run(circuit_breaker_failures=2, circuit_breaker_open_s=5.0)
    run.probes("prefill-0", 0.1, 11.9)
    run.probes("decode-0", 0.1, 11.9)
    run.hb.at(0.5).fault_applied("cut", "link_timeout", "decode-0", {"link": "serve"}, {})
    run.hb.at(0.7).fault_healed("cut", "link_timeout", "decode-0")
    if in_flight:
        run.hb.request(0.6, 8.0, status=504)  # its legs may have failed unseen in the cut link
    run.hb.request(9.0, 0.01, status=503)
    v = check_breaker_contract(run.history(end=12.0))
    assert v.status == verdict, v


def test_no_leg_fails_unseen_before_an_engine_first_served() -> None:
    """The router sends a leg only to a worker whose probe it answered: the time before an engine first
    served hides probes, not legs. A 503 just after, with every worker Ready, kept them out (in real time the
    load starts within that edge, and any of its breakers might have opened unseen; found by the agreement of
    the two worlds)."""
    from harness.contract.evidence import EngineView
    from harness.contract.reach import leg_windows

    run = Run(circuit_breaker_failures=2, circuit_breaker_open_s=5.0)
    for engine in ("prefill-0", "decode-0"):
        run.probe(0.01, engine)  # both serve from t=0 (their first record): Ready at once
        run.probes(engine, 0.1, 5.9)
    run.hb.request(0.05, 0.5, status=504)  # in flight within the edge after their start: no leg seen
    run.hb.request(2.0, 0.01, status=503)
    history = run.history()
    view = EngineView.of(history)
    assert view is not None
    assert [w.why for w in view.windows("decode-0")] == ["not started"]
    assert leg_windows(history, "decode-0", view.contract) == []
    assert check_breaker_contract(history).status == "fail"


def test_a_pick_made_while_the_breaker_cannot_have_been_closed_surely_took_the_trial() -> None:
    rules = BreakerRules(threshold=1, open_s=1.0)
    s = on_outcome(INITIAL, FAILURE, 1.0, rules)
    kept = on_pick(s, 2.5, rules)  # picked maybe before it opened, its leg arriving late: no trial
    assert not surely_refuses(kept, 2.6, rules)
    trial = on_pick(s, 2.5, rules, maybe_closed=False)
    assert surely_refuses(trial, 2.6, rules), "the only request a half-open breaker admits is its trial"


@pytest.mark.parametrize(("second_at", "verdict"), [(2.6, "fail"), (4.0, "pass")])
def test_a_half_open_breaker_that_admits_a_second_request_before_its_trial_ends_breaks_the_contract(
    second_at: float, verdict: str
) -> None:
    """One own failure opens prefill-0's breaker for 1 s; after it, the 0.5 s trial fails again. A second
    request picked while the trial is out is a half-open breaker letting everything through (a mutant of
    the reference router's trial bookkeeping that no scenario caught)."""
    run = Run(circuit_breaker_failures=1, circuit_breaker_open_s=1.0)
    run.probes("prefill-0", 0.1, 5.9)
    run.probes("decode-0", 0.1, 5.9)
    for t, duration in ((1.0, 0.005), (2.3, 0.5), (second_at, 0.005)):
        tag = run.hb.request(t, duration + 0.01, status=500)
        refused(run, t, "prefill-0", "prefill", tag, 500, duration=duration)
    v = check_breaker_contract(run.history(end=6.0))
    assert v.status == verdict, v.evidence
    if verdict == "fail":
        assert "surely kept it out" in v.evidence[0]


def test_a_half_open_decode_may_have_given_its_trial_to_a_request_no_decode_saw() -> None:
    """A request's decode is picked with its prefill: the trial may go to a request whose prefill leg hangs
    in a cut link, and be held until it ends, with no decode leg anywhere (found by the search)."""
    from harness.checkers.breaker_contract import breaker_timeline
    from harness.contract.evidence import EngineView

    for cut, verdict in ((True, "pass"), (False, "fail")):
        run = Run(circuit_breaker_failures=2, circuit_breaker_open_s=5.0)
        run.probes("prefill-0", 0.1, 9.9)
        run.probes("decode-0", 0.1, 9.9)
        for t in (1.0, 1.2):
            tag = run.hb.request(t, 0.05, status=502)
            run.leg(t, "prefill-0", "prefill", tag, {"stream": False, "max_tokens": 1})
            refused(run, t + 0.02, "decode-0", "decode", tag, 500)
        if cut:
            run.hb.at(6.3).fault_applied("cut", "link_timeout", "prefill-0", {"link": "serve"}, {})
            run.hb.at(6.5).fault_healed("cut", "link_timeout", "prefill-0")
        run.hb.request(6.4, 2.0, status=504)  # its prefill leg hung: no engine saw it
        history = run.history(end=10.0)
        view = EngineView.of(history)
        assert view is not None
        legs = [leg for leg in view.legs() if leg.engine == "decode-0"]
        decode = breaker_timeline(view, "decode-0", legs, BreakerRules(2, 5.0))
        assert decode.admitted_all_along(7.0, 7.01) == (verdict == "fail"), cut


def test_probes_a_wedged_health_surface_answered_late_are_failures_the_router_saw() -> None:
    def run(shown: str) -> Any:
        r = Run()
        r.probes("decode-0", 0.1, 5.9)
        r.probes("prefill-0", 0.1, 2.0)
        wedge = {"mode": "control", "surface": "health"}
        r.hb.at(2.0).fault_applied("stall", "wedge", "prefill-0", wedge, {})
        r.hb.at(3.5).fault_healed("stall", "wedge", "prefill-0")
        for t in (2.1, 2.4, 2.7, 3.0):
            r.probe(t, "prefill-0", healthy=True, duration=3.5 - t)  # answered only once the wedge cleared
        r.probes("prefill-0", 3.6, 5.9)
        r.hb.at(3.3).router_status("w-p0", "http://p0", "prefill", shown, None, engine="prefill-0")
        return r.history()

    v = check_status_contract(run("ready"))
    assert v.status == "fail" and "showed prefill-0 ready at t=3.300" in v.evidence[0]
    assert check_status_contract(run("not_ready")).status != "fail"


def test_an_id_the_prefill_itself_reported_while_serving_as_another_is_blamed_on_the_engine() -> None:
    def run(reported: str) -> Any:
        r = healthy_run()
        r.hb.at(2.0).engine_state("prefill-0", "B", 2, 4001, role="prefill", url="http://p0")
        r.hb.at(2.2).engine_call({
            "record": "engine_call", "ts": WALL0 + 2.2, "engine": "prefill-0", "engine_id": "B",
            "generation": 2, "role": "prefill", "call": "bootstrap_query", "status": 200,
            "duration_s": 0.001, "caller": "router", "detail": {"engine_ids": [reported]}})
        r.pd(4.5, decode_leg={"stream": False, "max_tokens": 6, "kv_transfer_params": {
            "do_remote_prefill": True, "transfer_id": "xfer-[pdchaos:run:1]", "remote_engine_id": "A"}},
            decode_fields={"outcome": "failed"}, prefill_id="B")
        return r
    # The prefill serves as B since t=2.0 but its /query still says A: the router minted what it was told.
    hist = run("A").history()
    v = check_handoff_params(hist)
    assert v.status == "fail" and v.evidence[0].startswith("engine side:"), v.evidence
    d = next(h for h in hist.handoffs if h.kind == "decode")
    assert blame(hist, d, "failed").side == "engine"
    hist = run("B").history()
    assert check_handoff_params(hist).evidence[0].startswith("router side:")
    d = next(h for h in hist.handoffs if h.kind == "decode")
    assert blame(hist, d, "failed").side == "router"


@pytest.mark.parametrize(("kind", "params"), [
    ("no_engine_id", {}), ("link_down", {"link": "bootstrap", "mode": "down"}),
])
def test_the_refresh_bound_runs_from_when_the_new_id_could_be_read(kind: str, params: dict[str, Any]) -> None:
    """A prefill restarts as B, then its id cannot be read until t=5.0 (it reports none, or the link to its
    Mooncake bootstrap server is down): the router keeps minting A, the one it knows, and the refresh bound
    (2.03 s here) runs from t=5.0, not from the restart (both found by the search)."""
    def run(hidden: bool) -> Any:
        r = healthy_run()
        r.hb.at(2.0).engine_state("prefill-0", "B", 2, 4001, role="prefill", url="http://p0")
        if hidden:
            r.hb.at(2.1).fault_applied("mute", kind, "prefill-0", params, {})
            r.hb.at(5.0).fault_healed("mute", kind, "prefill-0")
        r.pd(5.2, decode_leg={"stream": False, "max_tokens": 6, "kv_transfer_params": {
            "do_remote_prefill": True, "transfer_id": "xfer-[pdchaos:run:1]", "remote_engine_id": "A"}},
            decode_fields={"outcome": "failed"}, prefill_id="B")
        return r.history()
    assert check_handoff_params(run(hidden=True)).status == "pass"
    v = check_handoff_params(run(hidden=False))
    assert v.status == "fail" and "serves as B since t=2.000" in v.evidence[0], v.evidence


# ------------------------------------------------------------------------------------ router_events


def router_event(run: Run, t: float, kind: str, **fields: Any) -> None:
    run.hb.at(t).router_event({"type": kind, "ts": WALL0 + t, "worker": "w1", "url": "http://p0", **fields})


def test_a_router_is_held_to_its_own_probe_and_status_events() -> None:
    run = Run()
    run.probe(1.9, "prefill-0")
    run.probe(2.1, "prefill-0", healthy=False)
    router_event(run, 1.902, "probe", ok=True, duration_s=0.002)  # agrees
    router_event(run, 2.102, "probe", ok=True, duration_s=0.002)  # the engine said 503
    router_event(run, 2.5, "status_change", **{"from": "not_ready", "to": "ready"})
    v = check_router_events(run.history(), RouterEventsExpect())
    assert v.status == "fail" and len(v.evidence) == 2, v.evidence
    assert "counted prefill-0 healthy" in v.evidence[0] and "moved prefill-0 to ready" in v.evidence[1]


def test_a_failed_probe_while_an_engine_drains_is_no_contradiction() -> None:
    """After a SIGTERM the engine's server stops taking connections: a probe it refused left no record, and
    the healthy answer it gave just before is not that probe's (found by the search on the reference
    router)."""
    for stopped in (True, False):
        run = Run()
        run.probe(5.2, "prefill-0")
        router_event(run, 5.202, "probe", ok=True, duration_s=0.002)
        if stopped:
            run.hb.at(5.2).fault_applied("stop", "graceful_stop", "prefill-0", {"grace_s": 0.25}, {})
        router_event(run, 5.26, "probe", ok=False, duration_s=0.0002)
        v = check_router_events(run.history(), RouterEventsExpect())
        assert (v.status == "pass") == stopped, v.evidence


def test_a_probe_or_status_change_the_router_leaves_out_of_its_events_is_a_violation() -> None:
    run = Run()
    run.probe(1.0, "prefill-0")
    run.probe(1.3, "prefill-0")
    run.probe(2.0, "prefill-0")
    router_event(run, 1.002, "probe", ok=True, duration_s=0.002)
    router_event(run, 2.002, "probe", ok=True, duration_s=0.002)  # the router's events were read past 1.4
    run.hb.at(1.1).router_status("w1", "http://p0", "prefill", "ready", None, engine="prefill-0")
    run.hb.at(1.4).router_status("w1", "http://p0", "prefill", "pending", None, engine="prefill-0")
    v = check_router_events(run.history())
    assert v.status == "fail"
    assert any("probe of the router's at t=1.300" in e for e in v.evidence)
    assert any("go ready -> pending" in e for e in v.evidence)


def test_engine_id_events_take_reported_ids_and_never_clear_one() -> None:
    run = healthy_run(transport="grpc")
    run.hb.at(0.2).engine_call({
        "record": "engine_call", "ts": WALL0 + 0.2, "engine": "prefill-0", "engine_id": "A", "generation": 1,
        "role": "prefill", "call": "server_info", "status": 200, "duration_s": 0.001, "caller": "router",
        "detail": {"kv_engine_id": "A"}})
    router_event(run, 0.3, "engine_id", old=None, new="A", confirmed=True, reason="read")
    router_event(run, 2.0, "engine_id", old="A", new="Z", confirmed=True, reason="read")
    router_event(run, 3.0, "engine_id", old="A", new=None, confirmed=False, reason="read")
    # Same id, other news (uptime went backwards): fine; same id said to have changed: a contradiction.
    router_event(run, 4.0, "engine_id", old="A", new="A", confirmed=True, reason="identity check: restarted")
    router_event(run, 5.0, "engine_id", old="A", new="A", confirmed=True, reason="identity check: id_changed")
    v = check_router_events(run.history())
    assert v.status == "fail" and len(v.evidence) == 3, v.evidence
    assert "took id Z" in v.evidence[0] and "cleared prefill-0's id A" in v.evidence[1]
    assert "says prefill-0's id changed (identity check: id_changed), but names the same id A" in \
        v.evidence[2]


@pytest.mark.parametrize(("kind", "fields", "words"), [
    ("probe", {"ok": "yes", "duration_s": 0.002}, "has ok='yes'"),
    ("engine_id", {"old": None, "new": None, "confirmed": False}, "lacks reason"),
    ("XXmetadata_readXX", {"outcome": "id"}, "a type the contract does not document"),
    ("metadata_read", {"outcome": "error", "read": "timeout", "duration_s": 0.5},
     "records a timeout read as outcome 'error'"),
    ("breaker", {"from": "closed", "to": "open", "reason": "consecutive_failures", "failures": 3,
                 "request_id": "r1", "error": None}, "without the failure that opened it"),
    ("status_change", {"from": "ready", "to": "sleeping"}, "has to='sleeping'"),
])
def test_an_event_not_of_its_documented_shape_is_a_violation(kind: str, fields: dict[str, Any],
                                                             words: str) -> None:
    run = healthy_run()
    router_event(run, 3.5, kind, **fields)
    v = check_router_events(run.history())
    assert v.status == "fail" and any(words in e for e in v.evidence), v.evidence


def _dispatch(run: Run, t: float, tag: str, **fields: Any) -> None:
    run.hb.at(t).router_event({
        "type": "dispatch", "ts": WALL0 + t, "request_id": f"req-{tag}", "prefill": "w1", "decode": "w2",
        "prefill_url": "http://p0", "decode_url": "http://d0", "connector": "mooncake",
        "transfer_id": f"xfer-{tag}", "remote_engine_id": "A", "status": 200, "outcome": "ok", "error": None,
        **fields})


def test_a_dispatch_account_that_agrees_with_the_legs_passes() -> None:
    run = healthy_run()
    _dispatch(run, 1.1, run.pd(1.0))
    v = check_router_events(run.history())
    assert v.status == "pass", v.evidence


@pytest.mark.parametrize(("fields", "words"), [
    ({"decode_url": "http://p0"}, "names prefill-0 (prefill) as its decode"),
    ({"status": 502}, "says ok with status 502"),
    ({"outcome": "decode_failed"}, "says decode_failed with status 200"),
    ({"remote_engine_id": "Z"}, "says it sent remote engine id Z, but decode-0 got A"),
    ({"prefill": None, "transfer_id": 7}, "has transfer_id=7"),
    ({"outcome": "lost"}, "has outcome='lost'"),
])
def test_a_dispatch_account_the_legs_contradict_is_a_violation(fields: dict[str, Any], words: str) -> None:
    run = healthy_run()
    _dispatch(run, 1.1, run.pd(1.0), **fields)
    v = check_router_events(run.history())
    assert v.status == "fail" and any(words in e for e in v.evidence), v.evidence


@pytest.mark.parametrize(("error", "ok"), [("prefill-0 answered 500", True), ("", False), (None, False)])
def test_a_dispatch_that_tells_a_failed_outcome_names_its_error(error: str | None, ok: bool) -> None:
    """The outcome extension comes with the error: an operator reading a failed dispatch learns why."""
    run = healthy_run()
    tag = run.pd(1.0)
    fields = {"status": 502, "outcome": "decode_failed"}
    if error is None:
        run.hb.at(1.1).router_event({
            "type": "dispatch", "ts": WALL0 + 1.1, "request_id": f"req-{tag}", "prefill": "w1",
            "decode": "w2", "prefill_url": "http://p0", "decode_url": "http://d0", "connector": "mooncake",
            "transfer_id": f"xfer-{tag}", "remote_engine_id": "A", **fields})  # no error at all
    else:
        _dispatch(run, 1.1, tag, error=error, **fields)
    v = check_router_events(run.history())
    assert (v.status == "pass") == ok, v.evidence
    if not ok:
        assert any("says decode_failed without naming the error" in e for e in v.evidence), v.evidence


def test_a_dispatch_naming_another_prefill_than_served_its_transfer_is_a_violation() -> None:
    run = healthy_run()
    tag = run.pd(1.0)
    run.hb.engine(0.0, "prefill-1", "B", "prefill", "http://p1")
    _dispatch(run, 1.1, tag, prefill_url="http://p1")
    h = run.history()
    h.settings["engines_layout"]["prefill-1"] = {"role": "prefill", "url": "http://p1"}
    v = check_router_events(h)
    assert v.status == "fail" and any("names prefill-1 as its prefill, but prefill-0 served" in e
                                      for e in v.evidence), v.evidence


def test_events_of_the_documented_shape_pass_the_schema() -> None:
    from harness.contract.event_schema import event_problems

    where = {"worker": "w1", "url": "http://p0"}
    assert event_problems("metadata_read", {**where, "outcome": "no_id", "read": "complete",
                                            "duration_s": 0.01}) == []
    assert event_problems("breaker", {**where, "from": "open", "to": "half_open", "reason": "open_elapsed",
                                      "failures": 3, "request_id": None, "error": None}) == []
    assert event_problems("status_change", {**where, "from": None, "to": "pending", "role": "prefill"}) == []
    # A documented field that may be null is still there: one left out is a shape violation.
    assert event_problems("engine_id", {**where, "new": "B", "confirmed": True, "reason": "restart"}) == [
        "lacks old"]


@pytest.mark.parametrize(("reason", "request_id", "ok"), [
    ("trial_succeeded", "cmpl-1", True), ("trial_succeeded", None, False), ("trial_failed", None, False),
    ("consecutive_failures", None, False), ("worker_recovered", None, True),
])
def test_a_breaker_move_a_request_made_names_that_request(reason: str, request_id: str | None,
                                                          ok: bool) -> None:
    from harness.contract.event_schema import event_problems

    to = "open" if reason in ("trial_failed", "consecutive_failures") else "closed"
    found = event_problems("breaker", {"worker": "w1", "url": "http://p0", "from": "half_open", "to": to,
                                       "reason": reason, "failures": 1, "request_id": request_id,
                                       "error": "boom" if to == "open" else None})
    assert (found == []) == ok, found
    if not ok:
        assert "without the request whose outcome moved it" in found[0]


def test_a_router_without_events_has_nothing_of_its_own_to_be_held_to() -> None:
    v = check_router_events(healthy_run().history())
    assert v.status == "pass" and v.numbers["events"] == 0


def _w(**changes: Any) -> dict[str, Any]:
    w = {"id": "w1", "url": "http://p0", "role": "prefill", "transport": "http", "connector": "mooncake",
         "bootstrap_port": 8998, "status": "ready", "kv_engine_id": "A", "engine_id_confirmed": True,
         "labels": {}, "priority": 0, "dp_size": 1, "breaker": "closed"}
    w.update(changes)
    return w


def test_a_worker_list_entry_not_of_the_documented_shape_is_recorded_once_and_judged() -> None:
    from harness.contract.event_schema import worker_problems
    from harness.session.workers import WorkerWatch

    assert worker_problems(_w()) == []
    renamed = _w()
    renamed["XXdp_sizeXX"] = renamed.pop("dp_size")
    assert worker_problems(renamed) == ["lacks dp_size"]
    run = healthy_run()
    router_event(run, 0.1, "probe", ok=True, duration_s=0.001)
    watch = WorkerWatch(run.hb.at(1.0))
    for t in (1.0, 1.5):  # two polls, one record
        watch.history = run.hb.at(t)  # the builder records at the poll's time
        watch.seen([renamed], {"http://p0": "prefill-0"})
    h = run.history()
    assert [(t, w, p) for t, w, p in h.worker_shapes] == [(1.0, "w1", ["lacks dp_size"])]
    v = check_router_events(h)
    assert v.status == "fail"
    assert any("showed w1 not as the worker API documents it: lacks dp_size" in e for e in v.evidence)


def test_a_worker_s_account_must_chain_so_a_move_left_out_shows() -> None:
    run = healthy_run()
    breaker = {"reason": "consecutive_failures", "failures": 3, "request_id": "r1", "error": "refused"}
    router_event(run, 3.0, "breaker", **{"from": "closed", "to": "open"}, **breaker)
    # open -> half_open was never written: the trial's outcome starts from half_open
    router_event(run, 4.0, "breaker", **{"from": "half_open", "to": "closed"},
                 **{**breaker, "reason": "trial_succeeded", "error": None})
    v = check_router_events(run.history())
    assert any("moved w1 from half_open, but its last breaker event left it open" in e for e in v.evidence)


def test_a_worker_removed_then_registered_again_is_a_new_pending_worker() -> None:
    from harness.contract.evidence import ProbeSeen
    from harness.contract.timeline import build_timeline

    contract = contract_of(healthy_run().history())
    assert contract is not None
    probes = [ProbeSeen(t / 10, 0.001, True) for t in range(1, 60, 3)]
    tl = build_timeline("decode-0", probes, [], contract, api_calls=[(2.0, "removed"), (3.5, "added")])
    assert tl.statuses_in(1.5, 1.9) == {READY}
    assert tl.statuses_in(2.5, 3.4) == {"draining"}
    assert PENDING in tl.statuses_in(3.5, 3.5) and tl.statuses_in(4.5, 5.0) == {READY}
    absent = build_timeline("decode-0", probes, [], contract, absent_at_start=True)
    assert absent.statuses_in(0.0, 6.0) == {"absent"}


def test_in_a_murky_window_only_a_probe_answered_healthy_may_have_looked_healthy() -> None:
    """A router paused across a probe (a murky window): a probe the engine answered healthy may have been
    judged either way, but one it answered unhealthy, or that the router cut (499), failed for the router.
    A router that counts an expired probe as a success (a mutant of the reference router's probe expiry)
    shows here."""
    from harness.contract.evidence import ProbeSeen
    from harness.contract.timeline import build_timeline

    contract = contract_of(healthy_run().history())
    assert contract is not None
    good = [ProbeSeen(t / 10, 0.001, True) for t in range(1, 20, 3)]
    paused = [Window(2.0, 4.0, MURKY, "router paused")]
    for healthy, may_be_ready in ((False, False), (True, True)):
        late = [ProbeSeen(t / 10, 0.5, healthy) for t in range(21, 40, 6)]
        tl = build_timeline("decode-0", [*good, *late], paused, contract)
        assert (READY in tl.statuses_in(3.9, 3.95)) == may_be_ready, healthy
        assert tl.statuses_in(3.9, 3.95) - {READY}, "failed probes may be hidden in it"


@pytest.mark.parametrize(("gone_at", "ok"), [(1.2, True), (None, False), (3.0, False)])
def test_a_removed_worker_leaves_the_worker_list_once_idle(gone_at: float | None, ok: bool) -> None:
    run = healthy_run()
    run.hb.status(0.05, "w-d0", "ready", "http://d0", role="decode")
    run.pd(0.9)
    run.hb.at(1.0).fault_applied("rm", "remove_worker", "decode-0", {}, {"status": 200})
    run.hb.status(1.0, "w-d0", "draining", "http://d0", role="decode")
    if gone_at is not None:
        run.hb.status(gone_at, "w-d0", "absent", "http://d0", role="decode")
    v = check_status_contract(run.history())
    assert (v.status == "pass") == ok, v.evidence
    assert v.numbers["removals"] == 1
    if not ok:
        assert "was removed at t=1.000" in v.evidence[0] and "left the worker list" in v.evidence[0]
