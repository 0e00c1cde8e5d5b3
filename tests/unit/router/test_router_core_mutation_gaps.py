"""Behaviour of the router core that mutation testing (bench/mutation.py) showed no other test pinned: each
test kills mutants that survived the rest of tests/unit/router."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from helpers.dispatch_steps import OK, answer_leg, decode_leg, first_leg

from reference_router.core import (
    METADATA_READS_TOTAL,
    MINT_NO_BOOTSTRAP_PORT,
    MINT_NO_ENGINE_ID,
    MINT_SKIPPED_TOTAL,
    NIXL_NO_PARAMS,
    NO_RETRY_DEADLINE,
    NO_RETRY_DELIVERED,
    NO_RETRY_NO_OTHER_WORKER,
    PROBES_TOTAL,
    REASON_TRIAL_FAILED,
    STALE_ENGINE_ID,
    Answer,
    BreakerConfig,
    BreakerState,
    Connector,
    Delivery,
    DispatchFlow,
    DispatchLimits,
    HandoffPlan,
    HealthConfig,
    IdentityKind,
    LeastLoad,
    LegDone,
    LegError,
    LegPolicies,
    MetadataRead,
    MetricInc,
    PowerOfTwo,
    Prepare,
    ProbeStage,
    ReadOutcome,
    RetryDecision,
    Role,
    RunLeg,
    Status,
    Worker,
    WorkerRegistry,
    abandon_identity_check,
    apply_metadata_read,
    avoid_suspects,
    begin_identity_check,
    begin_probe,
    breaker_failure,
    breaker_pick,
    breaker_success,
    decide_engine_id,
    decide_retry,
    expire_probe,
    finish_probe,
    identity_phase,
    make_policy,
    make_worker_spec,
    mark_suspect,
    no_worker_answer,
    observe_identity,
    on_identity_done,
    on_probe_done,
    on_reread_done,
    parse_bootstrap_query,
    parse_connector,
    parse_role,
    plan_handoff,
    plan_probes,
    reread_due_for,
    sanitize_prefill_body,
    set_draining,
    spec_from_json,
    start_tick,
)
from reference_router.core.dispatch_records import pd_record

HEALTH = HealthConfig(failure_threshold=1, success_threshold=1, probe_timeout_s=1.0, interval_s=5.0)
LIMITS = DispatchLimits(request_timeout_s=10.0, id_read_wait_s=0.5)
BODY: dict[str, Any] = {"prompt": "x", "max_tokens": 5}
REFUSED = LegError(502, "upstream_error", "connection refused", Delivery.NOT_SENT)
ANSWERED_500 = LegError(502, "upstream_error", "d answered 500", Delivery.ANSWERED, worker_status=500,
                        worker_message="boom")
CLIENT_ERROR = LegError(400, "upstream_error", "d answered 400", Delivery.ANSWERED, worker_status=400)


def worker(url: str = "http://127.0.0.1:8100", role: str = "prefill", wid: str = "w1", **spec: Any) -> Worker:
    return Worker.new(wid, make_worker_spec(url, role, **spec))


def ready(w: Worker) -> Worker:
    w.runtime.status = Status.READY
    return w


def half_open(w: Worker, trial: str | None = None) -> Worker:
    b = w.runtime.breaker
    b.state, b.open_until, b.trial_request = BreakerState.HALF_OPEN, None, trial
    return w


def opened(w: Worker, until: float) -> Worker:
    b = w.runtime.breaker
    b.state, b.open_until, b.trial_request = BreakerState.OPEN, until, None
    return w


def cluster(prefills: int = 1, decodes: int = 1, connector: str = "nixl", regular: int = 0) -> WorkerRegistry:
    reg = WorkerRegistry()
    for i in range(prefills):
        ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8100 + i}", "prefill", connector=connector)))
    for i in range(decodes):
        ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8200 + i}", "decode", connector=connector)))
    for i in range(regular):
        ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8300 + i}", "regular")))
    return reg


def flow(reg: WorkerRegistry, rid: str = "req-1", pd: bool = True,
         breaker: BreakerConfig | None = None) -> DispatchFlow:
    return DispatchFlow(BODY, reg, LegPolicies.make("round_robin", "round_robin"), LIMITS, pd=pd,
                        request_id=rid, new_uuid=lambda: uuid.UUID(int=7), breaker=breaker)


# ---- workers: validation and POST /workers bodies ----------------------------------------------------------


def test_spec_from_json_passes_every_optional_field_through() -> None:
    spec = spec_from_json({"url": "http://127.0.0.1:8100", "role": "prefill", "connector": "nixl",
                           "kv_role": "kv_producer", "bootstrap_port": 9001, "dp_size": 2,
                           "labels": {"zone": "a"}, "priority": 7, "engine_id": "seed-id"})
    assert (spec.connector, spec.kv_role, spec.bootstrap_port, spec.dp_size, dict(spec.labels), spec.priority,
            spec.engine_id) == (Connector.NIXL, "kv_producer", 9001, 2, {"zone": "a"}, 7, "seed-id")


def test_spec_from_json_defaults() -> None:
    spec = spec_from_json({"url": "http://127.0.0.1:8200", "role": "decode"})
    got = (spec.dp_size, spec.priority, spec.engine_id, spec.kv_role, dict(spec.labels))
    assert got == (1, 0, None, None, {})
    assert spec.connector is Connector.MOONCAKE  # an HTTP PD worker without a connector


def test_port_bounds_name_the_field() -> None:
    assert make_worker_spec("http://127.0.0.1:8100", "prefill", bootstrap_port=65535).bootstrap_port == 65535
    with pytest.raises(ValueError, match=r"bootstrap_port must be an integer in 1\.\.65535"):
        make_worker_spec("http://127.0.0.1:8100", "prefill", bootstrap_port=65536)
    with pytest.raises(ValueError, match=r"url port must be an integer in 1\.\.65535"):
        make_worker_spec("http://127.0.0.1:0", "prefill")


def test_url_must_be_a_string_and_have_no_query() -> None:
    with pytest.raises(ValueError, match="url must be a non-empty string"):
        make_worker_spec(8100, "prefill")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no path or query"):
        make_worker_spec("http://127.0.0.1:8100?x=1", "prefill")


def test_unknown_enum_names_say_which_field() -> None:
    with pytest.raises(ValueError, match=r"^unknown role 'bogus'"):
        parse_role("bogus")
    with pytest.raises(ValueError, match=r"^unknown connector 'bogus'"):
        parse_connector("bogus")


# ---- breaker ---------------------------------------------------------------------------------------------


def test_own_failure_reads_the_client_status_only_of_an_answered_leg() -> None:
    # A leg that never reached its worker counts against it, whatever status the client is given for it.
    cfg = BreakerConfig(failure_threshold=1, open_s=10.0)
    w = worker()
    breaker_failure(w, "r1", LegError(400, "upstream_error", "refused", Delivery.NOT_SENT), 0.0, cfg)
    assert w.runtime.breaker.state is BreakerState.OPEN


def test_breaker_pick_leaves_an_open_breaker_open_before_its_period_ends() -> None:
    w = opened(worker(), until=10.0)
    out = breaker_pick(w, "r1", 9.0)
    assert w.runtime.breaker.state is BreakerState.OPEN and out.events == []


def test_breaker_pick_gives_no_trial_on_a_closed_breaker() -> None:
    w = worker()
    breaker_pick(w, "r1", 0.0)
    assert w.runtime.breaker.trial_request is None


def test_success_of_another_request_does_not_close_a_half_open_breaker() -> None:
    cfg = BreakerConfig(failure_threshold=1, open_s=10.0)
    w = half_open(worker(), trial="trial")
    assert breaker_success(w, "other", cfg).events == []
    assert w.runtime.breaker.state is BreakerState.HALF_OPEN and w.runtime.breaker.trial_request == "trial"


def test_a_trial_ending_in_a_client_error_frees_the_trial() -> None:
    cfg = BreakerConfig(failure_threshold=1, open_s=10.0)
    w = half_open(worker(), trial="trial")
    breaker_failure(w, "trial", CLIENT_ERROR, 0.0, cfg)
    assert w.runtime.breaker.state is BreakerState.HALF_OPEN and w.runtime.breaker.trial_request is None


def test_failed_trial_reopens_with_its_count_request_and_error() -> None:
    cfg = BreakerConfig(failure_threshold=2, open_s=10.0)
    w = worker()
    for rid in ("r1", "r2"):
        breaker_failure(w, rid, ANSWERED_500, 0.0, cfg)
    assert w.runtime.breaker.state is BreakerState.OPEN and w.runtime.breaker.failures == 2
    breaker_pick(w, "trial", 10.0)  # the period is over: half-open, this request is the trial
    assert w.runtime.breaker.state is BreakerState.HALF_OPEN and w.runtime.breaker.open_until is None
    out = breaker_failure(w, "trial", ANSWERED_500, 12.0, cfg)
    (ev,) = out.of_type("breaker")
    assert (ev["to"], ev["reason"], ev["failures"], ev["request_id"], ev["error"]) == (
        "open", REASON_TRIAL_FAILED, 3, "trial", "d answered 500")
    assert w.runtime.breaker.open_until == 22.0


# ---- connectors and dispatch records --------------------------------------------------------------------


def test_plan_handoff_ranks_dp_workers_at_rank_0_by_default() -> None:
    w = worker(dp_size=2)
    w.runtime.engine_id = "eng"
    assert plan_handoff(w, transfer_id="t").remote_engine_id == "eng_dp0"


def test_plan_handoff_keeps_the_connector_when_nothing_is_minted() -> None:
    assert plan_handoff(worker(connector="none")).connector is Connector.NONE
    no_id = plan_handoff(worker())  # Mooncake, no engine id known
    assert (no_id.connector, no_id.mint_skipped, no_id.prefill_params) == (Connector.MOONCAKE,
                                                                           MINT_NO_ENGINE_ID, None)
    d = worker("http://127.0.0.1:8200", "decode")  # a Mooncake worker with no bootstrap port
    d.runtime.engine_id = "eng"
    no_port = plan_handoff(d)
    assert (no_port.connector, no_port.mint_skipped, no_port.transfer_id) == (Connector.MOONCAKE,
                                                                              MINT_NO_BOOTSTRAP_PORT, None)


def test_plan_handoff_brackets_an_ipv6_host() -> None:
    w = worker("http://[::1]:8100")
    w.runtime.engine_id = "eng"
    assert plan_handoff(w, transfer_id="t").remote_bootstrap_addr == "http://[::1]:8998"


def test_sanitize_prefill_body_drops_the_clients_kv_params() -> None:
    out = sanitize_prefill_body({"prompt": "x", "kv_transfer_params": {"evil": True}}, None)
    assert "kv_transfer_params" not in out


def test_pd_record_of_an_unknown_connector() -> None:
    p = worker("grpc://127.0.0.1:50051")  # gRPC PD worker: connector unknown until GetServerInfo
    d = worker("grpc://127.0.0.1:50052", "decode", wid="w2")
    plan = plan_handoff(p)
    assert plan.connector is None
    assert pd_record("r1", p, d, plan, [])["connector"] is None


def test_mint_skipped_counter_carries_the_reason() -> None:
    reg = cluster(connector="mooncake")  # the prefill has no engine id yet
    f = flow(reg)
    leg = first_leg(f)
    assert MetricInc(MINT_SKIPPED_TOTAL, {"reason": MINT_NO_ENGINE_ID}) in leg.effects.metrics
    # The prefill's answer does not count a Mooncake request that was not minted a second time (as NIXL's
    # "no params")
    final = f.on_leg_done(OK, 0.0)
    assert isinstance(final, RunLeg) and final.effects.of_type("mint_skipped") == []


def test_nixl_prefill_without_params_is_recorded_for_its_request() -> None:
    (ev,) = decode_leg(flow(cluster())).effects.of_type("mint_skipped")
    assert (ev["reason"], ev["request_id"]) == (NIXL_NO_PARAMS, "req-1")
    assert HandoffPlan.nixl_relay_problem({"x": 1}) is None


# ---- engine id ------------------------------------------------------------------------------------------


def test_reread_gate_looks_at_the_role_and_the_bugs() -> None:
    regular = worker("http://127.0.0.1:8300", "regular", connector="mooncake")
    assert not reread_due_for(regular, Status.FAILED, HEALTH)
    w = worker()
    w.runtime.engine_id, w.runtime.engine_id_confirmed = "eng", False
    assert reread_due_for(w, Status.READY, HEALTH)
    stale = HealthConfig(failure_threshold=1, success_threshold=1, bugs=frozenset({STALE_ENGINE_ID}))
    assert not reread_due_for(w, Status.READY, stale)


def test_partial_read_clearing_bug_is_an_error_outcome() -> None:
    d = decide_engine_id("old", MetadataRead(ReadOutcome.PARTIAL), frozenset({"partial_read_clears_id"}))
    assert (d.engine_id, d.confirmed, d.previous, d.event_outcome) == (None, False, "old", "error")


def test_a_read_of_dp_size_1_is_learned() -> None:
    w = worker(dp_size=2)
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="e", dp_size=1), 0.0, HEALTH)
    assert w.dp_size == 1


def test_parse_bootstrap_query_takes_rank_0_else_the_first() -> None:
    r = parse_bootstrap_query({"1": {"engine_id": "b"}, "0": {"engine_id": "a"}})
    assert (r.engine_id, r.dp_size) == ("a", 2)
    assert parse_bootstrap_query({"3": {"engine_id": "x"}}).engine_id == "x"


def test_parse_bootstrap_query_no_id_and_single_rank_suffix() -> None:
    r = parse_bootstrap_query({"0": {"worker_addr": {}}})
    assert (r.outcome, r.engine_id, r.dp_size) == (ReadOutcome.COMPLETE, None, 1)
    # One rank: its id is the engine's own, kept whole even when it looks ranked.
    assert parse_bootstrap_query({"0": {"engine_id": "abc_dp0"}}).engine_id == "abc_dp0"


# ---- health tick, probes, identity -------------------------------------------------------------------------


def test_start_tick_goes_on_past_an_expired_probe_that_went_draining() -> None:
    a, b = worker(wid="w1"), worker("http://127.0.0.1:8101", wid="w2")
    for w in (a, b):
        w.runtime.status = Status.READY
        begin_probe(w, 0.0)
    set_draining(a)
    plan = start_tick([a, b], 2 * HEALTH.probe_timeout_s, HEALTH)
    assert plan.expired == (a, b)
    assert b.runtime.probe_in_flight_since is None
    assert [e["worker"] for e in plan.effects.of_type("probe")] == ["w2"]


def test_an_expired_reread_of_an_unconfirmed_id_writes_no_engine_id_record() -> None:
    w = worker()  # Pending, no id: a successful probe is followed by a re-read
    token = begin_probe(w, 0.0)
    assert on_probe_done(w, token, True, 0.1, 0.1, HEALTH).reread_due
    plan = start_tick([w], 2 * HEALTH.probe_timeout_s, HEALTH)
    assert [e["outcome"] for e in plan.effects.of_type("metadata_read")] == ["timeout"]
    assert plan.effects.of_type("engine_id") == []


def test_reread_done_returns_its_decision_and_records_no_unchanged_id() -> None:
    w = worker()
    token = begin_probe(w, 0.0)
    on_probe_done(w, token, True, 0.1, 0.1, HEALTH)
    done = on_reread_done(w, token, MetadataRead(ReadOutcome.ERROR), 0.2, HEALTH)
    assert done.decision is not None and done.decision.event_outcome == "error"
    assert done.effects.of_type("engine_id") == []


def complete(engine_id: str | None, uptime_s: float | None) -> MetadataRead:
    return MetadataRead(ReadOutcome.COMPLETE, engine_id=engine_id, uptime_s=uptime_s)


def identity_ready(uptime: float | None = 100.0, confirmed: bool = True) -> Worker:
    w = ready(worker())
    w.runtime.engine_id, w.runtime.engine_id_confirmed, w.runtime.last_uptime_s = "eng", confirmed, uptime
    return w


def test_identity_check_sees_uptime_going_backwards() -> None:
    w = identity_ready()
    token = begin_identity_check(w, 50.0)
    done = on_identity_done(w, token, complete("eng", 5.0), 50.0)
    assert done.verdict is not None and done.verdict.kind is IdentityKind.UPTIME_BACKWARDS
    (ev,) = done.effects.of_type("engine_id")
    # The read's id takes force (confirmed) although it did not change: a restart is recorded all the same.
    assert (ev["old"], ev["new"], ev["confirmed"], ev["reason"]) == ("eng", "eng", True,
                                                                     "identity check: uptime_backwards")


def test_identity_check_same_engine_writes_no_engine_id_record() -> None:
    w = identity_ready()
    token = begin_identity_check(w, 50.0)
    done = on_identity_done(w, token, complete("eng", 150.0), 50.0)
    assert done.verdict is not None and done.verdict.kind is IdentityKind.SAME
    assert done.effects.of_type("engine_id") == []
    assert MetricInc(METADATA_READS_TOTAL, {"outcome": "identity_same"}) in done.effects.metrics


def test_identity_check_confirming_the_id_is_recorded() -> None:
    w = identity_ready(confirmed=False)
    token = begin_identity_check(w, 50.0)
    done = on_identity_done(w, token, complete("eng", 150.0), 50.0)
    (ev,) = done.effects.of_type("engine_id")
    assert ev == {"worker": "w1", "url": "http://127.0.0.1:8100", "old": "eng", "new": "eng",
                  "confirmed": True, "reason": "identity check"}


def test_identity_check_learning_a_first_id_is_recorded_as_first() -> None:
    w = identity_ready(uptime=None)
    w.runtime.engine_id = None
    token = begin_identity_check(w, 50.0)
    done = on_identity_done(w, token, complete("new", None), 50.0)
    (ev,) = done.effects.of_type("engine_id")
    assert (ev["old"], ev["new"], ev["reason"]) == (None, "new", "identity check: first")


def test_abandon_identity_check_frees_it() -> None:
    w = identity_ready()
    token = begin_identity_check(w, 50.0)
    abandon_identity_check(w, token, 51.0)
    assert w.runtime.identity_in_flight_since is None and w.runtime.last_identity_check_at == 51.0


def test_identity_phase_spans_zero_exclusive_to_one_inclusive() -> None:
    phases = {identity_phase(f"w{i}") for i in range(20000)}
    assert all(0.0 < p <= 1.0 for p in phases)
    assert min(phases) == 0.001 and max(phases) == 1.0


def test_equal_uptime_is_not_a_restart() -> None:
    w = identity_ready()
    assert observe_identity(w.runtime, "eng", 100.0, 1.0).kind is IdentityKind.SAME


def test_a_probe_answers_the_suspicion_raised_when_it_started() -> None:
    w = ready(worker())
    mark_suspect(w, 5.0)
    token = begin_probe(w, 5.0)  # the same tick: a virtual clock gives both the same time
    result = finish_probe(w, token, True, 5.5, HEALTH)
    assert result is not None and result.worker_id == "w1"
    assert w.runtime.suspect_since is None


def test_ready_since_is_the_promotion_time_and_clears_when_not_ready() -> None:
    w = worker()
    w.runtime.engine_id_confirmed = True
    w.runtime.engine_id = "eng"
    finish_probe(w, begin_probe(w, 1.0), True, 1.0, HEALTH)
    assert (w.status, w.runtime.ready_since) == (Status.READY, 1.0)
    finish_probe(w, begin_probe(w, 6.0), True, 6.0, HEALTH)
    assert w.runtime.ready_since == 1.0
    finish_probe(w, begin_probe(w, 11.0), False, 11.0, HEALTH)
    assert (w.status, w.runtime.ready_since) == (Status.NOT_READY, None)
    w2 = ready(worker())
    w2.runtime.ready_since = 3.0
    set_draining(w2)
    assert w2.runtime.ready_since is None


def test_expire_probe_reports_the_worker_and_stamps_the_probe_time() -> None:
    w = ready(worker())
    w.runtime.engine_id, w.runtime.engine_id_confirmed = "eng", True
    begin_probe(w, 0.0)
    expired = expire_probe(w, 2.0, HEALTH)
    assert expired is not None and expired.worker_id == "w1" and expired.probe is not None
    assert w.runtime.last_probe_at == 2.0
    p = worker()
    token = begin_probe(p, 0.0)
    on_probe_done(p, token, True, 0.1, 0.1, HEALTH)
    assert p.runtime.probe_stage is ProbeStage.REREAD
    expired = expire_probe(p, 2.0, HEALTH)
    assert expired is not None and expired.worker_id == "w1" and expired.reread is not None


def test_identity_checks_get_only_the_slots_probes_left() -> None:
    cfg = HealthConfig(failure_threshold=1, success_threshold=1, probe_timeout_s=1.0, interval_s=5.0,
                       max_probes_in_flight=2, identity_check_interval_s=10.0)
    due_probe = [worker(f"http://127.0.0.1:{8100 + i}", wid=f"p{i}") for i in range(2)]
    idents = []
    for i, last in enumerate((40.0, 20.0)):
        w = identity_ready()
        w.id = f"i{i}"
        w.runtime.last_probe_at, w.runtime.last_identity_check_at = 99.0, last
        idents.append(w)
    plan = plan_probes([*due_probe, *idents], 100.0, cfg)
    assert [w.id for w in plan.probe] == ["p0", "p1"] and plan.identity == []
    plan = plan_probes(idents, 100.0, HealthConfig(failure_threshold=1, success_threshold=1, interval_s=5.0,
                                                   max_probes_in_flight=1, identity_check_interval_s=10.0))
    assert [w.id for w in plan.identity] == ["i1"]  # the older identity check first


def test_probe_counters_by_outcome() -> None:
    w = ready(worker())
    w.runtime.engine_id_confirmed = True
    ok = on_probe_done(w, begin_probe(w, 0.0), True, 0.1, 0.1, HEALTH)
    bad = on_probe_done(w, begin_probe(w, 1.0), False, 0.1, 1.1, HEALTH)
    assert ok.effects.metrics == [MetricInc(PROBES_TOTAL, {"outcome": "ok"})]
    assert bad.effects.metrics == [MetricInc(PROBES_TOTAL, {"outcome": "failed"})]


# ---- policies and picking ----------------------------------------------------------------------------------


def many(n: int) -> list[Worker]:
    return [ready(worker(f"http://127.0.0.1:{8100 + i}", wid=f"w{i}")) for i in range(n)]


def picks(policy: Any, ws: list[Worker], n: int = 30) -> list[str]:
    return [policy.select(ws, 0.0).id for _ in range(n)]


def test_power_of_two_keeps_the_first_drawn_on_a_tie() -> None:
    import random

    ws = many(4)
    rng = random.Random(11)
    expected = [rng.sample(ws, 2)[0].id for _ in range(20)]
    assert picks(PowerOfTwo(11), ws, 20) == expected


def test_least_load_spreads_ties_in_order() -> None:
    assert picks(LeastLoad(), many(3), 4) == ["w0", "w1", "w2", "w0"]


def test_make_policy_rejects_a_non_string_name_and_seeds_power_of_two() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy(None)  # type: ignore[arg-type]
    ws = many(6)
    assert picks(make_policy("power_of_two", 5), ws) == picks(make_policy("power_of_two", 5), ws)


def test_leg_policies_are_seeded_per_leg() -> None:
    ws = many(6)
    a, b = LegPolicies.make("random", "random", seed=3), LegPolicies.make("random", "random", seed=3)
    for leg in ("prefill", "decode", "regular"):
        assert picks(getattr(a, leg), ws) == picks(getattr(b, leg), ws)
    c = LegPolicies.make("random", "random", seed=3)
    seqs = [picks(getattr(c, leg), ws) for leg in ("prefill", "decode", "regular")]
    assert len({tuple(s) for s in seqs}) == 3  # each leg draws from its own stream


def test_no_worker_answer_says_whether_breakers_keep_workers_out() -> None:
    assert no_worker_answer(Role.PREFILL).message == "no Ready prefill worker"
    assert no_worker_answer(Role.DECODE, breaker_open=True).message == (
        "no Ready decode worker with a circuit breaker admitting requests")


# ---- retry -----------------------------------------------------------------------------------------------


def test_decide_retry_decisions() -> None:
    ws = many(2)
    delivered = decide_retry(Delivery.MAYBE_SENT, ["w0"], ws, 0.0, 10.0)
    assert delivered == RetryDecision(False, NO_RETRY_DELIVERED)
    assert decide_retry(Delivery.NOT_SENT, ["w0"], ws, 10.0, 10.0) == RetryDecision(False, NO_RETRY_DEADLINE)
    assert decide_retry(Delivery.NOT_SENT, ["w0", "w1"], ws, 0.0, 10.0) == RetryDecision(
        False, NO_RETRY_NO_OTHER_WORKER)
    assert decide_retry(Delivery.NOT_SENT, ["w0"], ws, 0.0, 10.0) == RetryDecision(True, "not_sent", (ws[1],))


def test_mark_suspect_once_and_never_draining() -> None:
    w = ready(worker())
    assert mark_suspect(w, 1.0) and not mark_suspect(w, 2.0)
    assert w.runtime.suspect_since == 1.0
    d = ready(worker())
    set_draining(d)
    assert not mark_suspect(d, 1.0) and d.runtime.suspect_since is None


def test_avoid_suspects() -> None:
    a, b = many(2)
    mark_suspect(a, 1.0)
    assert avoid_suspects([a, b]) == [b]
    assert avoid_suspects([a]) == [a]


# ---- dispatch flow ---------------------------------------------------------------------------------------


def test_refused_requests_hold_no_worker() -> None:
    f = flow(WorkerRegistry(), pd=False)
    answer = f.start(0.0)
    assert isinstance(answer, Answer) and answer.error is not None and answer.idle == ()
    assert (answer.error.status, answer.error.message) == (503, "no Ready regular worker")
    assert f.prefill is None and f.decode is None
    g = flow(cluster(regular=1), pd=False)
    assert isinstance(g.start(0.0), Prepare) and g.prefill is None and g.deadline == math.inf


def test_steps_of_the_other_mode_are_refused() -> None:
    regular = flow(cluster(regular=1), pd=False)
    regular.start(0.0)
    with pytest.raises(RuntimeError, match=r"step not valid in phase prepare \(regular mode\)"):
        regular.on_id_read_waited(0.0)
    pd = flow(cluster())
    pd.start(0.0)
    with pytest.raises(RuntimeError, match=r"req-1: step not valid in phase prepare \(PD mode\)"):
        pd.on_leg_done(OK, 0.0)


def test_regular_mode_takes_a_half_open_trial_and_opens_when_its_leg_ended() -> None:
    cfg = BreakerConfig(failure_threshold=1, open_s=10.0)
    reg = cluster(prefills=0, decodes=0, regular=1)
    (w,) = reg.ready(Role.REGULAR)
    opened(w, until=5.0)
    f = flow(reg, pd=False, breaker=cfg)
    assert isinstance(f.start(7.0), Prepare)
    assert (w.runtime.breaker.state, w.runtime.breaker.trial_request) == (BreakerState.HALF_OPEN, "req-1")
    leg = f.on_prepared(None, 7.5)
    assert isinstance(leg, RunLeg) and leg.timeout_s == LIMITS.request_timeout_s
    assert [e["to"] for e in leg.effects.of_type("breaker")] == ["half_open"]
    answer_leg(f, ANSWERED_500, 8.0)
    assert (w.runtime.breaker.state, w.runtime.breaker.open_until) == (BreakerState.OPEN, 18.0)
    with pytest.raises(RuntimeError):
        f.on_leg_done(OK, 9.0)


def test_pd_breaker_trials_follow_the_request() -> None:
    cfg = BreakerConfig(failure_threshold=1, open_s=10.0)
    reg = cluster(prefills=2)
    p0, _ = reg.ready(Role.PREFILL)
    opened(p0, until=5.0)
    f = flow(reg, breaker=cfg)
    # Round robin starts at p0; its period is over.
    assert isinstance(f.start(7.0), Prepare) and f.prefill is p0
    assert (p0.runtime.breaker.state, p0.runtime.breaker.trial_request) == (BreakerState.HALF_OPEN, "req-1")
    assert isinstance(f.on_prepared(None, 7.0), RunLeg)
    assert isinstance(f.on_leg_done(ANSWERED_500, 8.0), Answer)  # the trial's own failure reopens it
    assert (p0.runtime.breaker.state, p0.runtime.breaker.open_until) == (BreakerState.OPEN, 18.0)


def test_a_retried_prefill_takes_the_trial_of_its_new_worker() -> None:
    cfg = BreakerConfig(failure_threshold=1, open_s=10.0)
    reg2 = WorkerRegistry()
    q0 = ready(reg2.add(make_worker_spec("http://127.0.0.1:8100", "prefill", connector="nixl")))
    q1 = opened(ready(reg2.add(make_worker_spec("http://127.0.0.1:8101", "prefill", connector="nixl"))), 5.0)
    ready(reg2.add(make_worker_spec("http://127.0.0.1:8200", "decode", connector="nixl")))
    q0.runtime.in_flight_requests = 1  # another request still runs on q0
    h = flow(reg2, rid="req-2", breaker=cfg)
    assert first_leg(h, 7.0).worker is q0 and h.prefill is q0
    again = h.on_leg_done(REFUSED, 8.0)  # never reached q0: retried on q1, whose period is over
    assert isinstance(again, RunLeg) and again.worker is q1 and again.idle == ()
    assert (q1.runtime.breaker.state, q1.runtime.breaker.trial_request) == (BreakerState.HALF_OPEN, "req-2")
    h.on_leg_done(LegDone({"remote_engine_id": "x"}), 8.0)  # the trial succeeded
    assert q1.runtime.breaker.state is BreakerState.CLOSED


def test_a_failed_final_leg_opens_the_decode_breaker_at_its_own_time() -> None:
    cfg = BreakerConfig(failure_threshold=1, open_s=10.0)
    reg = cluster()
    f = flow(reg, breaker=cfg)
    decode_leg(f, 0.0, {"remote_engine_id": "x"})
    answer_leg(f, ANSWERED_500, 50.0)
    (d,) = reg.ready(Role.DECODE)
    assert d.runtime.breaker.open_until == 60.0
