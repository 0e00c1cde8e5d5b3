"""core.dispatch_flow driven with scripted leg results on a virtual clock: which leg runs where, with which
body and deadline, and what the request tells (CONTRACTS §2 `dispatch`, `mint_skipped`, `worker_suspect`)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reference_router.core import (
    DISPATCHES_TOTAL,
    LEG_RETRIES_TOTAL,
    Delivery,
    DispatchFlow,
    DispatchLimits,
    ErrorAnswer,
    LegError,
    LegPolicies,
    MetricInc,
    ProbeStage,
    Role,
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
    return DispatchFlow("req-1", BODY, reg, policies, LIMITS, pd=pd, new_uuid=lambda: uuid.UUID(int=7))


def roles(reg: WorkerRegistry) -> tuple[list[Worker], list[Worker]]:
    return reg.by_role(Role.PREFILL), reg.by_role(Role.DECODE)


def test_prefill_leg_refused_before_sending_runs_again_on_the_other_ready_prefill() -> None:
    reg = cluster()
    (p0, p1), (d,) = roles(reg)
    f = flow(reg)
    assert f.pick(0.0) is None
    assert (f.prefill, f.decode) == (p0, d)
    assert f.id_read_wait_s() == 0.0
    leg = f.prefill_leg(0.0)
    assert leg.worker is p0 and leg.timeout_s == 10.0
    assert leg.body == {"prompt": "x", "max_tokens": 1, "stream": False, "n": 1,
                        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                               "transfer_id": TID}}

    failed = f.prefill_failed(REFUSED, 0.25)
    assert failed.retry_on is p1 and failed.answer is None
    assert failed.effects.of_type("worker_suspect") == [
        {"worker": p0.id, "url": p0.spec.url, "error": "connection refused"}
    ]
    assert failed.effects.metrics == [MetricInc(LEG_RETRIES_TOTAL, {"leg": "prefill", "outcome": "retried"})]
    assert failed.effects.of_type("dispatch") == []
    assert p0.runtime.suspect_since == 0.25  # probed at once by the next tick
    assert failed.idle == (p0,) and p0.runtime.in_flight_requests == 0
    assert (p1.runtime.in_flight_requests, d.runtime.in_flight_requests) == (1, 1)

    again = f.prefill_leg(0.5)
    assert again.worker is p1 and again.timeout_s == pytest.approx(9.5)  # the request's deadline, shared
    final = f.prefill_done(None)
    assert final.worker is d and final.timeout_s == 10.0
    assert final.body == {**BODY, "kv_transfer_params": {
        "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": TID,
        "remote_engine_id": "eng-p1", "remote_bootstrap_addr": "http://127.0.0.1:8998"}}
    done = f.final_done()
    assert done.answer is None
    assert done.effects.of_type("dispatch") == [{
        "request_id": "req-1", "prefill": p1.id, "decode": d.id, "prefill_url": p1.spec.url,
        "decode_url": d.spec.url, "connector": "mooncake", "transfer_id": TID, "remote_engine_id": "eng-p1",
        "retried_from": [p0.id], "status": 200, "outcome": "ok", "error": None,
    }]
    assert f.release() == (p1, d)
    assert f.release() == ()  # once only
    assert [w.runtime.in_flight_requests for w in (p0, p1, d)] == [0, 0, 0]


def test_bug_no_suspect_probe_retries_the_refused_leg_but_neither_probes_nor_avoids_its_worker() -> None:
    reg = cluster()
    (p0, p1), _ = roles(reg)
    f = DispatchFlow("req-1", BODY, reg, LegPolicies.make("round_robin", "round_robin"), LIMITS,
                     new_uuid=lambda: uuid.UUID(int=7), bugs=frozenset({"no_suspect_probe"}))
    assert f.pick(0.0) is None and f.prefill is p0
    f.prefill_leg(0.0)
    failed = f.prefill_failed(REFUSED, 0.25)
    assert failed.retry_on is p1  # the retry itself is unchanged
    assert failed.effects.of_type("worker_suspect") == [] and p0.runtime.suspect_since is None


def test_prefill_500_is_answered_at_once_with_no_decode_leg() -> None:
    reg = cluster(connector="nixl")
    (p0, _), (d,) = roles(reg)
    f = flow(reg)
    assert f.pick(0.0) is None
    f.prefill_leg(0.0)
    failed = f.prefill_failed(LegError(502, "upstream_error", "p0 answered 500", Delivery.ANSWERED), 0.1)
    assert failed.retry_on is None
    assert failed.answer == ErrorAnswer(502, "upstream_error", "prefill leg failed: p0 answered 500")
    (record,) = failed.effects.of_type("dispatch")
    assert (record["prefill"], record["status"], record["outcome"], record["error"]) == (
        p0.id, 502, "prefill_failed", "p0 answered 500")
    assert "retried_from" not in record
    # The engine saw the request: no suspicion, no retry counted, and no decode leg may follow.
    assert failed.effects.of_type("worker_suspect") == [] and p0.runtime.suspect_since is None
    assert failed.effects.metrics == [MetricInc(DISPATCHES_TOTAL, {"connector": "nixl",
                                                                   "outcome": "prefill_failed"})]
    with pytest.raises(RuntimeError):
        f.prefill_done({"remote_engine_id": "x"})
    assert f.release() == (p0, d)


@pytest.mark.parametrize(("down", "message"), [("decode", "no Ready decode worker"),
                                               ("prefill", "no Ready prefill worker")])
def test_no_ready_worker_for_a_leg_is_503_before_any_leg(down: str, message: str) -> None:
    reg = cluster()
    for w in reg.by_role(Role(down)):
        w.runtime.status = Status.NOT_READY
    f = flow(reg)
    assert f.pick(0.0) == ErrorAnswer(503, "no_available_workers", message, "service_unavailable")
    assert all(w.runtime.in_flight_requests == 0 for w in reg.all())
    with pytest.raises(RuntimeError):
        f.prefill_leg(0.0)
    assert f.release() == ()


@pytest.mark.parametrize(("now", "reason"), [(1.0, "no_other_ready_worker"), (10.0, "deadline_passed")])
def test_refused_leg_that_cannot_run_elsewhere_fails_and_says_why(now: float, reason: str) -> None:
    reg = cluster(prefills=1 if reason == "no_other_ready_worker" else 2)
    f = flow(reg)
    f.pick(0.0)
    f.prefill_leg(0.0)
    failed = f.prefill_failed(REFUSED, now)
    assert failed.retry_on is None and failed.answer is not None and failed.answer.status == 502
    assert MetricInc(LEG_RETRIES_TOTAL, {"leg": "prefill", "outcome": reason}) in failed.effects.metrics
    assert [e["outcome"] for e in failed.effects.of_type("dispatch")] == ["prefill_failed"]


def test_prefill_whose_id_reread_is_running_is_avoided_or_waited_for() -> None:
    reg = cluster()
    (p0, p1), _ = roles(reg)
    p0.runtime.probe_stage = ProbeStage.REREAD
    f = flow(reg)
    f.pick(0.0)
    assert f.prefill is p1 and f.id_read_wait_s() == 0.0  # a settled one is preferred
    p1.runtime.probe_stage = ProbeStage.REREAD
    g = flow(reg)
    g.pick(0.0)
    assert g.prefill in (p0, p1)
    assert g.id_read_wait_s() == LIMITS.id_read_wait_s and not g.id_read_settled()
    # The read ends with a new id: the handoff is minted after it, with that id.
    assert g.prefill is not None
    g.prefill.runtime.probe_stage = None
    g.prefill.runtime.engine_id = "after-restart"
    assert g.id_read_settled()
    g.prefill_leg(0.3)
    final = g.prefill_done(None)
    assert final.body["kv_transfer_params"]["remote_engine_id"] == "after-restart"


def test_nixl_relays_the_prefill_params_verbatim_or_says_it_could_not() -> None:
    reg = cluster(connector="nixl")
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1, 2]}
    f = flow(reg)
    f.pick(0.0)
    assert f.prefill_leg(0.0).body["kv_transfer_params"] == {"do_remote_decode": True,
                                                              "do_remote_prefill": False}
    final = f.prefill_done(params)
    assert final.body["kv_transfer_params"] == params and final.effects.events == []
    g = flow(reg)
    g.pick(0.0)
    g.prefill_leg(0.0)
    bare = g.prefill_done(None)
    assert "kv_transfer_params" not in bare.body
    assert [e["reason"] for e in bare.effects.of_type("mint_skipped")] == [
        "prefill_returned_no_kv_transfer_params"]


def test_mooncake_prefill_without_an_engine_id_is_not_minted() -> None:
    reg = cluster(prefills=1)
    (p0,), _ = roles(reg)
    p0.runtime.engine_id = None
    f = flow(reg)
    f.pick(0.0)
    leg = f.prefill_leg(0.0)
    assert "kv_transfer_params" not in leg.body
    assert leg.effects.of_type("mint_skipped") == [
        {"reason": "no_engine_id", "request_id": "req-1", "worker": p0.id, "url": p0.spec.url}
    ]
    assert "kv_transfer_params" not in f.prefill_done(None).body
    (record,) = f.final_done().effects.of_type("dispatch")
    assert (record["transfer_id"], record["remote_engine_id"]) == (None, None)


@pytest.mark.parametrize(("after_headers", "status", "outcome", "answered"),
                         [(False, 504, "decode_failed", True), (True, 200, "decode_stream_failed", False)])
def test_decode_failure_before_or_after_the_stream_began(
    after_headers: bool, status: int, outcome: str, answered: bool
) -> None:
    f = flow(cluster())
    f.pick(0.0)
    f.prefill_leg(0.0)
    f.prefill_done(None)
    done = f.final_done(LegError(504, "upstream_timeout", "decode overran"), after_headers=after_headers)
    (record,) = done.effects.of_type("dispatch")
    assert (record["status"], record["outcome"], record["error"]) == (status, outcome, "decode overran")
    expected = ErrorAnswer(504, "upstream_timeout", "decode leg failed: decode overran") if answered else None
    assert done.answer == expected


def test_regular_mode_runs_one_leg_and_records_it() -> None:
    reg = WorkerRegistry()
    w = ready(reg.add(make_worker_spec("http://127.0.0.1:8300", "regular")), None)
    f = flow(reg, pd=False)
    assert f.pick(0.0) is None
    with pytest.raises(RuntimeError):
        f.prefill_leg(0.0)
    leg = f.regular_leg()
    assert leg.worker is w and leg.body == BODY and leg.body is not BODY
    assert f.final_done().effects.of_type("dispatch") == [{
        "request_id": "req-1", "prefill": None, "decode": w.id, "decode_url": w.spec.url, "connector": None,
        "transfer_id": None, "remote_engine_id": None, "status": 200, "outcome": "ok", "error": None,
    }]


def test_each_leg_has_its_own_round_robin_cursor() -> None:
    reg = cluster(prefills=2, decodes=2)
    (p0, p1), (d0, d1) = roles(reg)
    policies = LegPolicies.make("round_robin", "round_robin")
    chosen = []
    for _ in range(4):
        f = flow(reg, policies=policies)
        f.pick(0.0)
        chosen.append((f.prefill, f.decode))
        f.release()
    assert chosen == [(p0, d0), (p1, d1), (p0, d0), (p1, d1)]


def test_a_draining_worker_is_reported_idle_when_its_last_request_ends() -> None:
    reg = cluster(prefills=1)
    (p0,), (d,) = roles(reg)
    first, second = flow(reg), flow(reg)
    first.pick(0.0)
    second.pick(0.0)
    p0.runtime.status = Status.DRAINING
    assert first.release() == ()
    assert second.release() == (p0, d)
