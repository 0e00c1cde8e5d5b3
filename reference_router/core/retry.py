"""When a failed leg may run again on another worker of its role, and what a failed dispatch tells the router.

A leg is retried only when its failure proves the engine never saw the request (connection refused, connect
timeout, a gRPC channel that could not connect): a prefill that may have started computing must not run
twice, and a decode that may have started pulling KV must not get a second puller. Any other failure (an
answered error, a reset or timeout after the request was written) is final. Each retry goes to a Ready worker
of the same role not tried yet for this request, so a leg runs at most once per Ready worker, and never once
the request's deadline has passed.

A worker whose leg failed that way is marked suspect: the planner probes it at its next tick instead of
waiting out the interval, and selection avoids it while another Ready worker exists. The probe's outcome
(whichever it is) clears the mark, so a suspect worker's status still only moves through probes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from .workers import Status, Worker


class Delivery(StrEnum):
    """How far a failed leg's request got."""

    NOT_SENT = "not_sent"  # no connection was made: the engine never saw the request
    MAYBE_SENT = "maybe_sent"  # the connection broke or timed out after the request may have been written
    ANSWERED = "answered"  # the engine answered an error: it saw the request


# Why a leg is not retried (the `reason` of a RetryDecision with retry=False).
NO_RETRY_DELIVERED = "request_may_have_reached_engine"
NO_RETRY_NO_OTHER_WORKER = "no_other_ready_worker"
NO_RETRY_DEADLINE = "deadline_passed"
RETRY = "not_sent"


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    reason: str
    candidates: tuple[Worker, ...] = ()  # the workers the retry may go to (hand them to the leg's policy)


def decide_retry(
    delivery: Delivery, tried: Iterable[str], ready: Iterable[Worker], now: float, deadline: float
) -> RetryDecision:
    """Whether a leg that failed with `delivery` runs again; `tried` are the ids it already ran on, `ready`
    the Ready workers of its role now, `deadline` the request's (same clock as `now`)."""
    if delivery is not Delivery.NOT_SENT:
        return RetryDecision(False, NO_RETRY_DELIVERED)
    if now >= deadline:
        return RetryDecision(False, NO_RETRY_DEADLINE)
    done = set(tried)
    others = tuple(w for w in ready if w.id not in done and w.runtime.status is Status.READY)
    if not others:
        return RetryDecision(False, NO_RETRY_NO_OTHER_WORKER)
    return RetryDecision(True, RETRY, others)


def mark_suspect(worker: Worker, now: float) -> bool:
    """A leg to `worker` failed without reaching it: probe it at once. False (no change) when already marked
    or Draining (never probed again)."""
    rt = worker.runtime
    if rt.status is Status.DRAINING or rt.suspect_since is not None:
        return False
    rt.suspect_since = now
    return True


def avoid_suspects(candidates: list[Worker]) -> list[Worker]:
    """The candidates not marked suspect, or all of them when every one is."""
    clear = [w for w in candidates if w.runtime.suspect_since is None]
    return clear or candidates


# Bug retry_failed_requests: smg's defaults (5 attempts in all, 50 ms first backoff, x1.5, at most 30 s; its
# 20% jitter is left out so a run stays reproducible) and the statuses its retry treats as transient.
REQUEST_ATTEMPTS = 5
_FIRST_BACKOFF_S = 0.05
_BACKOFF_FACTOR = 1.5
_MAX_BACKOFF_S = 30.0
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def request_retry_backoff_s(
    attempts_done: int, status: int, failed: Delivery | None, transport_only: bool = False
) -> float | None:
    """Bugs retry_failed_requests / retry_transport_failures only: how long to wait before running a failed
    request again whole (None: answer the failure). Only a leg's failure is retried (`failed`: how far that
    leg got), not a request refused before any leg ran; `transport_only`: not when the engine answered the
    error itself. Correct: never; a leg is retried only when it never reached its engine (`decide_retry`)."""
    if failed is None or (transport_only and failed is Delivery.ANSWERED):
        return None
    if status not in RETRYABLE_STATUSES or attempts_done >= REQUEST_ATTEMPTS:
        return None
    return min(_FIRST_BACKOFF_S * _BACKOFF_FACTOR ** (attempts_done - 1), _MAX_BACKOFF_S)
