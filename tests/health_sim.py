"""One tick of the router core's health loop on a virtual clock, for tests that script an engine over time.

The same sequence the asyncio shell runs (plan, expire, probe, re-read, identity check), except that every
probe and metadata read answers at once.
"""

from __future__ import annotations

from collections.abc import Callable

from reference_router.core import (
    HealthConfig,
    MetadataRead,
    ProbeResult,
    WorkerRegistry,
    apply_identity,
    begin_identity_check,
    begin_probe,
    expire_probe,
    finish_probe,
    finish_reread,
    observe_identity,
    plan_probes,
)


def tick(
    reg: WorkerRegistry,
    now: float,
    cfg: HealthConfig,
    healthy: bool,
    read: Callable[[float], MetadataRead],
    reads: list[float] | None = None,
) -> list[ProbeResult | None]:
    """Run one tick at `now`: probes answer `healthy`, metadata reads answer `read(now)` (their times go to
    `reads`). Returns each probe's result, in plan order."""
    plan = plan_probes(reg, now, cfg)
    for ew in plan.expired:
        expire_probe(ew, now, cfg)
    results: list[ProbeResult | None] = []
    for pw in plan.probe:
        tok = begin_probe(pw, now)
        res = finish_probe(pw, tok, healthy, now, cfg)
        results.append(res)
        if res is not None and res.reread_due:
            if reads is not None:
                reads.append(now)
            finish_reread(pw, tok, read(now), now, cfg)
    for iw in plan.identity:
        begin_identity_check(iw, now)
        got = read(now)
        if reads is not None:
            reads.append(now)
        apply_identity(iw, observe_identity(iw.runtime, got.engine_id, got.uptime_s, now))
    return results
