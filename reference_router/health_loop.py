"""The asyncio shell of the health loop: ticks, asks the core planner what to start, runs it, reports.

The core decides everything (which workers are due, how many slots are free, when a probe overran, what a
probe or a read does to a worker). This module only starts tasks, applies deadlines and emits events. A task
whose probe the planner expired is cancelled: its answer would be ignored anyway (stale token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from .core import (
    METADATA_NO_DEADLINE,
    EngineIdDecision,
    HealthConfig,
    ProbeResult,
    ReadOutcome,
    Worker,
    WorkerRegistry,
    apply_identity,
    begin_identity_check,
    begin_probe,
    expire_probe,
    finish_probe,
    finish_reread,
    identity_check_failed,
    observe_identity,
    plan_probes,
)
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
        # Ticks fine enough to start probes on schedule and to notice overruns soon after they happen.
        self.tick_s = max(0.01, min(1.0, cfg.interval_s / 10, cfg.probe_timeout_s / 4))

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
        now = self.clock()
        plan = plan_probes(self.registry.all(), now, self.cfg)
        for w in plan.expired:
            self._expire(w, now)
        for w in plan.probe:
            token = begin_probe(w, now)
            self._tasks[w.id] = asyncio.create_task(self._probe(w, token), name=f"probe-{w.id}")
        for w in plan.identity:
            begin_identity_check(w, now)
            self._identity_tasks[w.id] = asyncio.create_task(self._identity(w), name=f"identity-{w.id}")

    def forget(self, worker_id: str) -> None:
        for tasks in (self._tasks, self._identity_tasks):
            task = tasks.pop(worker_id, None)
            if task is not None:
                task.cancel()

    def _expire(self, worker: Worker, now: float) -> None:
        task = self._tasks.pop(worker.id, None)
        if task is not None:
            task.cancel()
        was_confirmed = worker.runtime.engine_id_confirmed
        expired = expire_probe(worker, now, self.cfg)
        if expired is None:
            return
        if expired.probe is not None:
            self._report_probe(worker, expired.probe, self.cfg.probe_slot_s)
        if expired.reread is not None:
            self._report_read(
                worker, expired.reread, ReadOutcome.TIMEOUT.value, self.cfg.probe_timeout_s, was_confirmed
            )

    async def _probe(self, worker: Worker, token: int) -> None:
        t0 = self.clock()
        ok = await self.prober.probe(worker, self.cfg.probe_timeout_s)
        result = finish_probe(worker, token, ok, self.clock(), self.cfg)
        if result is None:
            return
        self._report_probe(worker, result, self.clock() - t0)
        if not result.reread_due:
            return
        # Bug #2 put back: the read inside the probe gets no deadline, so a hung read holds the slot forever.
        deadline = None if METADATA_NO_DEADLINE in self.cfg.bugs else self.cfg.probe_timeout_s
        read = await self.prober.read_metadata(worker, deadline)
        was_confirmed = worker.runtime.engine_id_confirmed
        decision = finish_reread(worker, token, read, self.clock(), self.cfg)
        if decision is not None:
            self._report_read(worker, decision, read.outcome.value, read.duration_s, was_confirmed)

    async def _identity(self, worker: Worker) -> None:
        try:
            read = await self.prober.read_metadata(worker, self.cfg.probe_timeout_s)
            now = self.clock()
            if read.outcome is not ReadOutcome.COMPLETE:
                identity_check_failed(worker, now)
                outcome = f"identity_{read.outcome.value}"
                self.metrics.inc("pdchaos_router_metadata_reads_total", outcome=outcome)
                return
            before_id, before_conf = worker.runtime.engine_id, worker.runtime.engine_id_confirmed
            verdict = observe_identity(worker.runtime, read.engine_id, read.uptime_s, now)
            apply_identity(worker, verdict)
            self.metrics.inc("pdchaos_router_metadata_reads_total", outcome="identity_" + verdict.kind.value)
            if verdict.restarted or worker.runtime.engine_id != before_id:
                self.events.emit(
                    "engine_id", worker=worker.id, url=worker.spec.url, old=before_id,
                    new=worker.runtime.engine_id, confirmed=worker.runtime.engine_id_confirmed,
                    reason=f"identity check: {verdict.kind.value}",
                )
            elif worker.runtime.engine_id_confirmed != before_conf:
                self.events.emit(
                    "engine_id", worker=worker.id, url=worker.spec.url, old=before_id, new=before_id,
                    confirmed=worker.runtime.engine_id_confirmed, reason="identity check",
                )
        finally:
            if worker.runtime.identity_in_flight_since is not None:
                identity_check_failed(worker, self.clock())
            self._identity_tasks.pop(worker.id, None)

    def _report_probe(self, worker: Worker, result: ProbeResult, duration_s: float) -> None:
        self.metrics.inc("pdchaos_router_probes_total", outcome="ok" if result.ok else "failed")
        self.events.emit("probe", worker=worker.id, url=worker.spec.url, ok=result.ok,
                         duration_s=round(duration_s, 6))
        if result.changed:
            self.events.emit("status_change", worker=worker.id, url=worker.spec.url,
                             **{"from": result.status_before.value, "to": result.status_after.value})

    def _report_read(
        self, worker: Worker, decision: EngineIdDecision, outcome: str, duration_s: float, was_confirmed: bool
    ) -> None:
        self.metrics.inc("pdchaos_router_metadata_reads_total", outcome=decision.event_outcome)
        self.events.emit("metadata_read", worker=worker.id, url=worker.spec.url,
                         outcome=decision.event_outcome, read=outcome, duration_s=round(duration_s, 6))
        if decision.changed or decision.confirmed != was_confirmed:
            self.events.emit("engine_id", worker=worker.id, url=worker.spec.url, old=decision.previous,
                             new=decision.engine_id, confirmed=decision.confirmed, reason=decision.reason)
