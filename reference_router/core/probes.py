"""The probe lifecycle on one worker: start, outcome, optional engine-id re-read, and expiry.

A probe holds its worker's slot from begin_probe() until finish_probe() (no re-read due) or finish_reread().
Each step is bounded by the probe timeout, so a slot is never held past cfg.probe_slot_s: past that the
planner reports the worker as expired and expire_probe() frees the slot, counting an overrun probe as failed
and an overrun re-read as a timed-out read. Tokens make a late answer from an expired probe a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

from .bugs import METADATA_NO_DEADLINE
from .config import HealthConfig
from .engine_id import EngineIdDecision, MetadataRead, ReadOutcome, apply_metadata_read, reread_due_for
from .health import next_status
from .workers import ProbeStage, Status, Worker


@dataclass(frozen=True)
class ProbeResult:
    """What one finished probe did; when `reread_due` the slot stays held until finish_reread()."""

    worker_id: str
    ok: bool
    status_before: Status
    status_after: Status
    reread_due: bool

    @property
    def changed(self) -> bool:
        return self.status_before is not self.status_after


@dataclass(frozen=True)
class Expired:
    """An overrun probe (or re-read) whose slot expire_probe() freed; exactly one of the two is set."""

    worker_id: str
    probe: ProbeResult | None = None
    reread: EngineIdDecision | None = None


def begin_probe(worker: Worker, now: float) -> int:
    """Mark a probe as started; returns its token for finish_probe()/finish_reread()."""
    rt = worker.runtime
    rt.probe_seq += 1
    rt.probe_in_flight_since = now
    rt.probe_stage = ProbeStage.PROBE
    return rt.probe_seq


def probe_overran(worker: Worker, now: float, cfg: HealthConfig) -> bool:
    """True when a started probe has held its slot past cfg.probe_slot_s (never with bug
    metadata_no_deadline: the slot is then lost for as long as the read hangs, which is what the bug does)."""
    since = worker.runtime.probe_in_flight_since
    if since is None or METADATA_NO_DEADLINE in cfg.bugs:
        return False
    return now - since >= cfg.probe_slot_s


def probe_in_flight(worker: Worker, now: float, cfg: HealthConfig) -> bool:
    """True while a started probe still holds its slot."""
    return worker.runtime.probe_in_flight_since is not None and not probe_overran(worker, now, cfg)


def _current(worker: Worker, token: int, stage: ProbeStage) -> bool:
    rt = worker.runtime
    return token == rt.probe_seq and rt.probe_in_flight_since is not None and rt.probe_stage is stage


def _free(worker: Worker) -> None:
    worker.runtime.probe_in_flight_since = None
    worker.runtime.probe_stage = None


def finish_probe(worker: Worker, token: int, ok: bool, now: float, cfg: HealthConfig) -> ProbeResult | None:
    """Apply a probe outcome; None (nothing changed) for a stale token or a worker that is Draining meanwhile
    (its slot is freed, its status untouched)."""
    if not _current(worker, token, ProbeStage.PROBE):
        return None
    rt = worker.runtime
    # A probe started after a request leg failed to reach the worker answers that suspicion; one started
    # before it may have passed just ahead of the fault, so the worker stays due for another at once.
    if rt.suspect_since is not None and rt.probe_in_flight_since is not None \
            and rt.probe_in_flight_since >= rt.suspect_since:
        rt.suspect_since = None
    rt.last_probe_at = now
    before = rt.status
    if before is Status.DRAINING:
        _free(worker)
        return None
    after, counters = next_status(before, rt.counters, ok, cfg)
    rt.status, rt.counters = after, counters
    if after is Status.READY and before is not Status.READY:
        rt.ready_since = now
    elif after is not Status.READY:
        rt.ready_since = None
    due = ok and reread_due_for(worker, before, cfg)
    if due:
        rt.probe_stage = ProbeStage.REREAD
    else:
        _free(worker)
    return ProbeResult(worker.id, ok, before, after, due)


def finish_reread(
    worker: Worker, token: int, read: MetadataRead, now: float, cfg: HealthConfig
) -> EngineIdDecision | None:
    """Apply the re-read that followed probe `token` and free the slot; None for a stale token."""
    if not _current(worker, token, ProbeStage.REREAD):
        return None
    _free(worker)
    return apply_metadata_read(worker, read, now, cfg)


def expire_probe(worker: Worker, now: float, cfg: HealthConfig) -> Expired | None:
    """Free the slot of a probe that overran; None when there is none to expire."""
    if not probe_overran(worker, now, cfg):
        return None
    rt = worker.runtime
    if rt.probe_stage is ProbeStage.REREAD:
        decision = finish_reread(worker, rt.probe_seq, MetadataRead(ReadOutcome.TIMEOUT), now, cfg)
        return Expired(worker.id, reread=decision)
    result = finish_probe(worker, rt.probe_seq, False, now, cfg)
    if result is None:  # went Draining while probing: the slot is freed, nothing else to report
        return None
    return Expired(worker.id, probe=result)


def set_draining(worker: Worker) -> Status:
    """Move a worker to Draining (never probed, never transitions again); returns the status it had."""
    before = worker.runtime.status
    worker.runtime.status = Status.DRAINING
    worker.runtime.ready_since = None
    return before
