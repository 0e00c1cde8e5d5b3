"""One health-loop tick as pure steps: what to start now, and what each answer does and tells.

A driver (the asyncio HealthLoop, a simulated world, a test) runs the same sequence, every tick_period_s(cfg):

    plan = start_tick(workers, now, cfg)
    record plan.effects; drop whatever still runs for plan.expired (their slots were freed already)
    each s in plan.probes: probe under s.timeout_s; done = on_probe_done(s.worker, s.token, ok, took_s, now,
        cfg)
        when done.reread_due: read metadata under done.reread_timeout_s (None: no deadline), then
        on_reread_done(s.worker, s.token, read, now, cfg)
    each s in plan.identity: read metadata under s.timeout_s; on_identity_done(s.worker, s.token, read, now)
        (a check that ends with no read at all: abandon_identity_check)

Circuit breakers (core.breaker) ride on the same steps: start_tick() moves open breakers whose period
ended to half-open, and on_probe_done() closes the breaker of a worker it promotes back to Ready from
NotReady or Failed. Neither needs the breaker's settings.

Every step returns the Effects to record. Tokens make a late answer (its probe expired, a newer check
started) a no-op with no effects, so a driver need not guard against them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .breaker import breaker_readmit, breaker_tick, recovered
from .bugs import BREAKER_NO_READMIT, METADATA_NO_DEADLINE
from .config import HealthConfig
from .effects import Effects
from .engine_id import EngineIdDecision, MetadataRead, ReadOutcome
from .health_records import record_identity, record_identity_failed, record_probe, record_read
from .identity import (
    IdentityVerdict,
    apply_identity,
    begin_identity_check,
    identity_check_current,
    identity_check_failed,
    observe_identity,
)
from .planner import plan_probes
from .probes import begin_probe, expire_probe, finish_probe, finish_reread
from .workers import Worker


@dataclass(frozen=True)
class ProbeStart:
    """Probe `worker` under `timeout_s`; hand the answer to on_probe_done() with `token`."""

    worker: Worker
    token: int
    timeout_s: float


@dataclass(frozen=True)
class IdentityStart:
    """Read `worker`'s metadata under `timeout_s`; hand it to on_identity_done() with `token`."""

    worker: Worker
    token: int
    timeout_s: float


@dataclass(frozen=True)
class TickPlan:
    probes: tuple[ProbeStart, ...] = ()
    identity: tuple[IdentityStart, ...] = ()
    expired: tuple[Worker, ...] = ()  # probes (or re-reads) that overran: their slots are free already
    effects: Effects = field(default_factory=Effects)


@dataclass(frozen=True)
class ProbeDone:
    """A probe's answer applied (no effects: a stale token, or the worker went Draining meanwhile). When
    `reread_due` the slot stays held until on_reread_done()."""

    effects: Effects
    reread_due: bool = False
    reread_timeout_s: float | None = None  # when reread_due; None: no deadline (bug metadata_no_deadline)


@dataclass(frozen=True)
class RereadDone:
    decision: EngineIdDecision | None  # None: a stale token (the re-read expired meanwhile)
    effects: Effects


@dataclass(frozen=True)
class IdentityDone:
    verdict: IdentityVerdict | None  # None: a stale token, or a read that did not complete
    effects: Effects


def tick_period_s(cfg: HealthConfig) -> float:
    """How often to tick: fine enough to start probes on schedule and to notice overruns soon after."""
    return max(0.01, min(1.0, cfg.interval_s / 10, cfg.probe_timeout_s / 4))


def reread_timeout_s(cfg: HealthConfig) -> float | None:
    """The re-read rides inside the probe, under the probe timeout; bug #2 put back gives it no deadline, so
    a hung read holds the slot forever."""
    return None if METADATA_NO_DEADLINE in cfg.bugs else cfg.probe_timeout_s


def start_tick(workers: Iterable[Worker], now: float, cfg: HealthConfig) -> TickPlan:
    """Expire overrun probes, then begin the probes and identity checks due now (within the free slots)."""
    workers = list(workers)
    plan = plan_probes(workers, now, cfg)
    out = breaker_tick(workers, now)
    for w in plan.expired:
        was_confirmed = w.runtime.engine_id_confirmed
        expired = expire_probe(w, now, cfg)
        if expired is None:
            continue
        if expired.probe is not None:
            record_probe(out, w, expired.probe, cfg.probe_slot_s)
        if expired.reread is not None:
            record_read(out, w, expired.reread, ReadOutcome.TIMEOUT.value, cfg.probe_timeout_s, was_confirmed)
    probes = tuple(ProbeStart(w, begin_probe(w, now), cfg.probe_timeout_s) for w in plan.probe)
    identity = tuple(
        IdentityStart(w, begin_identity_check(w, now), cfg.probe_timeout_s) for w in plan.identity
    )
    return TickPlan(probes, identity, tuple(plan.expired), out)


def on_probe_done(
    worker: Worker, token: int, ok: bool, duration_s: float, now: float, cfg: HealthConfig
) -> ProbeDone:
    """Apply a probe's answer (any failure, including its own timeout, is ok=False)."""
    result = finish_probe(worker, token, ok, now, cfg)
    out = Effects()
    if result is None:
        return ProbeDone(out)
    record_probe(out, worker, result, duration_s)
    if recovered(result.status_before, result.status_after) and BREAKER_NO_READMIT not in cfg.bugs:
        out.extend(breaker_readmit(worker))
    if not result.reread_due:
        return ProbeDone(out)
    return ProbeDone(out, reread_due=True, reread_timeout_s=reread_timeout_s(cfg))


def on_reread_done(
    worker: Worker, token: int, read: MetadataRead, now: float, cfg: HealthConfig
) -> RereadDone:
    """Apply the re-read that followed probe `token`; `read.duration_s` goes into its record."""
    was_confirmed = worker.runtime.engine_id_confirmed
    decision = finish_reread(worker, token, read, now, cfg)
    out = Effects()
    if decision is not None:
        record_read(out, worker, decision, read.outcome.value, read.duration_s, was_confirmed)
    return RereadDone(decision, out)


def on_identity_done(worker: Worker, token: int, read: MetadataRead, now: float) -> IdentityDone:
    """Apply an identity check's read: a restart takes force; an incomplete read retries an interval later."""
    out = Effects()
    if not identity_check_current(worker, token):
        return IdentityDone(None, out)
    if read.outcome is not ReadOutcome.COMPLETE:
        identity_check_failed(worker, now)
        record_identity_failed(out, read.outcome.value)
        return IdentityDone(None, out)
    rt = worker.runtime
    before_id, before_confirmed = rt.engine_id, rt.engine_id_confirmed
    verdict = observe_identity(rt, read.engine_id, read.uptime_s, now)
    apply_identity(worker, verdict)
    record_identity(out, worker, verdict, before_id, before_confirmed)
    return IdentityDone(verdict, out)


def abandon_identity_check(worker: Worker, token: int, now: float) -> None:
    """A check that ended with no read at all (its task cancelled): free it, try again one interval later."""
    if identity_check_current(worker, token):
        identity_check_failed(worker, now)
