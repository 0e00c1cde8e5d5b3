"""The asyncio shell of the health loop: ticks, starts what the core's tick plan says, passes answers back.

Every decision and every record lives in `core.health_tick` (which workers are due, how many slots are free,
when a probe overran, what a probe or a read does to a worker and which events follow). This module only
starts tasks, applies the deadlines the core gives and records the effects it returns. A task whose probe
the core expired is cancelled: its answer would be ignored anyway (stale token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from .core import (
    Effects,
    HealthConfig,
    IdentityStart,
    ProbeStart,
    WorkerRegistry,
    abandon_identity_check,
    on_identity_done,
    on_probe_done,
    on_reread_done,
    start_tick,
    tick_period_s,
)
from .emit import emit
from .events import EventLog
from .metrics import Metrics
from .prober import Prober

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class HealthLoop:
    def __init__(
        self,
        registry: WorkerRegistry,
        cfg: HealthConfig,
        prober: Prober,
        events: EventLog,
        metrics: Metrics,
        clock: Clock = time.monotonic,
    ) -> None:
        self.registry = registry
        self.cfg = cfg
        self.prober = prober
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._identity_tasks: dict[str, asyncio.Task[None]] = {}
        self._runner: asyncio.Task[None] | None = None
        self.tick_s = tick_period_s(cfg)

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run(), name="health-loop")

    async def stop(self) -> None:
        tasks = [t for t in (self._runner, *self._tasks.values(), *self._identity_tasks.values()) if t]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self._identity_tasks.clear()

    async def _run(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a bug in one tick must not end health checking for good
                log.exception("health tick failed")
            await asyncio.sleep(self.tick_s)

    def probes_in_flight(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.done())

    def tick(self) -> None:
        plan = start_tick(self.registry.all(), self.clock(), self.cfg)
        for w in plan.expired:
            task = self._tasks.pop(w.id, None)
            if task is not None:
                task.cancel()
        self._record(plan.effects)
        for p in plan.probes:
            self._tasks[p.worker.id] = asyncio.create_task(self._probe(p), name=f"probe-{p.worker.id}")
        for i in plan.identity:
            self._identity_tasks[i.worker.id] = asyncio.create_task(
                self._identity(i), name=f"identity-{i.worker.id}"
            )

    def forget(self, worker_id: str) -> None:
        for tasks in (self._tasks, self._identity_tasks):
            task = tasks.pop(worker_id, None)
            if task is not None:
                task.cancel()

    def _record(self, effects: Effects) -> None:
        emit(effects, self.events, self.metrics, log)

    async def _probe(self, start: ProbeStart) -> None:
        worker, token = start.worker, start.token
        t0 = self.clock()
        ok = await self.prober.probe(worker, start.timeout_s)
        now = self.clock()
        done = on_probe_done(worker, token, ok, now - t0, now, self.cfg)
        self._record(done.effects)
        if not done.reread_due:
            return
        read = await self.prober.read_metadata(worker, done.reread_timeout_s)
        self._record(on_reread_done(worker, token, read, self.clock(), self.cfg).effects)

    async def _identity(self, start: IdentityStart) -> None:
        worker = start.worker
        try:
            read = await self.prober.read_metadata(worker, start.timeout_s)
            self._record(on_identity_done(worker, start.token, read, self.clock()).effects)
        finally:
            abandon_identity_check(worker, start.token, self.clock())
            if self._identity_tasks.get(worker.id) is asyncio.current_task():
                self._identity_tasks.pop(worker.id, None)
