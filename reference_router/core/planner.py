"""Which workers the health loop should probe (and identity-check) now.

Slots: at most cfg.max_probes_in_flight probes, re-reads and identity checks run at once. A probe counts only
while it holds its slot (probes.probe_in_flight): one that overran cfg.probe_slot_s is reported in `expired`
and frees its slot, so a probe that never returns never starves the others (bug #2). Due workers are served
oldest-probe-first so none waits behind the others forever.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .config import HealthConfig
from .identity import identity_check_due, identity_check_in_flight
from .probes import probe_in_flight, probe_overran
from .workers import Status, Worker


@dataclass(frozen=True)
class ProbePlan:
    probe: list[Worker] = field(default_factory=list)
    identity: list[Worker] = field(default_factory=list)
    expired: list[Worker] = field(default_factory=list)  # call probes.expire_probe() on each
    in_flight: int = 0  # slots held after expiry, before the new work starts


def probe_due(worker: Worker, now: float, cfg: HealthConfig) -> bool:
    """Not Draining, no probe in flight, and never probed, probed at least interval_s ago, or suspect (a
    request leg could not reach it since: retry.mark_suspect)."""
    rt = worker.runtime
    if rt.status is Status.DRAINING or rt.probe_in_flight_since is not None:
        return False
    if rt.last_probe_at is None or rt.suspect_since is not None:
        return True
    return now - rt.last_probe_at >= cfg.interval_s


def plan_probes(
    workers: Iterable[Worker], now: float, cfg: HealthConfig, other_in_flight: int = 0
) -> ProbePlan:
    """The work to start now. Probe slots are counted from the workers' runtimes; `other_in_flight` is for
    slot users the runtimes do not show (0 when the server uses begin_probe/begin_identity_check for all).

    Workers in `expired` are not probed in the same plan: the caller expires them first; the next tick
    probes them when due."""
    ws = list(workers)
    expired = [w for w in ws if probe_overran(w, now, cfg)]
    held = other_in_flight
    held += sum(1 for w in ws if probe_in_flight(w, now, cfg))
    held += sum(1 for w in ws if identity_check_in_flight(w, now, cfg))
    free = max(0, cfg.max_probes_in_flight - held)
    due = [w for w in ws if probe_due(w, now, cfg)]
    due.sort(key=lambda w: (w.runtime.last_probe_at if w.runtime.last_probe_at is not None else float("-inf"),
                            w.id))
    probe = due[:free]
    free -= len(probe)
    chosen = {w.id for w in probe}
    ident = [w for w in ws if w.id not in chosen and identity_check_due(w, now, cfg)]
    ident.sort(key=lambda w: (w.runtime.last_identity_check_at or float("-inf"), w.id))
    ident = ident[:free]
    return ProbePlan(probe=probe, identity=ident, expired=expired, in_flight=held)
