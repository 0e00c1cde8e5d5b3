"""The router's bug switches: each is off by default, and each, switched on, changes exactly the decision its
zoo entry names (the correct decision is pinned by the other core tests)."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from helpers.dispatch_steps import OK, decode_leg, effects_of, first_leg, idle_of, of_kind, run

from pdchaos.bugs import list_text
from reference_router.cli import main as router_main
from reference_router.core import (
    LEG_RETRIES_TOTAL,
    Answer,
    Backoff,
    BreakerConfig,
    Counters,
    Delivery,
    DispatchFlow,
    DispatchLimits,
    DispatchStep,
    Effects,
    ErrorAnswer,
    HealthConfig,
    LegError,
    LegPolicies,
    LegResult,
    MetadataRead,
    MetricInc,
    Prepare,
    ReadOutcome,
    Role,
    RunLeg,
    Status,
    Worker,
    WorkerRegistry,
    apply_metadata_read,
    apply_property_update,
    breaker_failure,
    decide_engine_id,
    dispatch_serialized,
    identity_check_eligible,
    make_worker_spec,
    next_status,
    own_failure,
    worker_api_dict,
)
from reference_router.core import bugs as b
from reference_router.core.health_tick import on_probe_done, start_tick
from reference_router.core.retry import REQUEST_ATTEMPTS

LIMITS = DispatchLimits(request_timeout_s=10.0, id_read_wait_s=0.5)
BODY: dict[str, Any] = {"prompt": "x", "max_tokens": 5}
REFUSED = LegError(502, "upstream_error", "connection refused", Delivery.NOT_SENT)
KV_FAILED = LegError(502, "upstream_error", "answered 500: KV load failed: reset", Delivery.ANSWERED,
                     worker_status=500, worker_message="KV load failed: reset")
TIMED_OUT = LegError(504, "upstream_timeout", "decode-0 timed out after 1s")


def _ready(w: Worker, engine_id: str | None = None) -> Worker:
    w.runtime.status = Status.READY
    w.runtime.engine_id = engine_id
    w.runtime.engine_id_confirmed = True
    return w


def _cluster(connector: str = "mooncake", prefills: int = 1, decodes: int = 1,
             bugs: frozenset[str] = frozenset()) -> WorkerRegistry:
    reg = WorkerRegistry(bugs)
    for i in range(prefills):
        _ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8100 + i}", "prefill", connector=connector)),
               f"eng-p{i}")
    for i in range(decodes):
        _ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8200 + i}", "decode", connector=connector)))
    return reg


def _flow(reg: WorkerRegistry, *bugs: str, new_uuid: Any = lambda: uuid.UUID(int=7)) -> DispatchFlow:
    on = frozenset(bugs)
    return DispatchFlow(BODY, reg, LegPolicies.make("round_robin", "round_robin", bugs=on), LIMITS,
                        request_id="req-1", new_uuid=new_uuid, bugs=on)


def _refused(f: DispatchFlow) -> ErrorAnswer:
    """The answer of a request refused at the pick."""
    answer = f.start(0.0)
    assert isinstance(answer, Answer) and answer.before_legs and answer.error is not None
    return answer.error


# ---------------------------------------------------------------- the catalogue


def test_every_zoo_entry_has_a_switch_and_every_switch_says_what_and_where() -> None:
    zoo = {sw.zoo for sw in b.ROUTER_BUGS.values()}
    assert {f"zoo-{n}" for n in range(1, 15)} <= zoo
    for sw in b.ROUTER_BUGS.values():
        assert sw.side == "router" and sw.symptom and sw.reference
        assert set(sw.transports) <= {"http", "grpc"} and set(sw.connectors) <= {"mooncake", "nixl"}


def test_list_bugs_prints_every_switch(capsys: pytest.CaptureFixture[str]) -> None:
    assert router_main(["--list-bugs"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == list_text(b.ROUTER_BUGS.values()).strip()
    for name in b.ROUTER_BUGS:
        assert name in out


def test_unknown_switch_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="nonsense"):
        b.validate_bugs(["nonsense"])
    with pytest.raises(ValueError):
        HealthConfig(bugs=frozenset({"nonsense"}))


# ---------------------------------------------------------------- health and engine id


def test_reread_no_retry_takes_a_failed_read_as_final() -> None:
    err = MetadataRead(ReadOutcome.ERROR)
    assert decide_engine_id("old", err).confirmed is False
    assert decide_engine_id("old", err, frozenset({b.REREAD_NO_RETRY})).confirmed is True


def test_reread_every_probe_leaves_an_id_less_read_unconfirmed() -> None:
    no_id = MetadataRead(ReadOutcome.COMPLETE, engine_id=None)
    assert decide_engine_id("old", no_id).confirmed is True
    assert decide_engine_id("old", no_id, frozenset({b.REREAD_EVERY_PROBE})).confirmed is False


def test_failed_terminal_never_promotes_a_failed_worker() -> None:
    cfg = HealthConfig(failure_threshold=1, success_threshold=1)
    assert next_status(Status.FAILED, Counters(), True, cfg)[0] is Status.READY
    buggy = HealthConfig(failure_threshold=1, success_threshold=1, bugs=frozenset({b.FAILED_TERMINAL}))
    assert next_status(Status.FAILED, Counters(), True, buggy)[0] is Status.FAILED


def test_no_identity_check_makes_no_worker_eligible() -> None:
    w = _ready(Worker.new("w1", make_worker_spec("http://127.0.0.1:8100", "prefill", connector="mooncake")))
    assert identity_check_eligible(w, HealthConfig())
    assert not identity_check_eligible(w, HealthConfig(bugs=frozenset({b.NO_IDENTITY_CHECK})))


def test_api_reports_first_id_shows_the_id_read_first() -> None:
    w = Worker.new("w1", make_worker_spec("http://127.0.0.1:8100", "prefill", connector="mooncake"))
    cfg = HealthConfig()
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="first"), 1.0, cfg)
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="second"), 2.0, cfg)
    assert worker_api_dict(w)["kv_engine_id"] == "second"
    assert worker_api_dict(w, frozenset({b.API_REPORTS_FIRST_ID}))["kv_engine_id"] == "first"


def test_patch_drops_kv_config_loses_connector_and_bootstrap_port() -> None:
    spec = make_worker_spec("http://127.0.0.1:8100", "prefill", connector="mooncake", bootstrap_port=9000)
    kept = apply_property_update(spec, {"priority": 3})
    assert (kept.connector.value, kept.bootstrap_port, kept.priority) == ("mooncake", 9000, 3)
    dropped = apply_property_update(spec, {"priority": 3}, frozenset({b.PATCH_DROPS_KV_CONFIG}))
    assert (dropped.connector.value, dropped.bootstrap_port) == ("none", None)


# ---------------------------------------------------------------- dispatch


def test_no_worker_404_answers_404_instead_of_503() -> None:
    reg = _cluster(prefills=0)
    assert _refused(_flow(reg)).status == 503
    answer = _refused(_flow(_cluster(prefills=0), b.NO_WORKER_404))
    assert (answer.status, answer.code) == (404, "model_not_found")
    assert (answer.message, answer.type) == ("no prefill worker serves this model", "not_found")
    # prefill_on_decode with no decode either: the missing prefill is what the client hears about.
    alone = _refused(_flow(_cluster(prefills=0, decodes=0), b.PREFILL_ON_DECODE, b.NO_WORKER_404))
    assert alone.message == "no prefill worker serves this model"


def test_prefill_on_decode_runs_the_request_on_the_decode_alone() -> None:
    reg = _cluster(prefills=0)
    (d,) = reg.by_role(Role.DECODE)
    f = _flow(reg, b.PREFILL_ON_DECODE)
    prepare = f.start(0.0)
    assert isinstance(prepare, Prepare) and prepare.workers == (d,) and f.pd is False
    leg = f.on_prepared(None, 0.0)  # no prefill leg: the decode's is the only one
    assert isinstance(leg, RunLeg) and leg.final and leg.worker is d
    assert leg.worker.role is Role.DECODE and "kv_transfer_params" not in leg.body
    answer = f.on_leg_done(OK, 0.1)
    assert isinstance(answer, Answer) and answer.error is None and answer.idle == (d,)
    assert _refused(_flow(_cluster(prefills=0))).status == 503  # correct: a prompt 503


def test_no_prefill_retry_fails_a_refused_leg_another_prefill_could_serve() -> None:
    for bugs, retried in (((), True), ((b.NO_PREFILL_RETRY,), False)):
        f = _flow(_cluster(prefills=2), *bugs)
        first_leg(f)
        step = f.on_leg_done(REFUSED, 0.1)
        assert isinstance(step, RunLeg) is retried
        assert (isinstance(step, Answer) and step.error is not None) is not retried


# ---- bugs retry_failed_requests / retry_transport_failures: a failed request runs again whole

BROKEN = LegError(502, "upstream_error", "stream broke", Delivery.MAYBE_SENT)
# What SMG's request retry waits before each attempt after the first (core.retry).
BACKOFFS_S = [0.05, 0.075, 0.1125, 0.16875]


def _counting_uuids() -> Any:
    n = itertools.count(1)
    return lambda: uuid.UUID(int=next(n))


def _failed_decode(error: LegError, *bugs: str) -> DispatchStep:
    """What a flow hands out when its decode leg fails with `error`: an Answer, or (bugs retry_*) a
    Backoff."""
    f = _flow(_cluster(), *bugs)
    decode_leg(f)
    return f.on_leg_done(error, 0.2)


def test_retry_failed_requests_runs_a_failed_leg_again_whole_with_smgs_backoff() -> None:
    correct = _failed_decode(KV_FAILED)  # the correct router answers the failure
    assert isinstance(correct, Answer) and correct.error is not None
    reg = _cluster()
    (p,), (d,) = reg.by_role(Role.PREFILL), reg.by_role(Role.DECODE)
    f = _flow(reg, b.RETRY_FAILED_REQUESTS, new_uuid=_counting_uuids())
    steps = run(f, 0.0, [OK, KV_FAILED] * REQUEST_ATTEMPTS)
    backoffs = of_kind(steps, Backoff)
    assert [s.seconds for s in backoffs] == pytest.approx(BACKOFFS_S)
    # Each attempt is released before its backoff, and picked again whole after it.
    assert [s.idle for s in backoffs] == [(p, d)] * (REQUEST_ATTEMPTS - 1)
    assert [type(s) for s in steps[:6]] == [Prepare, RunLeg, RunLeg, Backoff, Prepare, RunLeg]
    answer = steps[-1]  # five attempts in all: the last failure is answered
    assert isinstance(answer, Answer) and answer.error is not None and answer.error.status == 502
    assert answer.idle == (p, d) and f.attempts == REQUEST_ATTEMPTS
    assert (p.runtime.in_flight_requests, d.runtime.in_flight_requests) == (0, 0)
    # A new request id per attempt (the uuids in between mint each attempt's transfer id).
    ids = ["req-1", *(f"req-{uuid.UUID(int=n).hex}" for n in (2, 4, 6, 8))]
    records = effects_of(steps).of_type("dispatch")
    assert [(r["request_id"], r["outcome"]) for r in records] == [(i, "decode_failed") for i in ids]
    assert f.request_id == ids[-1]
    assert [w for s in backoffs for w in s.effects.warnings] == [
        f"request {rid} failed (502): running it again whole in {secs:.3f} s (attempt {n + 2})"
        for n, (rid, secs) in enumerate(zip(ids[:-1], BACKOFFS_S, strict=True))
    ]


@pytest.mark.parametrize("bug", [b.RETRY_FAILED_REQUESTS, b.RETRY_TRANSPORT_FAILURES])
def test_a_retried_request_that_then_succeeds_is_answered_under_its_last_request_id(bug: str) -> None:
    f = _flow(_cluster(), bug, new_uuid=_counting_uuids())
    steps = run(f, 0.0, [OK, BROKEN, OK, OK])
    assert [s.seconds for s in of_kind(steps, Backoff)] == pytest.approx(BACKOFFS_S[:1])
    answer = steps[-1]
    assert isinstance(answer, Answer) and answer.error is None and f.attempts == 2
    records = effects_of(steps).of_type("dispatch")
    assert [(r["request_id"], r["outcome"]) for r in records] == [
        ("req-1", "decode_failed"), (f"req-{uuid.UUID(int=2).hex}", "ok")]
    assert f.close() == ((), Effects())


@pytest.mark.parametrize("bug", [b.RETRY_FAILED_REQUESTS, b.RETRY_TRANSPORT_FAILURES])
def test_after_a_backoff_the_request_is_picked_again_and_may_be_refused(bug: str) -> None:
    reg = _cluster()
    f = _flow(reg, bug)
    decode_leg(f)
    backoff = f.on_leg_done(BROKEN, 0.2)
    assert isinstance(backoff, Backoff) and backoff.seconds == pytest.approx(0.05)
    with pytest.raises(RuntimeError):
        f.on_leg_done(OK, 0.25)  # no leg is out while it waits
    for w in reg.by_role(Role.PREFILL):
        w.runtime.status = Status.NOT_READY
    answer = f.on_backoff_done(0.25)
    assert isinstance(answer, Answer) and answer.before_legs and answer.error is not None
    assert answer.error.status == 503 and f.attempts == 2
    with pytest.raises(RuntimeError):
        f.on_backoff_done(0.3)


def test_retry_failed_requests_does_not_rerun_a_client_error_a_refusal_or_a_prompt_problem() -> None:
    bad_request = LegError(400, "invalid_request", "bad params", Delivery.ANSWERED, worker_status=400)
    answer = _failed_decode(bad_request, b.RETRY_FAILED_REQUESTS)  # a client error is not transient
    assert isinstance(answer, Answer) and answer.error is not None and answer.error.status == 400
    refused = _flow(_cluster(prefills=0), b.RETRY_FAILED_REQUESTS)
    assert _refused(refused).status == 503 and refused.attempts == 1  # no leg ran
    f = _flow(_cluster(), b.RETRY_FAILED_REQUESTS)
    steps = run(f, 0.0, problem=ErrorAnswer(503, "tokenizer_unavailable", "no tokenizer"))
    assert [type(s) for s in steps] == [Prepare, Answer] and f.attempts == 1


def test_retry_failed_requests_reruns_a_failed_prefill_too() -> None:
    f = _flow(_cluster(), b.RETRY_FAILED_REQUESTS)
    first_leg(f)
    backoff = f.on_leg_done(KV_FAILED, 0.1)
    assert isinstance(backoff, Backoff) and backoff.seconds == pytest.approx(0.05)
    assert [r["outcome"] for r in backoff.effects.of_type("dispatch")] == ["prefill_failed"]


@pytest.mark.parametrize("error", [BROKEN, REFUSED], ids=["broken", "refused"])
def test_retry_transport_failures_reruns_only_decode_legs_the_transport_broke(error: LegError) -> None:
    correct = _failed_decode(error)
    assert isinstance(correct, Answer) and correct.error is not None
    f = _flow(_cluster(), b.RETRY_TRANSPORT_FAILURES)
    steps = run(f, 0.0, [OK, error] * REQUEST_ATTEMPTS)
    assert [s.seconds for s in of_kind(steps, Backoff)] == pytest.approx(BACKOFFS_S)
    assert isinstance(steps[-1], Answer) and f.attempts == REQUEST_ATTEMPTS


def test_retry_transport_failures_answers_the_engines_own_error_and_a_failed_prefill() -> None:
    # The engine's own answer (a failed KV load) is final; the older switch retries it too.
    assert isinstance(_failed_decode(KV_FAILED, b.RETRY_TRANSPORT_FAILURES), Answer)
    retried = _failed_decode(KV_FAILED, b.RETRY_FAILED_REQUESTS)
    assert isinstance(retried, Backoff) and retried.seconds == pytest.approx(0.05)
    f = _flow(_cluster(prefills=1), b.RETRY_TRANSPORT_FAILURES)
    first_leg(f)
    # No other prefill: the request fails, and is answered: only a decode's transport is retried.
    answer = f.on_leg_done(REFUSED, 0.1)
    assert isinstance(answer, Answer) and answer.error is not None and answer.error.status == 502


@pytest.mark.parametrize(
    "legs",
    [(KV_FAILED,), (OK, KV_FAILED), (OK, BROKEN), (OK, REFUSED), (OK, TIMED_OUT)],
    ids=["prefill_500", "decode_kv_failed", "decode_broken", "decode_refused", "decode_timed_out"],
)
def test_the_correct_router_never_backs_off(legs: tuple[LegResult, ...]) -> None:
    reg = _cluster()
    f = _flow(reg)
    steps = run(f, 0.0, legs)
    assert of_kind(steps, Backoff) == [] and f.attempts == 1
    answer = steps[-1]
    assert isinstance(answer, Answer) and answer.error is not None and not answer.as_200
    assert f.request_id == "req-1"
    assert idle_of(steps) == [*reg.by_role(Role.PREFILL), *reg.by_role(Role.DECODE)]


def test_legs_joined_sends_the_decode_after_a_failed_prefill() -> None:
    f = _flow(_cluster(), b.LEGS_JOINED)
    first_leg(f)
    leg = f.on_leg_done(LegError(502, "upstream_error", "answered 500"), 0.1)
    assert isinstance(leg, RunLeg) and leg.final and leg.idle == ()
    assert leg.worker.role is Role.DECODE and leg.worker is f.decode
    assert leg.body["kv_transfer_params"]["do_remote_prefill"] is True
    correct = _flow(_cluster())
    first_leg(correct)
    answer = correct.on_leg_done(LegError(502, "upstream_error", "answered 500"), 0.1)
    assert isinstance(answer, Answer) and answer.error is not None


def test_nixl_not_relayed_drops_the_prefill_params() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_host": "h", "remote_port": 1}
    for bugs, relayed in (((), True), ((b.NIXL_NOT_RELAYED,), False)):
        final = decode_leg(_flow(_cluster("nixl"), *bugs), 0.0, params)
        assert ("kv_transfer_params" in final.body) is relayed


def test_no_request_timeout_gives_legs_no_real_deadline() -> None:
    f = _flow(_cluster(), b.NO_REQUEST_TIMEOUT)
    assert first_leg(f).timeout_s > 1e5
    final = f.on_leg_done(OK, 0.0)
    assert isinstance(final, RunLeg) and final.timeout_s > 1e5
    assert first_leg(_flow(_cluster())).timeout_s == 10.0


def test_error_as_200_and_wedged_stalls_all_are_asked_of_the_shells() -> None:
    masked = run(_flow(_cluster(), b.ERROR_AS_200), 0.0, [OK, KV_FAILED])[-1]
    assert isinstance(masked, Answer) and masked.error is not None and masked.as_200
    answered = run(_flow(_cluster()), 0.0, [OK, KV_FAILED])[-1]
    assert isinstance(answered, Answer) and answered.error is not None and not answered.as_200
    assert dispatch_serialized(frozenset({b.WEDGED_STALLS_ALL})) and not dispatch_serialized(frozenset())


@pytest.mark.parametrize(
    ("prefills", "legs", "problem"),
    [
        (0, (), None),  # refused at the pick
        (1, (), ErrorAnswer(400, "invalid_request", "prompt too long")),
        (1, (KV_FAILED,), None),
        (1, (OK, TIMED_OUT), None),
    ],
    ids=["refused_at_pick", "prepare_problem", "prefill_failed", "decode_failed"],
)
def test_error_as_200_marks_every_error_answer_and_no_success(
    prefills: int, legs: tuple[LegResult, ...], problem: ErrorAnswer | None
) -> None:
    for bugs, as_200 in (((b.ERROR_AS_200,), True), ((), False)):
        answer = run(_flow(_cluster(prefills=prefills), *bugs), 0.0, legs, problem=problem)[-1]
        assert isinstance(answer, Answer) and answer.error is not None and answer.as_200 is as_200
    ok = run(_flow(_cluster(), b.ERROR_AS_200), 0.0, [OK, OK])[-1]
    assert isinstance(ok, Answer) and ok.error is None and not ok.as_200


def test_shared_policy_uses_one_cursor_for_both_legs() -> None:
    own = LegPolicies.make("round_robin", "round_robin")
    assert own.prefill is not own.decode
    shared = LegPolicies.make("round_robin", "round_robin", bugs=frozenset({b.SHARED_POLICY}))
    assert shared.prefill is shared.decode
    reg = _cluster(prefills=1, decodes=2)
    decodes = set()
    for i in range(6):
        f = DispatchFlow(BODY, reg, shared, LIMITS, request_id=f"r{i}")
        assert isinstance(f.start(0.0), Prepare) and f.decode is not None
        decodes.add(f.decode.id)
        f.close()
    assert len(decodes) == 1  # every other worker: the second decode never gets a request


# ---------------------------------------------------------------- circuit breaker


def _decode() -> Worker:
    return _ready(Worker.new("d", make_worker_spec("http://127.0.0.1:8200", "decode", connector="nixl")))


def test_breaker_charges_kv_failure_counts_a_decode_kv_load_failure() -> None:
    assert own_failure(_decode(), KV_FAILED) is False
    assert own_failure(_decode(), KV_FAILED, frozenset({b.BREAKER_CHARGES_KV_FAILURE})) is True
    w = _decode()
    cfg = BreakerConfig(1, 5.0, frozenset({b.BREAKER_CHARGES_KV_FAILURE}))
    assert breaker_failure(w, "r", KV_FAILED, 0.0, cfg).of_type("breaker")
    assert w.runtime.breaker.state.value == "open"


def test_no_outlier_ejection_does_not_count_timeouts() -> None:
    assert own_failure(_decode(), TIMED_OUT) is True
    assert own_failure(_decode(), TIMED_OUT, frozenset({b.NO_OUTLIER_EJECTION})) is False


def test_breaker_no_readmit_keeps_a_recovered_worker_out() -> None:
    for bugs, closed in (((), True), ((b.BREAKER_NO_READMIT,), False)):
        cfg = HealthConfig(failure_threshold=1, success_threshold=1, interval_s=1.0, probe_timeout_s=0.5,
                           bugs=frozenset(bugs))
        w = _decode()
        breaker_failure(w, "r", TIMED_OUT, 0.0, BreakerConfig(1, 60.0))
        w.runtime.status = Status.FAILED
        plan = start_tick([w], 10.0, cfg)
        (probe,) = plan.probes
        done = on_probe_done(w, probe.token, True, 0.01, 10.0, cfg)
        assert w.status is Status.READY
        assert (w.runtime.breaker.state.value == "closed") is closed
        assert bool(done.effects.of_type("breaker")) is closed


# ---------------------------------------------------------------- what a switched-on decision records
# (mutation testing showed these fields unpinned: a zoo run reads them as its evidence)


@pytest.mark.parametrize(
    ("bug", "read", "want"),
    [
        (b.REREAD_EVERY_PROBE, MetadataRead(ReadOutcome.COMPLETE), ("old", False, "old", "no_id")),
        (b.PARTIAL_READ_CLEARS_ID, MetadataRead(ReadOutcome.PARTIAL), (None, False, "old", "error")),
        (b.REREAD_NO_RETRY, MetadataRead(ReadOutcome.ERROR), ("old", True, "old", "error")),
        (b.REREAD_NO_RETRY, MetadataRead(ReadOutcome.TIMEOUT), ("old", True, "old", "timeout")),
    ],
)
def test_an_injected_engine_id_decision_is_whole_and_says_it_is_injected(
    bug: str, read: MetadataRead, want: tuple[str | None, bool, str, str]
) -> None:
    d = decide_engine_id("old", read, frozenset({bug}))
    assert (d.engine_id, d.confirmed, d.previous, d.event_outcome) == want
    assert d.reason.endswith("(injected bug)")
    assert decide_engine_id("old", read).reason != d.reason


def test_no_prefill_retry_counts_the_refused_leg_as_having_no_other_worker() -> None:
    f = _flow(_cluster(prefills=2), b.NO_PREFILL_RETRY)
    first_leg(f)
    failed = f.on_leg_done(REFUSED, 0.1)
    assert isinstance(failed, Answer)
    assert MetricInc(LEG_RETRIES_TOTAL, {"leg": "prefill", "outcome": "no_other_ready_worker"}) in (
        failed.effects.metrics
    )
    assert f.failed_delivery is Delivery.NOT_SENT


def test_legs_joined_hands_the_failed_prefills_effects_to_the_decode_leg() -> None:
    f = _flow(_cluster(), b.LEGS_JOINED)
    first_leg(f)
    leg = f.on_leg_done(REFUSED, 0.1)
    assert isinstance(leg, RunLeg) and leg.final
    # The refused leg's own evidence (its worker is suspect) travels with the decode leg's effects; the
    # failure is not answered (no dispatch record).
    suspects = leg.effects.of_type("worker_suspect")
    assert [e["error"] for e in suspects] == ["connection refused"]
    assert MetricInc(LEG_RETRIES_TOTAL, {"leg": "prefill", "outcome": "no_other_ready_worker"}) in (
        leg.effects.metrics
    )
    assert leg.effects.of_type("dispatch") == []


def test_a_retried_prefill_leg_warns_naming_both_workers() -> None:
    reg = _cluster(prefills=2)
    p0, p1 = reg.by_role(Role.PREFILL)
    f = _flow(reg)
    first_leg(f)
    again = f.on_leg_done(REFUSED, 0.1)
    assert isinstance(again, RunLeg) and again.worker is p1
    assert again.effects.warnings == [
        f"prefill leg to {p0.id} never reached it (connection refused): retrying on {p1.id}"
    ]
