"""A synchronous driver of the core's health tick on a virtual clock, for tests that script an engine.

The decision sequence is the core's own (core.health_tick); this driver only answers every probe and
metadata read at once, at the tick's `now`.
"""

from __future__ import annotations

from collections.abc import Callable

from reference_router.core import (
    Effects,
    HealthConfig,
    MetadataRead,
    WorkerRegistry,
    on_identity_done,
    on_probe_done,
    on_reread_done,
    start_tick,
)


def tick(
    reg: WorkerRegistry,
    now: float,
    cfg: HealthConfig,
    healthy: bool,
    read: Callable[[float], MetadataRead],
    reads: list[float] | None = None,
) -> list[Effects]:
    """Run one tick at `now`: probes answer `healthy`, metadata reads answer `read(now)` (their times go to
    `reads`). Returns each probe's effects, in plan order (a status change among them)."""

    def answer() -> MetadataRead:
        if reads is not None:
            reads.append(now)
        return read(now)

    plan = start_tick(reg, now, cfg)
    results: list[Effects] = []
    for p in plan.probes:
        done = on_probe_done(p.worker, p.token, healthy, 0.0, now, cfg)
        results.append(done.effects)
        if done.reread_due:
            on_reread_done(p.worker, p.token, answer(), now, cfg)
    for i in plan.identity:
        on_identity_done(i.worker, i.token, answer(), now)
    return results
