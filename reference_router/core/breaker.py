"""Per-worker circuit breaker, with the semantics the oracle holds correct. Pure: time comes in as `now`.

States (kept on `worker.runtime.breaker`, shown as `breaker` in the worker API record):
- closed: the worker's consecutive own request failures are counted; `failure_threshold` of them in a row
  open it. A success resets the count.
- open: the worker is not picked for requests until `open_s` after it opened.
- half_open: the open period is over; exactly one request (the trial) may go to it, every other request
  avoids it while the trial is out. The trial's success closes it; the trial's own failure opens it again for
  `open_s`. A trial that ends with no verdict on the worker (its leg never ran, or ended in a failure that is
  not the worker's) frees the trial for the next request.

What counts against a worker (own_failure): its leg was refused, reset or timed out, or the worker answered
5xx for its own leg. Never: a client error (the worker answered 4xx); a decode whose KV load failed (its
answer says "KV load failed": the prefill it pulled from, or the path to it, broke; smg charges these to the
decode, which then takes a healthy decode out); a 503 the router answered itself (no worker: no leg ran, no
breaker is touched). A failure that does not count is neutral: it neither counts nor resets the count.

While open or half-open only the trial's outcome moves the breaker: requests sent before it opened may still
end, and their outcomes say nothing about the worker after the failures that opened it.

Re-admission: a worker promoted back to Ready by a successful probe after it was NotReady or Failed has its
breaker closed and its count reset (it restarted or recovered; a breaker that stays open keeps a recovered
sole prefill out for a whole open period, which some gateways do). A probe success alone never closes a
breaker: a worker that answers its health check but fails its requests stays out.

Draining workers keep their breaker state (they are not picked anyway). Disabled (`failure_threshold` None,
the default): nothing is counted, every breaker stays closed, picking is unchanged.

Drivers: core.picking skips workers whose breaker does not admit a request; core.dispatch_flow takes the
trial at pick (breaker_pick), records each leg's outcome (breaker_success / breaker_failure) and frees an
unused trial at release (breaker_release); core.health_tick moves open breakers to half-open when their
period ends (breaker_tick) and re-admits promoted workers (breaker_readmit). Every state change is a
`breaker` router event and a `pdchaos_router_breaker_transitions_total{to}` increment.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .answers import LegError
from .bugs import BREAKER_CHARGES_KV_FAILURE, NO_OUTLIER_EJECTION
from .effects import BREAKER_TRANSITIONS_TOTAL, Effects
from .retry import Delivery
from .workers import BREAKER_CLOSED, BREAKER_OPEN, BreakerRuntime, BreakerState, Role, Status, Worker

# Why a breaker moved (the `reason` of its event).
REASON_FAILURES = "consecutive_failures"
REASON_OPEN_ELAPSED = "open_elapsed"
REASON_TRIAL_SUCCEEDED = "trial_succeeded"
REASON_TRIAL_FAILED = "trial_failed"
REASON_WORKER_RECOVERED = "worker_recovered"

# The phrase a decode's answer carries when its KV transfer failed (vLLM's load-failure policy `fail`; the
# fake engines answer HTTP 500 "KV load failed: ..." or a gRPC INTERNAL with it).
KV_LOAD_FAILED = "kv load failed"

DEFAULT_OPEN_S = 60.0


@dataclass(frozen=True)
class BreakerConfig:
    """failure_threshold: consecutive own failures that open a worker's breaker (None: breaker off);
    open_s: how long an opened breaker keeps its worker out before one trial request may go."""

    failure_threshold: int | None = None
    open_s: float = DEFAULT_OPEN_S
    bugs: frozenset[str] = frozenset()  # test-only zoo switches (core.bugs) of what counts

    def __post_init__(self) -> None:
        if self.failure_threshold is not None and (
            isinstance(self.failure_threshold, bool) or self.failure_threshold < 1
        ):
            raise ValueError("circuit breaker failure threshold must be >= 1")
        if not self.open_s > 0:
            raise ValueError("circuit breaker open duration must be > 0")

    @property
    def enabled(self) -> bool:
        return self.failure_threshold is not None


# ---- reading --------------------------------------------------------------------------------------------


def breaker_admits(worker: Worker, now: float) -> bool:
    """Whether a request may be sent to `worker` now, as far as its breaker is concerned (its status is the
    picker's business)."""
    b = worker.runtime.breaker
    if b.state is BREAKER_CLOSED:
        return True
    if b.state is BREAKER_OPEN and (b.open_until is None or now < b.open_until):
        return False
    return b.trial_request is None


def own_failure(worker: Worker, error: LegError, bugs: frozenset[str] = frozenset()) -> bool:
    """Whether a failed leg counts against the worker that ran it."""
    if NO_OUTLIER_EJECTION in bugs and error.status == 504:
        return False
    status = error.worker_status
    if status is None and error.delivery is Delivery.ANSWERED:
        # A driver that only knows the relayed status: a 4xx is relayed as is.
        status = error.status
    if status is not None and 400 <= status < 500:
        return False
    # A decode's failed KV load is its prefill's (or the path's) failure, not the decode's.
    if BREAKER_CHARGES_KV_FAILURE in bugs:
        return True
    return not (worker.spec.role is Role.DECODE and _kv_load_failed(error))


def _kv_load_failed(error: LegError) -> bool:
    return any(KV_LOAD_FAILED in m.casefold() for m in (error.worker_message, error.message) if m)


def recovered(before: Status, after: Status) -> bool:
    """A probe outcome that re-admits the worker: back to Ready from NotReady or Failed."""
    return after is Status.READY and before in (Status.NOT_READY, Status.FAILED)


# ---- steps ----------------------------------------------------------------------------------------------


def breaker_pick(worker: Worker, request_id: str, now: float) -> Effects:
    """`worker` was picked for `request_id`: an open breaker whose period ended goes half-open, and a
    half-open one gives this request its one trial."""
    out = Effects()
    b = worker.runtime.breaker
    if b.state is BreakerState.OPEN and b.open_until is not None and now >= b.open_until:
        _move(out, worker, BreakerState.HALF_OPEN, REASON_OPEN_ELAPSED)
    if b.state is BreakerState.HALF_OPEN and b.trial_request is None:
        b.trial_request = request_id
    return out


def breaker_release(worker: Worker, request_id: str) -> None:
    """`request_id` is done with `worker` without a verdict on it: free the trial it may hold."""
    b = worker.runtime.breaker
    if b.trial_request == request_id:
        b.trial_request = None


def breaker_success(worker: Worker, request_id: str, cfg: BreakerConfig) -> Effects:
    """`worker` served its leg of `request_id`."""
    out = Effects()
    if not cfg.enabled:
        return out
    b = worker.runtime.breaker
    if b.state is BreakerState.CLOSED:
        b.failures = 0
    elif b.state is BreakerState.HALF_OPEN and b.trial_request == request_id:
        b.failures = 0
        _move(out, worker, BreakerState.CLOSED, REASON_TRIAL_SUCCEEDED, request_id)
    return out


def breaker_failure(
    worker: Worker, request_id: str, error: LegError, now: float, cfg: BreakerConfig
) -> Effects:
    """`worker`'s leg of `request_id` failed with `error` at `now`; only its own failures count."""
    out = Effects()
    if not cfg.enabled:
        return out
    assert cfg.failure_threshold is not None
    if not own_failure(worker, error, cfg.bugs):
        breaker_release(worker, request_id)
        return out
    b = worker.runtime.breaker
    if b.state is BreakerState.CLOSED:
        b.failures += 1
        if b.failures >= cfg.failure_threshold:
            _open(out, worker, now, cfg, REASON_FAILURES, request_id, error.message)
    elif b.state is BreakerState.HALF_OPEN and b.trial_request == request_id:
        b.failures += 1
        _open(out, worker, now, cfg, REASON_TRIAL_FAILED, request_id, error.message)
    return out


def breaker_tick(workers: Iterable[Worker], now: float) -> Effects:
    """Open breakers whose period ended go half-open (so the worker API shows it without a request)."""
    out = Effects()
    for w in workers:
        b = w.runtime.breaker
        if b.state is BreakerState.OPEN and b.open_until is not None and now >= b.open_until:
            _move(out, w, BreakerState.HALF_OPEN, REASON_OPEN_ELAPSED)
    return out


def breaker_readmit(worker: Worker) -> Effects:
    """The worker came back to Ready after an outage (see recovered()): its breaker closes, its count
    restarts."""
    out = Effects()
    b = worker.runtime.breaker
    b.failures = 0
    if b.state is not BreakerState.CLOSED:
        _move(out, worker, BreakerState.CLOSED, REASON_WORKER_RECOVERED)
    return out


# ---- transitions ----------------------------------------------------------------------------------------


def _open(
    out: Effects, worker: Worker, now: float, cfg: BreakerConfig, reason: str, request_id: str, error: str
) -> None:
    worker.runtime.breaker.open_until = now + cfg.open_s
    _move(out, worker, BreakerState.OPEN, reason, request_id, error)
    out.warn(f"circuit breaker of {worker.id} ({worker.spec.url}) opened for {cfg.open_s:g}s: {reason} "
             f"({worker.runtime.breaker.failures}), last error: {error}")


def _move(
    out: Effects, worker: Worker, to: BreakerState, reason: str, request_id: str | None = None,
    error: str | None = None,
) -> None:
    b: BreakerRuntime = worker.runtime.breaker
    before = b.state
    b.state = to
    b.trial_request = None
    if to is not BreakerState.OPEN:
        b.open_until = None
    out.inc(BREAKER_TRANSITIONS_TOTAL, to=to.value)
    out.event("breaker", worker=worker.id, url=worker.spec.url, **{"from": before.value, "to": to.value},
              reason=reason, failures=b.failures, request_id=request_id, error=error)
