"""One client request's dispatch as a step object: every decision, none of the I/O.

The driver (the asyncio Dispatcher, a simulated router) performs the legs and calls back in this order:

    flow = DispatchFlow(request_id, body, registry, policies, limits, pd=True)
    answer = flow.pick(now)                  # an ErrorAnswer (503): answer it, run no leg
    try:
        PD:  loop: wait up to flow.id_read_wait_s() while not flow.id_read_settled()
                   leg = flow.prefill_leg(now); run leg.body on leg.worker within leg.timeout_s
                   failed: f = flow.prefill_failed(LegError, now); loop again if f.retry_on, else answer
                           f.answer
                   answered: final = flow.prefill_done(the kv_transfer_params it carried); stop looping
        regular: final = flow.regular_leg()
        run final.body on final.worker within final.timeout_s, relay its answer
        done = flow.final_done(error or None, after_headers=whether the client already got a 200 stream,
                               now=now)
    finally:
        flow.release()                       # workers left idle: a Draining one may now be removed
        flow.take_effects()                  # what no later step handed out (a request that ended early)

Sequential by design: a prefill failure is answered at once, never after the decode's deadline (bug #9). A
prefill leg that never reached its worker runs again on another Ready prefill within the request's deadline,
at most once per prefill (core.retry); the decode leg never runs twice. Every step returns the Effects to
record (the `dispatch` record once the outcome is known).

With a circuit breaker configured (`breaker=BreakerConfig(...)`, core.breaker) picking skips workers it keeps
out, pick() takes a half-open worker's one trial, every leg's outcome is recorded into its worker's breaker
and release() frees a trial the request did not use. pick() has no Effects of its own: what it changed (a
breaker going half-open) rides on the next step's Effects, or take_effects() when no step follows.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from .answers import ErrorAnswer, LegError
from .breaker import (
    BreakerConfig,
    breaker_admits,
    breaker_failure,
    breaker_pick,
    breaker_release,
    breaker_success,
)
from .bugs import (
    ERROR_AS_200,
    LEGS_JOINED,
    NIXL_NOT_RELAYED,
    NO_PREFILL_RETRY,
    NO_REQUEST_TIMEOUT,
    NO_SUSPECT_PROBE,
    NO_WORKER_404,
    PREFILL_ON_DECODE,
    RETRY_FAILED_REQUESTS,
    RETRY_TRANSPORT_FAILURES,
    WEDGED_STALLS_ALL,
)
from .connectors import HandoffPlan, UuidFactory, decode_body, plan_handoff, sanitize_prefill_body
from .dispatch_records import (
    pd_record,
    record_dispatch,
    record_leg_retry,
    record_mint_skipped,
    record_suspect,
    regular_record,
)
from .effects import Effects
from .picking import LegPolicies, id_read_pending, no_worker_answer, pick_worker
from .registry import WorkerRegistry
from .retry import (
    NO_RETRY_NO_OTHER_WORKER,
    Delivery,
    RetryDecision,
    avoid_suspects,
    decide_retry,
    mark_suspect,
    request_retry_backoff_s,
)
from .workers import Connector, Role, Worker

_MIN_LEG_TIMEOUT_S = 0.001
# Bug no_request_timeout: a leg "without" a deadline (the shells all take a number; nothing waits this long).
_NO_DEADLINE_S = 1e6


def dispatch_serialized(bugs: frozenset[str]) -> bool:
    """Bug wedged_stalls_all: the shell dispatches one request at a time behind a router-wide lock, so one
    wedged backend stalls every request. Correct: requests are independent (each leg has its own deadline)."""
    return WEDGED_STALLS_ALL in bugs


def new_request_id(new_uuid: UuidFactory = uuid.uuid4) -> str:
    return f"req-{new_uuid().hex}"


@dataclass(frozen=True)
class DispatchLimits:
    """request_timeout_s: the deadline of the whole request (its prefill legs share it); the final leg gets
    a full one of its own. id_read_wait_s: how long a request waits for its prefill's running engine-id
    re-read (the read's own deadline, the probe timeout)."""

    request_timeout_s: float
    id_read_wait_s: float

    def leg_timeout_s(self, bugs: frozenset[str]) -> float:
        return _NO_DEADLINE_S if NO_REQUEST_TIMEOUT in bugs else self.request_timeout_s


@dataclass(frozen=True)
class PrefillLeg:
    """Send `body` (sanitised, with the prefill's KV params) to `worker` within `timeout_s`."""

    worker: Worker
    body: dict[str, Any]
    timeout_s: float
    effects: Effects = field(default_factory=Effects)


@dataclass(frozen=True)
class PrefillFailed:
    """Exactly one of `retry_on` (run the prefill leg again, on that worker) and `answer` (final) is set; or,
    under bug legs_joined, neither and `decode_anyway` (the decode leg runs all the same)."""

    effects: Effects
    retry_on: Worker | None = None
    answer: ErrorAnswer | None = None
    idle: tuple[Worker, ...] = ()  # released workers with no request left (a Draining one may go now)
    decode_anyway: FinalLeg | None = None


@dataclass(frozen=True)
class FinalLeg:
    """The leg whose answer the client sees (the decode, or the only leg in regular mode)."""

    worker: Worker
    body: dict[str, Any]
    timeout_s: float
    effects: Effects = field(default_factory=Effects)


@dataclass(frozen=True)
class Finished:
    effects: Effects
    answer: ErrorAnswer | None = None  # the error to answer with (None: the leg's answer went through)


class _Phase(Enum):
    NEW = "new"
    PICKED = "picked"  # workers held, a prefill leg (or the regular leg) is next
    PREFILL = "prefill"  # a prefill leg is out
    FINAL = "final"  # the final leg is out
    DONE = "done"


class DispatchFlow:
    def __init__(
        self,
        request_id: str,
        body: Mapping[str, Any],
        registry: WorkerRegistry,
        policies: LegPolicies,
        limits: DispatchLimits,
        *,
        pd: bool = True,
        new_uuid: UuidFactory = uuid.uuid4,
        breaker: BreakerConfig | None = None,
        bugs: frozenset[str] = frozenset(),
    ) -> None:
        self.request_id = request_id
        self.body = body
        self.pd = pd
        self._registry = registry
        self._policies = policies
        self._limits = limits
        self._new_uuid = new_uuid
        self.prefill: Worker | None = None
        # The worker whose answer the client sees (regular mode: the only one), as the dispatch record has it.
        self.decode: Worker | None = None
        self.deadline = float("inf")
        self.retried_from: list[str] = []
        self._plan: HandoffPlan | None = None
        self._record: dict[str, Any] = {}
        self._held: list[Worker] = []
        self._phase = _Phase.NEW
        self._breaker = breaker if breaker is not None else BreakerConfig()
        self._pending = Effects()  # changes made by pick(), handed out with the next step's Effects
        self._now = 0.0  # the latest `now` a step was given (final_done's when its driver gives none)
        self._bugs = bugs  # test-only zoo switches (core.bugs)
        # Bug error_as_200: the shell answers this request's error as a 200 completion with finish_reason
        # "error" and no content. Correct: the error's own status and JSON body.
        self.masks_errors = ERROR_AS_200 in bugs
        # How far the leg the request failed in got (None: no leg failed, e.g. refused before any leg ran),
        # and whether that leg was the final (decode) one.
        self.failed_delivery: Delivery | None = None
        self.final_leg_failed = False

    def retry_backoff_s(self, attempts_done: int, status: int) -> float | None:
        """Bugs retry_failed_requests / retry_transport_failures only: the wait before the shell runs this
        failed request again whole, in a new flow (None: answer the failure, as the correct router always
        does)."""
        if RETRY_FAILED_REQUESTS in self._bugs:
            return request_retry_backoff_s(attempts_done, status, self.failed_delivery)
        if RETRY_TRANSPORT_FAILURES in self._bugs and self.final_leg_failed:
            return request_retry_backoff_s(attempts_done, status, self.failed_delivery, transport_only=True)
        return None

    # ---- workers ---------------------------------------------------------------------------------------

    def pick(self, now: float) -> ErrorAnswer | None:
        """Choose (and hold) the request's workers; the 503 answer when a leg has no Ready worker, decided
        before any leg runs."""
        self._expect(_Phase.NEW)
        self._phase = _Phase.DONE
        self._now = now
        if not self.pd:
            worker = pick_worker(self._registry, Role.REGULAR, self._policies.regular, now)
            if worker is None:
                return self._no_worker(Role.REGULAR)
            self.decode = worker
            self._hold(worker)
            self._pending.extend(breaker_pick(worker, self.request_id, now))
            self._phase = _Phase.PICKED
            return None
        self.deadline = now + self._limits.leg_timeout_s(self._bugs)
        prefill = pick_worker(self._registry, Role.PREFILL, self._policies.prefill, now)
        if prefill is None and PREFILL_ON_DECODE in self._bugs:
            return self._pick_decode_alone(now)
        if prefill is None:
            return self._no_worker(Role.PREFILL)
        decode = pick_worker(self._registry, Role.DECODE, self._policies.decode, now)
        if decode is None:
            return self._no_worker(Role.DECODE)
        # Both count the request until it ends: a Mooncake decode pulls from the prefill after the prefill
        # leg answered, so a draining prefill must outlive it.
        self.prefill, self.decode = prefill, decode
        self._hold(prefill)
        self._hold(decode)
        # Trials are taken only once both legs have a worker: a refused request holds none.
        self._pending.extend(breaker_pick(prefill, self.request_id, now))
        self._pending.extend(breaker_pick(decode, self.request_id, now))
        self._phase = _Phase.PICKED
        return None

    def _pick_decode_alone(self, now: float) -> ErrorAnswer | None:
        """Bug prefill_on_decode: with no Ready prefill the decode runs the request alone (a regular leg, no
        handoff). Correct: a prompt 503."""
        decode = pick_worker(self._registry, Role.DECODE, self._policies.decode, now)
        if decode is None:
            return self._no_worker(Role.PREFILL)
        self.pd = False
        self.decode = decode
        self._hold(decode)
        self._pending.extend(breaker_pick(decode, self.request_id, now))
        self._phase = _Phase.PICKED
        return None

    def _no_worker(self, role: Role) -> ErrorAnswer:
        if NO_WORKER_404 in self._bugs:
            what = f"no {role.value} worker serves this model"
            return ErrorAnswer(404, "model_not_found", what, "not_found")
        # pick_worker finds none among Ready workers only when breakers keep every one out.
        return no_worker_answer(role, breaker_open=bool(self._registry.ready(role)))

    def release(self) -> tuple[Worker, ...]:
        """Stop counting the request on its workers (idempotent); returns those left with none. A breaker
        trial the request holds without a verdict (its leg never ran) goes to the next request."""
        return tuple(w for w in list(self._held) if self._release(w))

    def take_effects(self) -> Effects:
        """What pick() changed that no later step handed out yet (a request that ended before its first leg,
        e.g. its tokenizer could not be had); empty once a step has."""
        out, self._pending = self._pending, Effects()
        return out

    def _step_effects(self, now: float | None = None) -> Effects:
        if now is not None:
            self._now = now
        return self.take_effects()

    def _hold(self, worker: Worker, first: bool = False) -> None:
        worker.runtime.in_flight_requests += 1
        # The prefill stays first, so release() lets go of the workers in the order they served.
        self._held.insert(0 if first else len(self._held), worker)

    def _release(self, worker: Worker) -> bool:
        self._held.remove(worker)
        breaker_release(worker, self.request_id)
        rt = worker.runtime
        rt.in_flight_requests -= 1
        if rt.in_flight_requests <= 0:
            rt.in_flight_requests = 0
            return True
        return False

    # ---- prefill ---------------------------------------------------------------------------------------

    def id_read_wait_s(self) -> float:
        """How long to wait before the prefill leg, while id_read_settled() is False (0: go at once).

        A worker turns Ready at the probe that promotes it, before the engine-id re-read that follows ends.
        A request in that window would mint the id from before the outage (the dead engine's: a transfer
        timeout) or none at all; it waits for the read instead, bounded by the read's own deadline."""
        self._expect(_Phase.PICKED, pd=True)
        return 0.0 if self.id_read_settled() else self._limits.id_read_wait_s

    def id_read_settled(self) -> bool:
        return self.prefill is None or not id_read_pending(self.prefill)

    def prefill_leg(self, now: float) -> PrefillLeg:
        """The handoff for the current prefill (minted now, after any id-read wait), and its leg."""
        self._expect(_Phase.PICKED, pd=True)
        prefill, decode = self._chosen()
        plan = plan_handoff(prefill, new_uuid=self._new_uuid)
        self._plan = plan
        self._record = pd_record(self.request_id, prefill, decode, plan, self.retried_from)
        out = self._step_effects(now)
        if plan.mint_skipped:
            record_mint_skipped(out, plan.mint_skipped, self.request_id, prefill)
        self._phase = _Phase.PREFILL
        timeout = max(self.deadline - now, _MIN_LEG_TIMEOUT_S)
        return PrefillLeg(prefill, sanitize_prefill_body(self.body, plan.prefill_params), timeout, out)

    def prefill_failed(self, error: LegError, now: float) -> PrefillFailed:
        """Retry on another Ready prefill when the leg never reached its worker, else fail the request."""
        self._expect(_Phase.PREFILL)
        failed, _ = self._chosen()
        out = self._step_effects(now)
        suspect = error.delivery is Delivery.NOT_SENT and NO_SUSPECT_PROBE not in self._bugs
        if suspect and mark_suspect(failed, now):
            record_suspect(out, failed, error.message)
        out.extend(breaker_failure(failed, self.request_id, error, now, self._breaker))
        ready = [w for w in self._registry.ready(Role.PREFILL) if breaker_admits(w, now)]
        decision = decide_retry(error.delivery, [*self.retried_from, failed.id], ready, now, self.deadline)
        if NO_PREFILL_RETRY in self._bugs:
            decision = RetryDecision(False, NO_RETRY_NO_OTHER_WORKER)
        nxt = None
        if decision.retry:
            nxt = self._policies.prefill.select(avoid_suspects(list(decision.candidates)), now)
        elif error.delivery is Delivery.NOT_SENT:
            record_leg_retry(out, decision.reason)
        if nxt is None and LEGS_JOINED in self._bugs:
            final = self.prefill_done(None)
            out.extend(final.effects)
            return PrefillFailed(Effects(), decode_anyway=replace(final, effects=out))
        if nxt is None:
            record_dispatch(out, self._record, error.status, "prefill_failed", error.message)
            self._phase = _Phase.DONE
            self.failed_delivery = error.delivery
            return PrefillFailed(out, answer=error.answer("prefill"))
        record_leg_retry(out, "retried")
        out.warn(f"prefill leg to {failed.id} never reached it ({error.message}): retrying on {nxt.id}")
        self.retried_from.append(failed.id)
        idle = (failed,) if self._release(failed) else ()
        self.prefill = nxt
        self._hold(nxt, first=True)
        out.extend(breaker_pick(nxt, self.request_id, now))
        self._phase = _Phase.PICKED
        return PrefillFailed(out, retry_on=nxt, idle=idle)

    def prefill_done(self, kv_transfer_params: Mapping[str, Any] | None) -> FinalLeg:
        """The decode leg once the prefill answered (`kv_transfer_params`: what its answer carried, if any):
        Mooncake gets the minted params, NIXL the prefill's verbatim."""
        self._expect(_Phase.PREFILL)
        prefill, decode = self._chosen()
        assert self._plan is not None
        params = self._plan.decode_params(kv_transfer_params)
        if NIXL_NOT_RELAYED in self._bugs and self._plan.connector is Connector.NIXL:
            params = None
        out = self._step_effects()
        out.extend(breaker_success(prefill, self.request_id, self._breaker))
        if self._plan.connector is Connector.NIXL and params is None:
            problem = HandoffPlan.nixl_relay_problem(kv_transfer_params)
            if problem:
                record_mint_skipped(out, problem, self.request_id, prefill)
        self._phase = _Phase.FINAL
        return FinalLeg(decode, decode_body(self.body, params), self._limits.leg_timeout_s(self._bugs), out)

    # ---- final leg -------------------------------------------------------------------------------------

    def regular_leg(self) -> FinalLeg:
        """Regular mode's only leg: the client's body as is, no handoff params."""
        self._expect(_Phase.PICKED, pd=False)
        assert self.decode is not None
        self._record = regular_record(self.request_id, self.decode)
        self._phase = _Phase.FINAL
        return FinalLeg(
            self.decode, dict(self.body), self._limits.leg_timeout_s(self._bugs), self._step_effects()
        )

    def final_done(
        self, error: LegError | None = None, *, after_headers: bool = False, now: float | None = None
    ) -> Finished:
        """The request's outcome: ok, or the final leg's failure. A failure after a 200 stream began
        (`after_headers`) is still a 200 to the client: the shell ends the stream with an error chunk.
        `now`: when the leg ended (an opened breaker's period starts then); without it, the last step's."""
        self._expect(_Phase.FINAL)
        self._phase = _Phase.DONE
        out = self._step_effects(now)
        assert self.decode is not None
        if error is None:
            out.extend(breaker_success(self.decode, self.request_id, self._breaker))
            record_dispatch(out, self._record, 200, "ok")
            return Finished(out)
        out.extend(breaker_failure(self.decode, self.request_id, error, self._now, self._breaker))
        if after_headers:
            record_dispatch(out, self._record, 200, "decode_stream_failed", error.message)
            return Finished(out)
        record_dispatch(out, self._record, error.status, "decode_failed", error.message)
        self.failed_delivery = error.delivery
        self.final_leg_failed = True
        return Finished(out, error.answer("decode"))

    # ---- state -----------------------------------------------------------------------------------------

    def _chosen(self) -> tuple[Worker, Worker]:
        assert self.prefill is not None and self.decode is not None
        return self.prefill, self.decode

    def _expect(self, phase: _Phase, pd: bool | None = None) -> None:
        if self._phase is not phase or (pd is not None and pd != self.pd):
            mode = "PD" if self.pd else "regular"
            raise RuntimeError(f"dispatch flow of {self.request_id}: step not valid in phase "
                               f"{self._phase.value} ({mode} mode)")

