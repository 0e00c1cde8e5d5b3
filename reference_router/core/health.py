"""The worker status state machine (DESIGN §2) and the probe lifecycle around it.

`next_status` is the whole state machine as one pure function. Choices the design leaves open, pinned by
tests/test_router_core_health.py:
- Counters are consecutive: a success zeroes failures and vice versa.
- Pending never goes NotReady; failures only add to the probes-while-pending count. At the probe that reaches
  10 x failure_threshold the worker is Failed even if that probe succeeded, unless that success completes
  success_threshold (a worker proven healthy on its last chance is promoted, not failed).
- Ready -> NotReady keeps counting failures: NotReady -> Failed when the consecutive failures since Ready
  reach 3 x failure_threshold (so 2 x failure_threshold more once NotReady).
- Any transition resets the counters, except Ready -> NotReady (its failures keep counting).
- Draining never transitions and its counters never move.
"""

from __future__ import annotations

from .bugs import FAILED_TERMINAL
from .config import HealthConfig
from .workers import Counters, Status


def next_status(
    status: Status, counters: Counters, probe_ok: bool, cfg: HealthConfig
) -> tuple[Status, Counters]:
    """Apply one probe outcome: (status, counters) -> (new status, new counters)."""
    if status is Status.DRAINING:
        return status, counters
    pending = counters.pending_probes
    if probe_ok:
        bumped = Counters(successes=counters.successes + 1, failures=0, pending_probes=pending)
    else:
        bumped = Counters(successes=0, failures=counters.failures + 1, pending_probes=pending)
    if status is Status.PENDING:
        bumped = Counters(bumped.successes, bumped.failures, counters.pending_probes + 1)
        if bumped.successes >= cfg.success_threshold:
            return Status.READY, Counters()
        if bumped.pending_probes >= cfg.pending_probe_cap:
            return Status.FAILED, Counters()
        return status, bumped
    if status is Status.READY:
        if bumped.failures >= cfg.failure_threshold:
            return Status.NOT_READY, Counters(failures=bumped.failures)
        return status, bumped
    if status is Status.NOT_READY:
        if bumped.successes >= cfg.success_threshold:
            return Status.READY, Counters()
        if bumped.failures >= cfg.not_ready_failure_cap:
            return Status.FAILED, Counters()
        return status, bumped
    # Failed is not terminal (bug #6): a worker restarted on the same address must rejoin.
    if FAILED_TERMINAL in cfg.bugs:
        return status, bumped
    if bumped.successes >= cfg.success_threshold:
        return Status.READY, Counters()
    return status, bumped
