"""One client request's dispatch as a state machine that hands out steps: every decision, none of the I/O.

The shell (the asyncio Dispatcher, the simulated router) makes a flow per client request, takes its first
step from `start(now)`, does what the step names and reports back through the matching `on_*`, which returns
the next step, until an `Answer`:

    Prepare(workers)        tokenize for these workers and check the context budget -> on_prepared
    AwaitIdRead(timeout_s)  the prefill's engine-id re-read is running: wait while not id_read_settled(),
                            at most timeout_s -> on_id_read_waited
    RunLeg(worker, body, timeout_s, final)
                            run the leg (final: the one whose answer the client sees, relayed as it comes)
                            -> on_leg_done(LegDone | LegError, now, after_headers=...)
    Backoff(seconds)        bugs retry_failed_requests / retry_transport_failures only: wait, then
                            on_backoff_done; the request runs again whole under a new request id
    Answer(error)           final: error None, the final leg's answer went through; else answer this error

Every step carries the Effects to record (events, counters, warnings) and the workers it left idle (a
Draining one may now be removed). A result for a step not handed out is refused (RuntimeError). A shell that
gives up on a request (the client left, an exception) calls `close()` on every exit path: it releases the
workers the flow still holds and returns what nothing handed out yet.

Order, the router's request contract in one place (`_after_pick`, `_after_prefill`, `_after_final`):
pick both workers before any leg (a leg with no Ready worker is a prompt 503); the prefill leg, sanitised,
with freshly minted KV params once the prefill's id read has settled; a prefill leg that never reached its
worker runs again on another Ready prefill within the request's deadline, at most once per prefill
(core.retry); any other prefill failure is answered at once, never after the decode's deadline (bug #9); the
decode leg with the minted (Mooncake) or relayed (NIXL) params, never twice; release both workers.

With a circuit breaker configured (`breaker=BreakerConfig(...)`, core.breaker) picking skips workers it keeps
out and takes a half-open worker's one trial, every leg's outcome is recorded into its worker's breaker and
the release frees a trial the request did not use. What the pick changed (a breaker going half-open) rides on
the first leg's Effects.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
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

# How often a shell waiting out an AwaitIdRead looks again (the read takes milliseconds).
ID_READ_POLL_S = 0.005
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


# -- steps ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepare:
    """Tokenize the request for `workers` (the first gRPC one whose tokenizer can be had) and refuse it when
    it cannot fit the smallest context they report; then `on_prepared(problem, now)`. A shell with nothing
    to prepare answers at once."""

    workers: tuple[Worker, ...]
    effects: Effects = field(default_factory=Effects)
    idle: tuple[Worker, ...] = ()


@dataclass(frozen=True)
class AwaitIdRead:
    """The prefill turned Ready at the probe that promoted it, before the engine-id re-read that follows
    ended: a request minting now would name the dead engine's id (a transfer timeout) or none. Wait while
    `id_read_settled()` is False, at most `timeout_s` (the read's own deadline); then `on_id_read_waited`."""

    timeout_s: float
    effects: Effects = field(default_factory=Effects)
    idle: tuple[Worker, ...] = ()


@dataclass(frozen=True)
class RunLeg:
    """Send `body` to `worker` within `timeout_s`; then `on_leg_done`. `final`: the leg whose answer the
    client sees (the decode, or the only leg of a regular request); else a prefill leg (sanitised, with its
    KV params), whose answer only feeds the decode's params."""

    worker: Worker
    body: dict[str, Any]
    timeout_s: float
    final: bool
    effects: Effects = field(default_factory=Effects)
    idle: tuple[Worker, ...] = ()


@dataclass(frozen=True)
class Backoff:
    """Bugs retry_failed_requests / retry_transport_failures only: wait `seconds`, then `on_backoff_done`;
    the failed request runs again whole, under a new request id. Correct: a failure is answered."""

    seconds: float
    effects: Effects = field(default_factory=Effects)
    idle: tuple[Worker, ...] = ()


@dataclass(frozen=True)
class Answer:
    """Final. `error` None: the final leg's answer went through (relay it, or it was relayed). Else answer
    `error`; `before_legs`: the router refused the request before any leg ran (no Ready worker). `as_200`:
    bug error_as_200, the error is answered as a 200 completion with finish_reason "error" and no content."""

    error: ErrorAnswer | None
    effects: Effects = field(default_factory=Effects)
    idle: tuple[Worker, ...] = ()
    before_legs: bool = False
    as_200: bool = False


DispatchStep = Prepare | AwaitIdRead | RunLeg | Backoff | Answer


@dataclass(frozen=True)
class LegDone:
    """A leg that answered. A prefill's `kv_transfer_params`: what its answer carried (None when none)."""

    kv_transfer_params: Mapping[str, Any] | None = None


LegResult = LegDone | LegError


class _Phase(Enum):
    NEW = "new"
    PREPARE = "prepare"  # workers held, the shell prepares the prompt
    ID_READ = "id_read"  # waiting for the prefill's id read
    PREFILL = "prefill"  # a prefill leg is out
    FINAL = "final"  # the final leg is out
    BACKOFF = "backoff"  # bugs retry_*: waiting to run the request again
    DONE = "done"


class DispatchFlow:
    def __init__(
        self,
        body: Mapping[str, Any],
        registry: WorkerRegistry,
        policies: LegPolicies,
        limits: DispatchLimits,
        *,
        pd: bool = True,
        request_id: str | None = None,
        new_uuid: UuidFactory = uuid.uuid4,
        breaker: BreakerConfig | None = None,
        bugs: frozenset[str] = frozenset(),
    ) -> None:
        self.body = body
        self._pd_mode = pd
        self._registry = registry
        self._policies = policies
        self._limits = limits
        self._new_uuid = new_uuid
        self._breaker = breaker if breaker is not None else BreakerConfig()
        self._bugs = bugs  # test-only zoo switches (core.bugs)
        self._phase = _Phase.NEW
        self._pending = Effects()  # changes made by the pick, handed out with the first leg's Effects
        self._now = 0.0  # the latest `now` a step was given
        self.attempts = 0
        self._reset(request_id if request_id is not None else new_request_id(new_uuid))

    def _reset(self, request_id: str) -> None:
        """A new attempt of the request (the first, or a whole rerun under bugs retry_*)."""
        self.request_id = request_id
        self.attempts += 1
        self.pd = self._pd_mode
        self.prefill: Worker | None = None
        # The worker whose answer the client sees (regular mode: the only one), as the dispatch record has it.
        self.decode: Worker | None = None
        self.deadline = float("inf")
        self.retried_from: list[str] = []
        self._plan: HandoffPlan | None = None
        self._record: dict[str, Any] = {}
        self._held: list[Worker] = []
        # How far the leg the request failed in got (None: no leg failed, e.g. refused before any leg ran),
        # and whether that leg was the final (decode) one.
        self.failed_delivery: Delivery | None = None
        self.final_leg_failed = False

    # ---- the steps: the request's order ------------------------------------------------------------------

    def start(self, now: float) -> DispatchStep:
        """Pick (and hold) the request's workers: its first step."""
        self._expect(_Phase.NEW)
        return self._pick_step(now)

    def on_prepared(self, problem: ErrorAnswer | None, now: float) -> DispatchStep:
        """The prompt is ready (None), or cannot be had or does not fit (`problem`: answer it)."""
        self._expect(_Phase.PREPARE)
        self._now = now
        if problem is not None:
            return self._finish(problem)
        if not self.pd:
            return self._regular_leg()
        return self._to_prefill_leg(now)

    def on_id_read_waited(self, now: float) -> DispatchStep:
        """The id read settled, or the wait for it ran out: mint with the id in force now."""
        self._expect(_Phase.ID_READ)
        return self._prefill_leg(now)

    def on_leg_done(self, result: LegResult, now: float, *, after_headers: bool = False) -> DispatchStep:
        """The leg handed out last ended. A final leg's failure after a 200 stream began (`after_headers`)
        is still a 200 to the client: the shell ends the stream with an error chunk."""
        if self._phase is _Phase.PREFILL:
            if isinstance(result, LegError):
                return self._prefill_failed(result, now)
            return self._prefill_done(result.kv_transfer_params, now)
        self._expect(_Phase.FINAL)
        return self._final_done(None if isinstance(result, LegDone) else result, after_headers, now)

    def on_backoff_done(self, now: float) -> DispatchStep:
        """Bugs retry_*: the request runs again whole, under a new request id."""
        self._expect(_Phase.BACKOFF)
        self._reset(new_request_id(self._new_uuid))
        return self._pick_step(now)

    def close(self) -> tuple[tuple[Worker, ...], Effects]:
        """Let go of the workers still held (idempotent; a breaker trial the request holds without a verdict
        goes to the next request) and take what no step handed out: the workers left idle and the Effects."""
        self._phase = _Phase.DONE
        idle = self._release_all()
        out, self._pending = self._pending, Effects()
        return idle, out

    def id_read_settled(self) -> bool:
        return self.prefill is None or not id_read_pending(self.prefill)

    # ---- picking -----------------------------------------------------------------------------------------

    def _pick_step(self, now: float) -> DispatchStep:
        self._now = now
        refused = self._pick(now)
        if refused is not None:
            self._phase = _Phase.DONE
            idle = self._release_all()
            return Answer(refused, self._take(), idle, before_legs=True, as_200=self._as_200())
        self._phase = _Phase.PREPARE
        if self.pd:
            assert self.prefill is not None and self.decode is not None
            return Prepare((self.prefill, self.decode))
        assert self.decode is not None
        return Prepare((self.decode,))

    def _pick(self, now: float) -> ErrorAnswer | None:
        """Choose (and hold) the request's workers; the 503 answer when a leg has no Ready worker, decided
        before any leg runs."""
        if not self.pd:
            worker = pick_worker(self._registry, Role.REGULAR, self._policies.regular, now)
            if worker is None:
                return self._no_worker(Role.REGULAR)
            self._hold_alone(worker, now)
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
        return None

    def _pick_decode_alone(self, now: float) -> ErrorAnswer | None:
        """Bug prefill_on_decode: with no Ready prefill the decode runs the request alone (a regular leg, no
        handoff). Correct: a prompt 503."""
        decode = pick_worker(self._registry, Role.DECODE, self._policies.decode, now)
        if decode is None:
            return self._no_worker(Role.PREFILL)
        self.pd = False
        self._hold_alone(decode, now)
        return None

    def _hold_alone(self, worker: Worker, now: float) -> None:
        self.decode = worker
        self._hold(worker)
        self._pending.extend(breaker_pick(worker, self.request_id, now))

    def _no_worker(self, role: Role) -> ErrorAnswer:
        if NO_WORKER_404 in self._bugs:
            what = f"no {role.value} worker serves this model"
            return ErrorAnswer(404, "model_not_found", what, "not_found")
        # pick_worker finds none among Ready workers only when breakers keep every one out.
        return no_worker_answer(role, breaker_open=bool(self._registry.ready(role)))

    # ---- the prefill leg ---------------------------------------------------------------------------------

    def _to_prefill_leg(self, now: float, out: Effects | None = None, idle: tuple[Worker, ...] = ()
                        ) -> DispatchStep:
        """The prefill leg now, or a wait for its worker's running id read first."""
        if self.id_read_settled():
            return self._prefill_leg(now, out, idle)
        self._phase = _Phase.ID_READ
        return AwaitIdRead(self._limits.id_read_wait_s, out or Effects(), idle)

    def _prefill_leg(self, now: float, earlier: Effects | None = None, idle: tuple[Worker, ...] = ()
                     ) -> RunLeg:
        """The handoff for the current prefill (minted now, after any id-read wait), and its leg."""
        prefill, decode = self._chosen()
        plan = plan_handoff(prefill, new_uuid=self._new_uuid)
        self._plan = plan
        self._record = pd_record(self.request_id, prefill, decode, plan, self.retried_from)
        out = earlier or Effects()
        out.extend(self._take(now))
        if plan.mint_skipped:
            record_mint_skipped(out, plan.mint_skipped, self.request_id, prefill)
        self._phase = _Phase.PREFILL
        timeout = max(self.deadline - now, _MIN_LEG_TIMEOUT_S)
        body = sanitize_prefill_body(self.body, plan.prefill_params)
        return RunLeg(prefill, body, timeout, final=False, effects=out, idle=idle)

    def _prefill_failed(self, error: LegError, now: float) -> DispatchStep:
        """Retry on another Ready prefill when the leg never reached its worker, else fail the request."""
        failed, _ = self._chosen()
        out = self._take(now)
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
            # Bug legs_joined: the decode leg runs all the same, as if the prefill had answered. Correct: the
            # failure is answered at once.
            return self._prefill_done(None, now, out)
        if nxt is None:
            record_dispatch(out, self._record, error.status, "prefill_failed", error.message)
            self.failed_delivery = error.delivery
            return self._finish(error.answer("prefill"), out)
        record_leg_retry(out, "retried")
        out.warn(f"prefill leg to {failed.id} never reached it ({error.message}): retrying on {nxt.id}")
        self.retried_from.append(failed.id)
        idle = (failed,) if self._release(failed) else ()
        self.prefill = nxt
        self._hold(nxt, first=True)
        out.extend(breaker_pick(nxt, self.request_id, now))
        return self._to_prefill_leg(now, out, idle)

    def _prefill_done(
        self, kv_transfer_params: Mapping[str, Any] | None, now: float, out: Effects | None = None
    ) -> RunLeg:
        prefill, _ = self._chosen()
        out = out if out is not None else Effects()
        out.extend(self._take(now))
        out.extend(breaker_success(prefill, self.request_id, self._breaker))
        return self._decode_leg(kv_transfer_params, out)

    # ---- the final leg -----------------------------------------------------------------------------------

    def _decode_leg(self, kv_transfer_params: Mapping[str, Any] | None, out: Effects) -> RunLeg:
        """The decode leg once the prefill answered (`kv_transfer_params`: what its answer carried, if any):
        Mooncake gets the minted params, NIXL the prefill's verbatim."""
        prefill, decode = self._chosen()
        assert self._plan is not None
        params = self._plan.decode_params(kv_transfer_params)
        if NIXL_NOT_RELAYED in self._bugs and self._plan.connector is Connector.NIXL:
            params = None
        if self._plan.connector is Connector.NIXL and params is None:
            problem = HandoffPlan.nixl_relay_problem(kv_transfer_params)
            if problem:
                record_mint_skipped(out, problem, self.request_id, prefill)
        self._phase = _Phase.FINAL
        body = decode_body(self.body, params)
        return RunLeg(decode, body, self._limits.leg_timeout_s(self._bugs), final=True, effects=out)

    def _regular_leg(self) -> RunLeg:
        """Regular mode's only leg: the client's body as is, no handoff params."""
        assert self.decode is not None
        self._record = regular_record(self.request_id, self.decode)
        self._phase = _Phase.FINAL
        timeout = self._limits.leg_timeout_s(self._bugs)
        return RunLeg(self.decode, dict(self.body), timeout, final=True, effects=self._take())

    def _final_done(self, error: LegError | None, after_headers: bool, now: float) -> DispatchStep:
        """The request's outcome: ok, or the final leg's failure (`now`: when the leg ended; an opened
        breaker's period starts then)."""
        out = self._take(now)
        assert self.decode is not None
        if error is None:
            out.extend(breaker_success(self.decode, self.request_id, self._breaker))
            record_dispatch(out, self._record, 200, "ok")
            return self._finish(None, out)
        out.extend(breaker_failure(self.decode, self.request_id, error, self._now, self._breaker))
        if after_headers:
            record_dispatch(out, self._record, 200, "decode_stream_failed", error.message)
            return self._finish(None, out)
        record_dispatch(out, self._record, error.status, "decode_failed", error.message)
        self.failed_delivery = error.delivery
        self.final_leg_failed = True
        return self._finish(error.answer("decode"), out)

    # ---- the end -----------------------------------------------------------------------------------------

    def _finish(self, error: ErrorAnswer | None, out: Effects | None = None) -> Answer | Backoff:
        """Release the workers; answer, or (bugs retry_*) run the failed request again after a backoff."""
        out = out if out is not None else self._take()
        idle = self._release_all()
        out.extend(self._take())
        if error is not None and not self._bugs.isdisjoint((RETRY_FAILED_REQUESTS, RETRY_TRANSPORT_FAILURES)):
            backoff = self._retry_backoff_s(error.status)
            if backoff is not None:
                self._phase = _Phase.BACKOFF
                out.warn(f"request {self.request_id} failed ({error.status}): running it again whole in "
                         f"{backoff:.3f} s (attempt {self.attempts + 1})")
                return Backoff(backoff, out, idle)
        self._phase = _Phase.DONE
        return Answer(error, out, idle, as_200=error is not None and self._as_200())

    def _retry_backoff_s(self, status: int) -> float | None:
        """Bugs retry_failed_requests / retry_transport_failures only: the wait before the request runs
        again whole (None: answer the failure, as the correct router always does)."""
        if RETRY_FAILED_REQUESTS in self._bugs:
            return request_retry_backoff_s(self.attempts, status, self.failed_delivery)
        if RETRY_TRANSPORT_FAILURES in self._bugs and self.final_leg_failed:
            return request_retry_backoff_s(self.attempts, status, self.failed_delivery, transport_only=True)
        return None

    def _as_200(self) -> bool:
        # Bug error_as_200: the shell answers the error as a 200 completion with finish_reason "error" and no
        # content. Correct: the error's own status and JSON body.
        return ERROR_AS_200 in self._bugs

    # ---- holding workers ---------------------------------------------------------------------------------

    def _take(self, now: float | None = None) -> Effects:
        if now is not None:
            self._now = now
        out, self._pending = self._pending, Effects()
        return out

    def _hold(self, worker: Worker, first: bool = False) -> None:
        worker.runtime.in_flight_requests += 1
        # The prefill stays first, so the release lets go of the workers in the order they served.
        self._held.insert(0 if first else len(self._held), worker)

    def _release_all(self) -> tuple[Worker, ...]:
        return tuple(w for w in list(self._held) if self._release(w))

    def _release(self, worker: Worker) -> bool:
        self._held.remove(worker)
        breaker_release(worker, self.request_id)
        rt = worker.runtime
        rt.in_flight_requests -= 1
        if rt.in_flight_requests <= 0:
            rt.in_flight_requests = 0
            return True
        return False

    def _chosen(self) -> tuple[Worker, Worker]:
        assert self.prefill is not None and self.decode is not None
        return self.prefill, self.decode

    def _expect(self, phase: _Phase) -> None:
        if self._phase is not phase:
            mode = "PD" if self.pd else "regular"
            raise RuntimeError(f"dispatch flow of {self.request_id}: step not valid in phase "
                               f"{self._phase.value} ({mode} mode)")
