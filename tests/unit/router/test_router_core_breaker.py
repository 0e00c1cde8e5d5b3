"""core.breaker driven through DispatchFlow and the health tick on a virtual clock: which failures count, when
a worker is kept out, the one trial of a half-open breaker, re-admission at promotion, and the `breaker`
records (CONTRACTS §2)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from helpers.dispatch_steps import OK, effects_of, first_leg, run, steps_to_decode

from reference_router.cli import build_parser, config_from_args
from reference_router.core import (
    BREAKER_TRANSITIONS_TOTAL,
    Answer,
    BreakerConfig,
    BreakerState,
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
    MetricInc,
    Prepare,
    Role,
    RunLeg,
    Status,
    Worker,
    WorkerRegistry,
    begin_probe,
    make_worker_spec,
    on_probe_done,
    own_failure,
    pick_worker,
    set_draining,
    start_tick,
    worker_api_dict,
)
from reference_router.errors import UpstreamError
from reference_router.upstream_grpc import grpc_error

LIMITS = DispatchLimits(request_timeout_s=10.0, id_read_wait_s=0.5)
BODY: dict[str, Any] = {"prompt": "x", "max_tokens": 5}
CFG = BreakerConfig(failure_threshold=3, open_s=10.0)
HEALTH = HealthConfig(failure_threshold=1, success_threshold=1, probe_timeout_s=1.0, interval_s=5.0)

ANSWERED_500 = LegError(502, "upstream_error", "d answered 500", Delivery.ANSWERED, worker_status=500,
                        worker_message="boom")
REFUSED = LegError(502, "upstream_error", "connection refused", Delivery.NOT_SENT)
KV_LOAD_FAILED = LegError(502, "upstream_error", "d answered 500", Delivery.ANSWERED, worker_status=500,
                          worker_message="KV load failed: KV transfer timed out")
BAD_REQUEST = LegError(400, "upstream_error", "d answered 400", Delivery.ANSWERED, worker_status=400)


def cluster(prefills: int = 1, decodes: int = 1) -> WorkerRegistry:
    reg = WorkerRegistry()
    for i in range(prefills):
        w = reg.add(make_worker_spec(f"http://127.0.0.1:{8100 + i}", "prefill", connector="nixl"))
        w.runtime.status = Status.READY
    for i in range(decodes):
        w = reg.add(make_worker_spec(f"http://127.0.0.1:{8200 + i}", "decode", connector="nixl"))
        w.runtime.status = Status.READY
    return reg


class Driver:
    """Runs whole requests through DispatchFlow as the asyncio shell does, collecting every Effects."""

    def __init__(self, reg: WorkerRegistry, breaker: BreakerConfig | None = CFG) -> None:
        self.reg = reg
        self.breaker = breaker
        self.policies = LegPolicies.make("round_robin", "round_robin")
        self.seq = 0
        self.effects = Effects()

    def flow(self) -> DispatchFlow:
        self.seq += 1
        return DispatchFlow(BODY, self.reg, self.policies, LIMITS, request_id=f"req-{self.seq}",
                            new_uuid=lambda: uuid.UUID(int=7), breaker=self.breaker)

    def request(
        self, now: float, *, decode_error: LegError | None = None, prefill_error: LegError | None = None
    ) -> tuple[DispatchFlow, ErrorAnswer | None]:
        f = self.flow()
        first = f.start(now)
        self.effects.extend(first.effects)
        if isinstance(first, Answer):  # refused at the pick
            return f, self.finish(f, first, now)
        return f, self.legs(f, first, now, decode_error=decode_error, prefill_error=prefill_error)

    def legs(
        self, f: DispatchFlow, step: DispatchStep, now: float, *, decode_error: LegError | None = None,
        prefill_error: LegError | None = None,
    ) -> ErrorAnswer | None:
        """The rest of a request the flow handed `step` out for; these tests script one prefill attempt."""
        legs = [prefill_error] if prefill_error is not None else [OK, decode_error or OK]
        return self.finish(f, step, now, legs)

    def finish(
        self, f: DispatchFlow, step: DispatchStep, now: float, legs: Sequence[LegResult] = ()
    ) -> ErrorAnswer | None:
        """Run the flow on from `step` (handed out, its effects collected) to its Answer, then close it."""
        steps = run(f, now, legs, step=step)
        self.effects.extend(effects_of(steps))
        idle, rest = f.close()
        assert idle == () and rest == Effects()  # the Answer released the workers and handed everything out
        answer = (steps or [step])[-1]
        assert isinstance(answer, Answer)
        return answer.error

    def breaker_events(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.effects.of_type("breaker")]


def decode(reg: WorkerRegistry, i: int = 0) -> Worker:
    return reg.by_role(Role.DECODE)[i]


def prefill(reg: WorkerRegistry, i: int = 0) -> Worker:
    return reg.by_role(Role.PREFILL)[i]


def transitions(drv: Driver) -> list[tuple[str, str, str, str]]:
    return [(e["worker"], e["from"], e["to"], e["reason"]) for e in drv.breaker_events()]


# ---- counting and opening ------------------------------------------------------------------------------


def test_opens_after_threshold_consecutive_own_failures_and_not_before() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    for i in range(2):
        f, answer = drv.request(float(i), decode_error=ANSWERED_500)
        assert f.decode is d and answer is not None and answer.status == 502
    assert d.runtime.breaker.state is BreakerState.CLOSED and d.runtime.breaker.failures == 2
    assert drv.breaker_events() == [] and worker_api_dict(d)["breaker"] == "closed"

    drv.request(2.0, decode_error=ANSWERED_500)
    assert d.runtime.breaker.state is BreakerState.OPEN
    assert worker_api_dict(d)["breaker"] == "open"
    assert drv.breaker_events() == [{
        "worker": d.id, "url": d.spec.url, "from": "closed", "to": "open", "reason": "consecutive_failures",
        "failures": 3, "request_id": "req-3", "error": "d answered 500",
    }]
    assert MetricInc(BREAKER_TRANSITIONS_TOTAL, {"to": "open"}) in drv.effects.metrics
    assert any("circuit breaker of" in w for w in drv.effects.warnings)

    # Kept out although Ready: the sole decode leg is a prompt 503, and no leg reaches it.
    assert d.status is Status.READY
    assert pick_worker(reg, Role.DECODE, drv.policies.decode, 3.0) is None
    _, answer = drv.request(3.0)
    assert answer is not None and (answer.status, answer.code) == (503, "no_available_workers")
    assert "circuit breaker" in answer.message


def test_a_success_in_between_resets_the_count() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    drv.request(0.0, decode_error=ANSWERED_500)
    drv.request(1.0, decode_error=ANSWERED_500)
    drv.request(2.0)
    assert d.runtime.breaker.failures == 0
    drv.request(3.0, decode_error=ANSWERED_500)
    drv.request(4.0, decode_error=ANSWERED_500)
    assert d.runtime.breaker.state is BreakerState.CLOSED
    drv.request(5.0, decode_error=ANSWERED_500)
    assert d.runtime.breaker.state is BreakerState.OPEN


def test_other_workers_take_the_traffic_while_one_is_open() -> None:
    reg = cluster(decodes=2)
    d0, d1 = decode(reg, 0), decode(reg, 1)
    drv = Driver(reg, BreakerConfig(failure_threshold=1, open_s=10.0))
    f, _ = drv.request(0.0, decode_error=ANSWERED_500)
    assert f.decode is d0 and d0.runtime.breaker.state is BreakerState.OPEN
    picked = [drv.request(1.0 + i)[0].decode for i in range(4)]
    assert picked == [d1, d1, d1, d1]


def test_prefill_failures_count_and_a_refused_prefill_is_retried_elsewhere() -> None:
    reg = cluster(prefills=2)
    p0, p1 = prefill(reg, 0), prefill(reg, 1)
    drv = Driver(reg, BreakerConfig(failure_threshold=1, open_s=10.0))
    f = drv.flow()
    leg = first_leg(f)
    assert leg.worker is p0 and f.prefill is p0
    drv.effects.extend(leg.effects)
    again = f.on_leg_done(REFUSED, 0.1)
    assert isinstance(again, RunLeg) and again.worker is p1
    assert p0.runtime.breaker.state is BreakerState.OPEN
    assert [(e["worker"], e["to"]) for e in again.effects.of_type("breaker")] == [(p0.id, "open")]
    drv.effects.extend(again.effects)
    assert drv.finish(f, again, 0.2, [OK, OK]) is None
    # The refused prefill stays out (its probe, not the breaker, says whether it is Ready).
    assert [drv.request(1.0 + i)[0].prefill for i in range(3)] == [p1, p1, p1]


def test_a_prefill_retry_skips_prefills_whose_breaker_is_open() -> None:
    reg = cluster(prefills=2)
    p0, p1 = prefill(reg, 0), prefill(reg, 1)
    p1.runtime.breaker.state = BreakerState.OPEN
    p1.runtime.breaker.open_until = 100.0
    drv = Driver(reg)
    f = drv.flow()
    assert first_leg(f).worker is p0
    failed = f.on_leg_done(REFUSED, 0.1)
    assert isinstance(failed, Answer) and failed.error is not None  # p1 is Ready but kept out
    assert failed.idle == (p0, decode(reg)) and f.close() == ((), Effects())


# ---- which failures are the worker's own ---------------------------------------------------------------


def _worker(role: str) -> Worker:
    return Worker.new("w1", make_worker_spec("http://127.0.0.1:8000", role))


@pytest.mark.parametrize(
    ("role", "error", "counts"),
    [
        ("decode", REFUSED, True),
        ("decode", LegError(504, "upstream_timeout", "timed out after 5s"), True),
        ("decode", LegError(502, "upstream_error", "stream broke: reset"), True),
        ("decode", ANSWERED_500, True),
        ("decode", LegError(502, "upstream_error", "d answered 503", Delivery.ANSWERED, 503), True),
        ("prefill", ANSWERED_500, True),
        # A client error never counts, whether the driver knows the worker's status or only the relayed one.
        ("decode", BAD_REQUEST, False),
        ("prefill", LegError(400, "invalid_request", "bad params", Delivery.ANSWERED), False),
        ("decode", LegError(429, "upstream_error", "d answered 429", Delivery.ANSWERED, 429), False),
        ("decode", LegError(502, "upstream_error", "grpc: NOT_FOUND: x", worker_status=404), False),
        # A decode's failed KV load is its prefill's failure (HTTP body message, or gRPC details in the
        # message); a prefill never loads KV.
        ("decode", KV_LOAD_FAILED, False),
        ("decode", LegError(502, "upstream_error", "grpc://d: INTERNAL: KV load failed: handshake"), False),
        ("prefill", KV_LOAD_FAILED, True),
    ],
)
def test_own_failure_table(role: str, error: LegError, counts: bool) -> None:
    assert own_failure(_worker(role), error) is counts


def test_kv_load_failures_neither_count_nor_reset_the_decodes_count() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    drv.request(0.0, decode_error=ANSWERED_500)
    drv.request(1.0, decode_error=ANSWERED_500)
    for i in range(10):
        drv.request(2.0 + i, decode_error=KV_LOAD_FAILED)
    assert d.runtime.breaker.state is BreakerState.CLOSED and d.runtime.breaker.failures == 2
    drv.request(20.0, decode_error=ANSWERED_500)
    assert d.runtime.breaker.state is BreakerState.OPEN


def test_client_errors_never_count() -> None:
    reg = cluster()
    d = decode(reg)
    p = prefill(reg)
    drv = Driver(reg, BreakerConfig(failure_threshold=1))
    for i in range(5):
        drv.request(float(i), decode_error=BAD_REQUEST)
        drv.request(float(i), prefill_error=BAD_REQUEST)
    assert (d.runtime.breaker.failures, p.runtime.breaker.failures) == (0, 0)
    assert drv.breaker_events() == []


def test_a_503_the_router_answered_itself_touches_no_breaker() -> None:
    reg = cluster()
    d, p = decode(reg), prefill(reg)
    d.runtime.breaker.failures = 2
    p.runtime.status = Status.NOT_READY
    drv = Driver(reg)
    for i in range(5):
        _, answer = drv.request(float(i))
        assert answer is not None and answer.status == 503 and "circuit breaker" not in answer.message
    assert d.runtime.breaker.failures == 2 and drv.breaker_events() == []
    assert d.runtime.in_flight_requests == 0


def test_upstream_errors_carry_what_the_worker_answered() -> None:
    http = UpstreamError("http://d answered 500", 502, body={"error": {"message": "KV load failed: x"}},
                         delivery=Delivery.ANSWERED, worker_status=500).leg_error()
    assert (http.status, http.worker_status, http.worker_message) == (502, 500, "KV load failed: x")
    assert own_failure(_worker("decode"), http) is False
    md = grpc.aio.Metadata()
    rpc = grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, md, md, "KV load failed: y")
    internal = grpc_error("grpc://d", rpc)
    assert own_failure(_worker("decode"), internal.leg_error()) is False
    assert own_failure(_worker("prefill"), internal.leg_error()) is True
    missing = grpc_error("grpc://d", grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, md, md, "no model"))
    assert missing.leg_error().worker_status == 404
    assert not own_failure(_worker("decode"), missing.leg_error())


# ---- open, half-open, trial ----------------------------------------------------------------------------


def _opened(drv: Driver, d: Worker, at: float) -> None:
    for _ in range(3):
        drv.request(at, decode_error=ANSWERED_500)
    assert d.runtime.breaker.state is BreakerState.OPEN and d.runtime.breaker.open_until == at + CFG.open_s


def test_half_open_after_open_s_then_the_trials_success_closes_it() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    _, answer = drv.request(10.99)
    assert answer is not None and answer.status == 503

    trial = drv.flow()
    picked = trial.start(11.0)
    assert isinstance(picked, Prepare) and trial.decode is d
    assert d.runtime.breaker.state is BreakerState.HALF_OPEN and worker_api_dict(d)["breaker"] == "half_open"
    # Only one trial at a time: a second request meanwhile finds no decode it may use.
    _, answer = drv.request(11.1)
    assert answer is not None and answer.status == 503
    assert drv.legs(trial, picked, 11.2) is None
    assert d.runtime.breaker.state is BreakerState.CLOSED and d.runtime.breaker.failures == 0
    assert transitions(drv)[1:] == [
        (d.id, "open", "half_open", "open_elapsed"), (d.id, "half_open", "closed", "trial_succeeded"),
    ]
    assert drv.breaker_events()[-1]["request_id"] == trial.request_id
    f, answer = drv.request(12.0)
    assert answer is None and f.decode is d


def test_the_trials_failure_opens_it_again_for_open_s() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    f, answer = drv.request(11.0, decode_error=REFUSED)
    assert f.decode is d and answer is not None
    assert d.runtime.breaker.state is BreakerState.OPEN and d.runtime.breaker.open_until == 21.0
    assert transitions(drv)[-2:] == [
        (d.id, "open", "half_open", "open_elapsed"), (d.id, "half_open", "open", "trial_failed"),
    ]
    assert drv.request(20.9)[1] is not None
    assert drv.request(21.0)[0].decode is d


def test_a_trial_that_ends_without_a_verdict_frees_it_for_the_next_request() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    # The trial request's prefill fails: its decode leg never runs.
    f, answer = drv.request(11.0, prefill_error=ANSWERED_500)
    assert f.decode is d and answer is not None
    assert d.runtime.breaker.state is BreakerState.HALF_OPEN and d.runtime.breaker.trial_request is None
    # A trial ending in a failure that is not the decode's own (KV load) frees it too.
    f, _ = drv.request(11.5, decode_error=KV_LOAD_FAILED)
    assert f.decode is d and d.runtime.breaker.state is BreakerState.HALF_OPEN
    f, _ = drv.request(12.0)
    assert f.decode is d and d.runtime.breaker.state is BreakerState.CLOSED


def test_a_refused_request_takes_no_trial() -> None:
    reg = cluster()
    d, p = decode(reg), prefill(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    p.runtime.status = Status.NOT_READY
    assert drv.request(11.0)[1] is not None  # no prefill: 503 before any leg
    assert d.runtime.breaker.trial_request is None
    p.runtime.status = Status.READY
    assert drv.request(11.5)[0].decode is d


def test_outcomes_of_requests_sent_before_it_opened_do_not_move_it() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    early: list[tuple[DispatchFlow, RunLeg]] = []
    for _ in range(2):
        f = drv.flow()
        steps = steps_to_decode(f, 0.0)
        assert f.decode is d
        drv.effects.extend(effects_of(steps))
        early.append((f, steps[-1]))
    _opened(drv, d, 1.0)
    assert drv.finish(*early[0], 2.0, [OK]) is None  # a late success while open
    assert d.runtime.breaker.state is BreakerState.OPEN

    trial = drv.flow()
    picked = trial.start(11.0)
    assert isinstance(picked, Prepare) and trial.decode is d
    assert drv.finish(*early[1], 11.1, [ANSWERED_500]) is not None  # a late failure while half-open
    assert d.runtime.breaker.state is BreakerState.HALF_OPEN
    assert d.runtime.breaker.trial_request == trial.request_id
    drv.legs(trial, picked, 11.2)
    assert d.runtime.breaker.state is BreakerState.CLOSED


def test_a_failed_final_leg_opens_from_when_it_ended_not_an_earlier_steps_clock() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg, BreakerConfig(failure_threshold=1, open_s=5.0))
    f = drv.flow()
    assert isinstance(f.start(3.0), Prepare)
    assert isinstance(f.on_prepared(None, 4.0), RunLeg)
    final = f.on_leg_done(OK, 5.0)
    assert isinstance(final, RunLeg)
    assert drv.finish(f, final, 6.0, [ANSWERED_500]) is not None
    assert d.runtime.breaker.open_until == 11.0


# ---- health tick ---------------------------------------------------------------------------------------


def test_the_health_tick_moves_an_open_breaker_to_half_open_when_its_period_ends() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    assert start_tick(reg.all(), 10.9, HEALTH).effects.of_type("breaker") == []
    plan = start_tick(reg.all(), 11.0, HEALTH)
    assert [(e["from"], e["to"], e["reason"]) for e in plan.effects.of_type("breaker")] == [
        ("open", "half_open", "open_elapsed")]
    assert MetricInc(BREAKER_TRANSITIONS_TOTAL, {"to": "half_open"}) in plan.effects.metrics
    assert worker_api_dict(d)["breaker"] == "half_open"
    assert start_tick(reg.all(), 12.0, HEALTH).effects.of_type("breaker") == []
    # The trial still goes to the first request.
    assert drv.request(12.0)[0].decode is d and d.runtime.breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize("outage", [Status.NOT_READY, Status.FAILED])
def test_promotion_back_to_ready_closes_the_breaker(outage: Status) -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    d.runtime.status = outage
    token = begin_probe(d, 2.0)
    done = on_probe_done(d, token, True, 0.01, 2.0, HEALTH)
    assert d.status is Status.READY and d.runtime.breaker.state is BreakerState.CLOSED
    assert [(e["from"], e["to"], e["reason"]) for e in done.effects.of_type("breaker")] == [
        ("open", "closed", "worker_recovered")]
    # Back at once, not a whole open period later.
    assert drv.request(2.5)[0].decode is d


def test_promotion_resets_the_count_of_a_closed_breaker() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    drv.request(0.0, decode_error=ANSWERED_500)
    drv.request(0.0, decode_error=ANSWERED_500)
    d.runtime.status = Status.NOT_READY
    done = on_probe_done(d, begin_probe(d, 1.0), True, 0.01, 1.0, HEALTH)
    assert d.runtime.breaker.failures == 0 and done.effects.of_type("breaker") == []


def test_a_passing_probe_alone_does_not_close_an_open_breaker() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    done = on_probe_done(d, begin_probe(d, 2.0), True, 0.01, 2.0, HEALTH)
    assert d.status is Status.READY and done.effects.of_type("breaker") == []
    assert d.runtime.breaker.state is BreakerState.OPEN


def test_a_draining_worker_keeps_its_breaker_state() -> None:
    reg = cluster()
    d = decode(reg)
    drv = Driver(reg)
    _opened(drv, d, 1.0)
    set_draining(d)
    assert d.runtime.breaker.state is BreakerState.OPEN and worker_api_dict(d)["breaker"] == "open"
    assert pick_worker(reg, Role.DECODE, drv.policies.decode, 20.0) is None


# ---- disabled and settings -----------------------------------------------------------------------------


@pytest.mark.parametrize("breaker", [None, BreakerConfig()])
def test_disabled_counts_nothing_and_keeps_every_worker(breaker: BreakerConfig | None) -> None:
    reg = cluster()
    d, p = decode(reg), prefill(reg)
    drv = Driver(reg, breaker)
    for i in range(30):
        f, answer = drv.request(float(i), decode_error=ANSWERED_500 if i % 2 else REFUSED)
        assert f.decode is d and answer is not None and answer.status != 503
        drv.request(float(i), prefill_error=REFUSED)
    assert d.runtime.breaker == p.runtime.breaker == type(d.runtime.breaker)()
    assert drv.breaker_events() == []
    assert all(m.name != BREAKER_TRANSITIONS_TOTAL for m in drv.effects.metrics)


def test_breaker_config_validation() -> None:
    assert not BreakerConfig().enabled and BreakerConfig(10).enabled
    assert BreakerConfig().open_s == 60.0
    with pytest.raises(ValueError, match="threshold"):
        BreakerConfig(failure_threshold=0)
    with pytest.raises(ValueError, match="open duration"):
        BreakerConfig(failure_threshold=1, open_s=0)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], BreakerConfig()),
        (["--cb-failure-threshold", "10"], BreakerConfig(10, 60.0)),
        (["--cb-failure-threshold", "2", "--cb-timeout-duration-secs", "0.5"], BreakerConfig(2, 0.5)),
        (["--cb-failure-threshold", "2", "--disable-circuit-breaker"], BreakerConfig(None, 60.0)),
    ],
)
def test_cli_flags(argv: list[str], expected: BreakerConfig) -> None:
    base = ["--pd-disaggregation", "--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200"]
    cfg = config_from_args(build_parser().parse_args(base + argv))
    cfg.validate()
    assert cfg.breaker() == expected


def test_cli_rejects_a_zero_threshold() -> None:
    cfg = config_from_args(build_parser().parse_args(["--cb-failure-threshold", "0"]))
    with pytest.raises(ValueError, match="threshold"):
        cfg.validate()
