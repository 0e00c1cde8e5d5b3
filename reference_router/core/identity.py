"""Restart detection that needs no failed probe (bug #13).

An engine restarted on the same address between two probes passes every probe, so the status machine never
sees it and the engine-id gate never re-reads: the router keeps minting the dead id. The identity check is a
low-rate read of the same metadata (gRPC GetServerInfo, or the Mooncake bootstrap `/query`) on Ready PD
Mooncake workers; a restart shows as a changed engine id or as `uptime_seconds` going backwards.

Schedule: every identity_check_interval_s per worker, counted from the worker's last identity observation (a
complete metadata read counts as one). A worker not yet observed since it became Ready is first due at a
per-worker phase in (0, interval] after ready_since, so workers promoted together are spread out instead of
all being due at once; the planner also caps how many checks run at once.

Bound: a restart at time t is flagged by t + identity_check_interval_s + probe_timeout_s (the next check is
due within one interval; the read is bounded by the probe timeout), provided the planner has a free slot.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import StrEnum

from .bugs import NO_IDENTITY_CHECK, STALE_ENGINE_ID
from .config import HealthConfig
from .workers import MOONCAKE, READY, Worker, WorkerRuntime


class IdentityKind(StrEnum):
    SAME = "same"
    ID_CHANGED = "id_changed"
    UPTIME_BACKWARDS = "uptime_backwards"
    FIRST = "first"  # nothing to compare with yet: this read is the baseline
    INCONCLUSIVE = "inconclusive"  # no id and no uptime to compare


@dataclass(frozen=True)
class IdentityVerdict:
    kind: IdentityKind
    engine_id: str | None
    uptime_s: float | None
    now: float

    @property
    def restarted(self) -> bool:
        return self.kind in (IdentityKind.ID_CHANGED, IdentityKind.UPTIME_BACKWARDS)


def identity_phase(worker_id: str) -> float:
    """A stable per-worker fraction in (0, 1] that staggers first checks."""
    return (zlib.crc32(worker_id.encode()) % 1000 + 1) / 1000.0


def identity_check_eligible(worker: Worker, cfg: HealthConfig) -> bool:
    """Ready PD Mooncake workers (none under bugs stale_engine_id, which never re-reads, and
    no_identity_check)."""
    return (
        STALE_ENGINE_ID not in cfg.bugs
        and NO_IDENTITY_CHECK not in cfg.bugs
        and worker.spec.is_pd
        and worker.connector is MOONCAKE
        and worker.runtime.status is READY
    )


def next_identity_check_at(worker: Worker, cfg: HealthConfig) -> float | None:
    """When the worker's next identity check is due; None when it is not eligible."""
    if not identity_check_eligible(worker, cfg):
        return None
    rt = worker.runtime
    if rt.last_identity_check_at is not None:
        return rt.last_identity_check_at + cfg.identity_check_interval_s
    if rt.ready_since is None:
        return None
    return rt.ready_since + cfg.identity_check_interval_s * identity_phase(worker.id)


def identity_check_in_flight(worker: Worker, now: float, cfg: HealthConfig) -> bool:
    """A started check holds its slot until it ends or for at most the probe timeout."""
    since = worker.runtime.identity_in_flight_since
    return since is not None and now - since < cfg.probe_timeout_s


def identity_check_due(worker: Worker, now: float, cfg: HealthConfig) -> bool:
    """Whether to run an identity check on this worker now (eligible, due, none running, no probe running)."""
    due_at = next_identity_check_at(worker, cfg)
    if due_at is None or now < due_at:
        return False
    if identity_check_in_flight(worker, now, cfg):
        return False
    return worker.runtime.probe_in_flight_since is None


def begin_identity_check(worker: Worker, now: float) -> int:
    """Mark a check as started; returns its token, which tells its answer from a late one of an older one."""
    worker.runtime.identity_seq += 1
    worker.runtime.identity_in_flight_since = now
    return worker.runtime.identity_seq


def identity_check_current(worker: Worker, token: int) -> bool:
    """Whether the check `token` is still the one in flight (its answer is to be applied)."""
    rt = worker.runtime
    return token == rt.identity_seq and rt.identity_in_flight_since is not None


def observe_identity(
    runtime: WorkerRuntime, engine_id: str | None, uptime_s: float | None, now: float
) -> IdentityVerdict:
    """Compare one identity read with what the runtime knows (pure: the runtime is not changed)."""
    prev_id, prev_up = runtime.engine_id, runtime.last_uptime_s
    new_id = engine_id or None
    if new_id is not None and prev_id is not None and new_id != prev_id:
        kind = IdentityKind.ID_CHANGED
    elif uptime_s is not None and prev_up is not None and uptime_s < prev_up:
        kind = IdentityKind.UPTIME_BACKWARDS
    elif new_id is None and uptime_s is None:
        kind = IdentityKind.INCONCLUSIVE
    elif (new_id is not None and prev_id is None) or (uptime_s is not None and prev_up is None):
        kind = IdentityKind.FIRST
    else:
        kind = IdentityKind.SAME
    return IdentityVerdict(kind, new_id, uptime_s, now)


def apply_identity(worker: Worker, verdict: IdentityVerdict) -> None:
    """Record a verdict: new baseline and clock; a changed id takes force (confirmed); uptime going backwards
    with no new id to take leaves the id unconfirmed, so the next successful probe re-reads it."""
    rt = worker.runtime
    rt.identity_in_flight_since = None
    rt.last_identity_check_at = verdict.now
    if verdict.uptime_s is not None:
        rt.last_uptime_s = verdict.uptime_s
    if verdict.engine_id is not None:
        rt.engine_id = verdict.engine_id
        rt.engine_id_confirmed = True
    elif verdict.kind is IdentityKind.UPTIME_BACKWARDS:
        rt.engine_id_confirmed = False


def identity_check_failed(worker: Worker, now: float) -> None:
    """A check that errored or timed out: free it and try again one interval later (probes cover outages)."""
    worker.runtime.identity_in_flight_since = None
    worker.runtime.last_identity_check_at = now
