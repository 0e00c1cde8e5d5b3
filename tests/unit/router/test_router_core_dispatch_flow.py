"""core.dispatch_flow driven with scripted leg results on a virtual clock: which leg runs where, with which
body and deadline, and what the request tells (CONTRACTS §2 `dispatch`, `mint_skipped`, `worker_suspect`);
the steps it hands out, and that a result for a step it did not hand out is refused."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from helpers.dispatch_steps import OK, answer_leg, decode_leg, first_leg, of_kind, run

from reference_router.core import (
    DISPATCHES_TOTAL,
    LEG_RETRIES_TOTAL,
    Answer,
    AwaitIdRead,
    Backoff,
    BreakerConfig,
    BreakerState,
    Delivery,
    DispatchFlow,
    DispatchLimits,
    DispatchStep,
    Effects,
    ErrorAnswer,
    LegDone,
    LegError,
    LegPolicies,
    LegResult,
    MetricInc,
    Prepare,
    ProbeStage,
    Role,
    RunLeg,
    Status,
    Worker,
    WorkerRegistry,
    make_worker_spec,
)

LIMITS = DispatchLimits(request_timeout_s=10.0, id_read_wait_s=0.5)
BODY: dict[str, Any] = {"prompt": "x", "max_tokens": 5, "stream": True, "min_tokens": 2}
TID = "xfer-" + uuid.UUID(int=7).hex
REFUSED = LegError(502, "upstream_error", "connection refused", Delivery.NOT_SENT)


def ready(w: Worker, engine_id: str | None) -> Worker:
    w.runtime.status = Status.READY
    w.runtime.engine_id = engine_id
    w.runtime.engine_id_confirmed = True
    return w


def cluster(connector: str = "mooncake", prefills: int = 2, decodes: int = 1) -> WorkerRegistry:
    reg = WorkerRegistry()
    for i in range(prefills):
        spec = make_worker_spec(f"http://127.0.0.1:{8100 + i}", "prefill", connector=connector)
        ready(reg.add(spec), f"eng-p{i}")
    for i in range(decodes):
        ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8200 + i}", "decode", connector=connector)), None)
    return reg


def flow(reg: WorkerRegistry, pd: bool = True, policies: LegPolicies | None = None) -> DispatchFlow:
    policies = policies or LegPolicies.make("round_robin", "round_robin")
    return DispatchFlow(BODY, reg, policies, LIMITS, pd=pd, request_id="req-1",
                        new_uuid=lambda: uuid.UUID(int=7))


def roles(reg: WorkerRegistry) -> tuple[list[Worker], list[Worker]]:
    return reg.by_role(Role.PREFILL), reg.by_role(Role.DECODE)


def test_prefill_leg_refused_before_sending_runs_again_on_the_other_ready_prefill() -> None:
    reg = cluster()
    (p0, p1), (d,) = roles(reg)
    f = flow(reg)
    prepare = f.start(0.0)
    assert isinstance(prepare, Prepare) and prepare.workers == (p0, d) and prepare.idle == ()
    assert (f.prefill, f.decode) == (p0, d)
    leg = f.on_prepared(None, 0.0)  # the id read has settled: no wait
    assert isinstance(leg, RunLeg) and not leg.final
    assert leg.worker is p0 and leg.timeout_s == 10.0
    assert leg.body == {"prompt": "x", "max_tokens": 1, "stream": False, "n": 1, "ignore_eos": True,
                        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                               "transfer_id": TID}}

    again = f.on_leg_done(REFUSED, 0.25)
    assert isinstance(again, RunLeg) and not again.final
    assert again.worker is p1 and again.timeout_s == pytest.approx(9.75)  # the request's deadline, shared
    assert again.effects.of_type("worker_suspect") == [
        {"worker": p0.id, "url": p0.spec.url, "error": "connection refused"}
    ]
    assert again.effects.metrics == [MetricInc(LEG_RETRIES_TOTAL, {"leg": "prefill", "outcome": "retried"})]
    assert again.effects.of_type("dispatch") == []
    assert p0.runtime.suspect_since == 0.25  # probed at once by the next tick
    assert again.idle == (p0,) and p0.runtime.in_flight_requests == 0
    assert (p1.runtime.in_flight_requests, d.runtime.in_flight_requests) == (1, 1)

    final = f.on_leg_done(LegDone(None), 0.5)
    assert isinstance(final, RunLeg) and final.final and final.idle == ()
    assert final.worker is d and final.timeout_s == 10.0
    assert final.body == {**BODY, "kv_transfer_params": {
        "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": TID,
        "remote_engine_id": "eng-p1", "remote_bootstrap_addr": "http://127.0.0.1:8998"}}
    done = answer_leg(f, OK, 0.6)
    assert done.error is None and not done.before_legs and not done.as_200
    assert done.effects.of_type("dispatch") == [{
        "request_id": "req-1", "prefill": p1.id, "decode": d.id, "prefill_url": p1.spec.url,
        "decode_url": d.spec.url, "connector": "mooncake", "transfer_id": TID, "remote_engine_id": "eng-p1",
        "retried_from": [p0.id], "status": 200, "outcome": "ok", "error": None,
    }]
    assert done.idle == (p1, d)  # released in the order they served
    assert f.close() == ((), Effects())  # once only
    assert [w.runtime.in_flight_requests for w in (p0, p1, d)] == [0, 0, 0]


def test_bug_no_suspect_probe_retries_the_refused_leg_but_neither_probes_nor_avoids_its_worker() -> None:
    reg = cluster()
    (p0, p1), _ = roles(reg)
    f = DispatchFlow(BODY, reg, LegPolicies.make("round_robin", "round_robin"), LIMITS, request_id="req-1",
                     new_uuid=lambda: uuid.UUID(int=7), bugs=frozenset({"no_suspect_probe"}))
    assert first_leg(f).worker is p0
    again = f.on_leg_done(REFUSED, 0.25)
    assert isinstance(again, RunLeg) and again.worker is p1  # the retry itself is unchanged
    assert again.effects.of_type("worker_suspect") == [] and p0.runtime.suspect_since is None


def test_prefill_500_is_answered_at_once_with_no_decode_leg() -> None:
    reg = cluster(connector="nixl")
    (p0, _), (d,) = roles(reg)
    f = flow(reg)
    first_leg(f)
    failed = f.on_leg_done(LegError(502, "upstream_error", "p0 answered 500", Delivery.ANSWERED), 0.1)
    assert isinstance(failed, Answer) and not failed.before_legs
    assert failed.error == ErrorAnswer(502, "upstream_error", "prefill leg failed: p0 answered 500")
    (record,) = failed.effects.of_type("dispatch")
    assert (record["prefill"], record["status"], record["outcome"], record["error"]) == (
        p0.id, 502, "prefill_failed", "p0 answered 500")
    assert "retried_from" not in record
    # The engine saw the request: no suspicion, no retry counted, and no decode leg may follow.
    assert failed.effects.of_type("worker_suspect") == [] and p0.runtime.suspect_since is None
    assert failed.effects.metrics == [MetricInc(DISPATCHES_TOTAL, {"connector": "nixl",
                                                                   "outcome": "prefill_failed"})]
    with pytest.raises(RuntimeError):
        f.on_leg_done(LegDone({"remote_engine_id": "x"}), 0.2)
    assert failed.idle == (p0, d) and f.close() == ((), Effects())
    assert (p0.runtime.in_flight_requests, d.runtime.in_flight_requests) == (0, 0)


@pytest.mark.parametrize(("down", "message"), [("decode", "no Ready decode worker"),
                                               ("prefill", "no Ready prefill worker")])
def test_no_ready_worker_for_a_leg_is_503_before_any_leg(down: str, message: str) -> None:
    reg = cluster()
    for w in reg.by_role(Role(down)):
        w.runtime.status = Status.NOT_READY
    f = flow(reg)
    refused = f.start(0.0)
    assert isinstance(refused, Answer) and refused.before_legs
    assert refused.error == ErrorAnswer(503, "no_available_workers", message, "service_unavailable")
    assert all(w.runtime.in_flight_requests == 0 for w in reg.all())
    with pytest.raises(RuntimeError):
        f.on_prepared(None, 0.0)
    assert refused.idle == () and f.close() == ((), Effects())


@pytest.mark.parametrize(("now", "reason"), [(1.0, "no_other_ready_worker"), (10.0, "deadline_passed")])
def test_refused_leg_that_cannot_run_elsewhere_fails_and_says_why(now: float, reason: str) -> None:
    reg = cluster(prefills=1 if reason == "no_other_ready_worker" else 2)
    f = flow(reg)
    first_leg(f)
    failed = f.on_leg_done(REFUSED, now)
    assert isinstance(failed, Answer) and failed.error is not None and failed.error.status == 502
    assert MetricInc(LEG_RETRIES_TOTAL, {"leg": "prefill", "outcome": reason}) in failed.effects.metrics
    assert [e["outcome"] for e in failed.effects.of_type("dispatch")] == ["prefill_failed"]


def test_prefill_whose_id_reread_is_running_is_avoided_or_waited_for() -> None:
    reg = cluster()
    (p0, p1), _ = roles(reg)
    p0.runtime.probe_stage = ProbeStage.REREAD
    f = flow(reg)
    assert first_leg(f).worker is p1 and f.prefill is p1  # a settled one is preferred: no wait
    p1.runtime.probe_stage = ProbeStage.REREAD
    g = flow(reg)
    assert isinstance(g.start(0.0), Prepare)
    assert g.prefill in (p0, p1)
    wait = g.on_prepared(None, 0.0)
    assert wait == AwaitIdRead(LIMITS.id_read_wait_s) and not g.id_read_settled()
    with pytest.raises(RuntimeError):
        g.on_leg_done(OK, 0.1)  # no leg is out while the read runs
    # The read ends with a new id: the handoff is minted after it, with that id.
    assert g.prefill is not None
    g.prefill.runtime.probe_stage = None
    g.prefill.runtime.engine_id = "after-restart"
    assert g.id_read_settled()
    leg = g.on_id_read_waited(0.3)
    assert isinstance(leg, RunLeg) and leg.worker is g.prefill and leg.timeout_s == pytest.approx(9.7)
    final = g.on_leg_done(OK, 0.4)
    assert isinstance(final, RunLeg)
    assert final.body["kv_transfer_params"]["remote_engine_id"] == "after-restart"


def test_nixl_relays_the_prefill_params_verbatim_or_says_it_could_not() -> None:
    reg = cluster(connector="nixl")
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1, 2]}
    f = flow(reg)
    assert first_leg(f).body["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    final = f.on_leg_done(LegDone(params), 0.0)
    assert isinstance(final, RunLeg)
    assert final.body["kv_transfer_params"] == params and final.effects.events == []
    bare = decode_leg(flow(reg))
    assert "kv_transfer_params" not in bare.body
    assert [e["reason"] for e in bare.effects.of_type("mint_skipped")] == [
        "prefill_returned_no_kv_transfer_params"]


def test_mooncake_prefill_without_an_engine_id_is_not_minted() -> None:
    reg = cluster(prefills=1)
    (p0,), _ = roles(reg)
    p0.runtime.engine_id = None
    f = flow(reg)
    leg = first_leg(f)
    assert "kv_transfer_params" not in leg.body
    assert leg.effects.of_type("mint_skipped") == [
        {"reason": "no_engine_id", "request_id": "req-1", "worker": p0.id, "url": p0.spec.url}
    ]
    final = f.on_leg_done(OK, 0.0)
    assert isinstance(final, RunLeg) and "kv_transfer_params" not in final.body
    (record,) = answer_leg(f, OK).effects.of_type("dispatch")
    assert (record["transfer_id"], record["remote_engine_id"]) == (None, None)


@pytest.mark.parametrize(("after_headers", "status", "outcome", "answered"),
                         [(False, 504, "decode_failed", True), (True, 200, "decode_stream_failed", False)])
def test_decode_failure_before_or_after_the_stream_began(
    after_headers: bool, status: int, outcome: str, answered: bool
) -> None:
    reg = cluster()
    f = flow(reg)
    decode_leg(f)
    done = answer_leg(f, LegError(504, "upstream_timeout", "decode overran"), after_headers=after_headers)
    (record,) = done.effects.of_type("dispatch")
    assert (record["status"], record["outcome"], record["error"]) == (status, outcome, "decode overran")
    expected = ErrorAnswer(504, "upstream_timeout", "decode leg failed: decode overran") if answered else None
    assert done.error == expected and not done.before_legs
    assert done.idle == (f.prefill, f.decode) and all(w.runtime.in_flight_requests == 0 for w in reg.all())


def test_regular_mode_runs_one_leg_and_records_it() -> None:
    reg = WorkerRegistry()
    w = ready(reg.add(make_worker_spec("http://127.0.0.1:8300", "regular")), None)
    f = flow(reg, pd=False)
    prepare = f.start(0.0)
    assert isinstance(prepare, Prepare) and prepare.workers == (w,)
    with pytest.raises(RuntimeError):
        f.on_id_read_waited(0.0)
    leg = f.on_prepared(None, 0.0)
    assert isinstance(leg, RunLeg) and leg.final and leg.timeout_s == 10.0
    assert leg.worker is w and leg.body == BODY and leg.body is not BODY
    done = answer_leg(f, OK)
    assert done.effects.of_type("dispatch") == [{
        "request_id": "req-1", "prefill": None, "decode": w.id, "decode_url": w.spec.url, "connector": None,
        "transfer_id": None, "remote_engine_id": None, "status": 200, "outcome": "ok", "error": None,
    }]
    assert done.idle == (w,) and w.runtime.in_flight_requests == 0


def test_each_leg_has_its_own_round_robin_cursor() -> None:
    reg = cluster(prefills=2, decodes=2)
    (p0, p1), (d0, d1) = roles(reg)
    policies = LegPolicies.make("round_robin", "round_robin")
    chosen = []
    for _ in range(4):
        f = flow(reg, policies=policies)
        f.start(0.0)
        chosen.append((f.prefill, f.decode))
        f.close()
    assert chosen == [(p0, d0), (p1, d1), (p0, d0), (p1, d1)]


def test_a_draining_worker_is_reported_idle_when_its_last_request_ends() -> None:
    reg = cluster(prefills=1)
    (p0,), (d,) = roles(reg)
    first, second = flow(reg), flow(reg)
    first.start(0.0)
    second.start(0.0)
    p0.runtime.status = Status.DRAINING
    assert first.close() == ((), Effects())
    assert second.close() == ((p0, d), Effects())



# ---- the steps' order: a result for a step not handed out is refused ---------------------------------------

# Every result call, with arguments any step would take; `start` too, which may be called once only.
RESULTS: dict[str, Callable[[DispatchFlow], DispatchStep]] = {
    "start": lambda f: f.start(1.0),
    "on_prepared": lambda f: f.on_prepared(None, 1.0),
    "on_id_read_waited": lambda f: f.on_id_read_waited(1.0),
    "on_leg_done": lambda f: f.on_leg_done(OK, 1.0),
    "on_backoff_done": lambda f: f.on_backoff_done(1.0),
}


def _new(f: DispatchFlow, reg: WorkerRegistry) -> None:
    pass


def _prepared(f: DispatchFlow, reg: WorkerRegistry) -> None:
    assert isinstance(f.start(0.0), Prepare)


def _awaiting_id_read(f: DispatchFlow, reg: WorkerRegistry) -> None:
    for w in reg.by_role(Role.PREFILL):
        w.runtime.probe_stage = ProbeStage.REREAD
    assert isinstance(f.start(0.0), Prepare)
    assert isinstance(f.on_prepared(None, 0.0), AwaitIdRead)


def _prefill_out(f: DispatchFlow, reg: WorkerRegistry) -> None:
    first_leg(f)


def _decode_out(f: DispatchFlow, reg: WorkerRegistry) -> None:
    decode_leg(f)


def _answered(f: DispatchFlow, reg: WorkerRegistry) -> None:
    decode_leg(f)
    answer_leg(f, OK)


def _refused_at_pick(f: DispatchFlow, reg: WorkerRegistry) -> None:
    for w in reg.by_role(Role.PREFILL):
        w.runtime.status = Status.NOT_READY
    assert isinstance(f.start(0.0), Answer)


def _closed_mid_request(f: DispatchFlow, reg: WorkerRegistry) -> None:
    first_leg(f)
    f.close()


Reach = Callable[[DispatchFlow, WorkerRegistry], None]
# How far the request got, and the one result it still takes.
PHASES: list[tuple[Reach, str | None]] = [
    (_new, "start"),
    (_prepared, "on_prepared"),
    (_awaiting_id_read, "on_id_read_waited"),
    (_prefill_out, "on_leg_done"),
    (_decode_out, "on_leg_done"),
    (_answered, None),
    (_refused_at_pick, None),
    (_closed_mid_request, None),
]


@pytest.mark.parametrize(("reach", "valid"), PHASES, ids=[r.__name__.lstrip("_") for r, _ in PHASES])
def test_a_result_for_a_step_not_handed_out_is_refused_and_changes_nothing(
    reach: Reach, valid: str | None
) -> None:
    reg = cluster()
    f = flow(reg)
    reach(f, reg)
    held = [w.runtime.in_flight_requests for w in reg.all()]
    state = (f.request_id, f.prefill, f.decode, f.attempts, list(f.retried_from))
    for name, call in RESULTS.items():
        if name == valid:
            continue
        with pytest.raises(RuntimeError, match="req-1: step not valid in phase"):
            call(f)
        assert [w.runtime.in_flight_requests for w in reg.all()] == held, name
        assert (f.request_id, f.prefill, f.decode, f.attempts, list(f.retried_from)) == state, name
    if valid is not None:  # the result it waits for is still taken
        RESULTS[valid](f)


# ---- close, a prompt that cannot be had, the refusal before any leg ---------------------------------------


def _half_open_decode(reg: WorkerRegistry) -> Worker:
    (d,) = reg.by_role(Role.DECODE)
    b = d.runtime.breaker
    b.state, b.open_until, b.trial_request = BreakerState.OPEN, 5.0, None
    return d


@pytest.mark.parametrize("reach", [_prepared, _awaiting_id_read, _prefill_out, _decode_out],
                         ids=["prepared", "awaiting_id_read", "prefill_out", "decode_out"])
def test_close_mid_request_lets_go_of_the_workers_once(reach: Reach) -> None:
    reg = cluster(prefills=1)
    (p0,), (d,) = roles(reg)
    f = flow(reg)
    reach(f, reg)
    assert (p0.runtime.in_flight_requests, d.runtime.in_flight_requests) == (1, 1)
    assert f.close() == ((p0, d), Effects())  # no leg ended: no dispatch record
    assert (p0.runtime.in_flight_requests, d.runtime.in_flight_requests) == (0, 0)
    assert f.close() == ((), Effects())
    assert (p0.runtime.in_flight_requests, d.runtime.in_flight_requests) == (0, 0)


def test_close_before_the_first_leg_hands_out_what_the_pick_changed_and_frees_the_trial() -> None:
    reg = cluster(prefills=1)
    (p0,), _ = roles(reg)
    d = _half_open_decode(reg)
    p0.runtime.in_flight_requests = 1  # another request still runs on the prefill
    f = DispatchFlow(BODY, reg, LegPolicies.make("round_robin", "round_robin"), LIMITS, request_id="req-1",
                     breaker=BreakerConfig(failure_threshold=1, open_s=10.0))
    prepare = f.start(7.0)
    assert isinstance(prepare, Prepare) and prepare.effects == Effects()  # rides on the first leg's
    assert (d.runtime.breaker.state, d.runtime.breaker.trial_request) == (BreakerState.HALF_OPEN, "req-1")
    idle, effects = f.close()
    assert idle == (d,)  # the prefill still counts the other request
    assert [(e["from"], e["to"]) for e in effects.of_type("breaker")] == [("open", "half_open")]
    assert d.runtime.breaker.trial_request is None and p0.runtime.in_flight_requests == 1
    assert d.runtime.in_flight_requests == 0 and f.close() == ((), Effects())


@pytest.mark.parametrize("pd", [True, False])
def test_a_prepare_problem_is_answered_with_no_leg_and_the_workers_released(pd: bool) -> None:
    reg = cluster(prefills=1)
    if not pd:
        ready(reg.add(make_worker_spec("http://127.0.0.1:8300", "regular")), None)
    too_long = ErrorAnswer(400, "invalid_request", "prompt too long", "invalid_request_error")
    f = flow(reg, pd=pd)
    prepare = f.start(0.0)
    assert isinstance(prepare, Prepare)
    answer = f.on_prepared(too_long, 0.0)
    assert isinstance(answer, Answer) and answer.error is too_long
    assert not answer.before_legs and not answer.as_200
    assert answer.idle == prepare.workers and all(w.runtime.in_flight_requests == 0 for w in reg.all())
    assert answer.effects == Effects()  # no leg ran: no dispatch record
    assert f.failed_delivery is None and not f.final_leg_failed
    assert f.close() == ((), Effects())
    with pytest.raises(RuntimeError):
        f.on_leg_done(OK, 0.1)


def test_a_prepare_problem_answer_carries_what_the_pick_changed() -> None:
    reg = cluster(prefills=1)
    d = _half_open_decode(reg)
    f = DispatchFlow(BODY, reg, LegPolicies.make("round_robin", "round_robin"), LIMITS, request_id="req-1",
                     breaker=BreakerConfig(failure_threshold=1, open_s=10.0))
    assert isinstance(f.start(7.0), Prepare)
    answer = f.on_prepared(ErrorAnswer(400, "invalid_request", "no tokenizer"), 7.0)
    assert isinstance(answer, Answer)
    assert [(e["from"], e["to"]) for e in answer.effects.of_type("breaker")] == [("open", "half_open")]
    assert d.runtime.breaker.trial_request is None  # the trial goes to the next request


BROKEN = LegError(502, "upstream_error", "stream broke", Delivery.MAYBE_SENT)
ANSWERED_500 = LegError(502, "upstream_error", "answered 500", Delivery.ANSWERED)


@pytest.mark.parametrize(
    ("legs", "problem", "before_legs"),
    [
        ((), None, True),  # no Ready prefill: refused at the pick
        ((), ErrorAnswer(400, "invalid_request", "prompt too long"), False),
        ((ANSWERED_500,), None, False),
        ((OK, BROKEN), None, False),
        ((OK, OK), None, False),
    ],
    ids=["refused_at_pick", "prepare_problem", "prefill_failed", "decode_failed", "ok"],
)
def test_before_legs_only_for_a_refusal_at_the_pick(
    legs: tuple[LegResult, ...], problem: ErrorAnswer | None, before_legs: bool
) -> None:
    reg = cluster(prefills=1)
    if before_legs:
        for w in reg.by_role(Role.PREFILL):
            w.runtime.status = Status.NOT_READY
    steps = run(flow(reg), 0.0, legs, problem=problem)
    answer = steps[-1]
    assert isinstance(answer, Answer) and answer.before_legs is before_legs
    assert (len(steps) == 1) is before_legs  # a refusal is the first step: nothing to prepare
    assert not of_kind(steps, Backoff)
