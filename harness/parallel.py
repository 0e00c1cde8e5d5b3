"""Several independent cells at once (`--jobs N`): the pool behind `run_suite`, the matrix and the sweep.

A cell owns everything it touches (its own free ports, processes and folder; the embedded Toxiproxy is
shared per process and names its proxies per cell), so cells may overlap in time. How they overlap depends
on the world:

- real time: cells are mostly waiting on processes and sockets, so they share this process's event loop,
  at most N at a time;
- simulation: a cell is CPU-bound Python (simpy on a worker thread), and threads would only take turns on
  the GIL, so simulated cells run in worker processes (`harness.cell_worker`: a plain `python -m` child
  fed pickled jobs, rather than multiprocessing, whose spawn and forkserver modes re-run the caller's main
  script in every worker and whose fork mode copies a process that has threads).

The results come back in the order of the jobs whatever N is. A simulated cell replays exactly at any N
(same seed, same history, byte for byte). A real cell shares nothing with the others but the CPUs, and its
checkers judge timings (recovery bounds, prompt 503s), so the default N stays within the CPUs;
`bench/parallel_walltime.py` runs the default suite at several N and says whether any verdict moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import pickle
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.cell_worker import CellJob, CellWorker, WorkerError, run_job
from harness.result import ScenarioResult
from harness.routers import RouterAdapter
from harness.runner import Cell, cell_dir_name, expand_matrix, read_cell_result, update_latest
from harness.scenario import At, Scenario
from harness.topology import parse_topology
from harness.worlds.real.processes import shared_fork_server


def check_jobs(n: int) -> int:
    """ValueError for a job count that cannot be right."""
    if n < 1:
        raise ValueError(f"jobs must be at least 1, not {n}")
    return n


async def run_cells(jobs: Sequence[CellJob], n: int = 1, progress: Any = None,
                    reuse: bool = False) -> list[ScenarioResult]:
    """Run every job, at most `n` at once; results in the order of `jobs`. With n == 1 the cells run one
    after the other in this process, exactly as a plain sequence of `run_scenario` calls. `reuse`: a job
    whose folder already holds this cell's judged result (`runner.read_cell_result`) is not run again.
    The real cells of one run fork their engines and routers from one shared server (`shared_fork_server`)."""
    check_jobs(n)
    if not jobs:
        return []
    async with shared_fork_server(Path(jobs[0].out_dir).parent):
        return await _run_cells(jobs, n, progress, reuse)


async def _run_cells(jobs: Sequence[CellJob], n: int, progress: Any, reuse: bool) -> list[ScenarioResult]:
    if reuse:
        kept = {i: r for i, j in enumerate(jobs)
                if (r := read_cell_result(j.out_dir, j.scenario.name, j.cell, j.world)) is not None}
        ran = iter(await run_cells([j for i, j in enumerate(jobs) if i not in kept], n, progress))
        return [kept[i] if i in kept else next(ran) for i in range(len(jobs))]
    if n == 1 or len(jobs) <= 1:
        return [await run_job(job, progress) for job in jobs]
    sims = sum(1 for j in jobs if j.world == "sim")
    pool = _SimPool(min(n, sims)) if sims > 1 else None
    gate = asyncio.Semaphore(n)

    async def one(job: CellJob) -> ScenarioResult:
        async with gate:
            if pool is not None and job.world == "sim":
                return await pool.run(job, progress)
            return await run_job(job, progress)

    order = spread(jobs)
    started = {i: asyncio.ensure_future(one(jobs[i])) for i in order}
    tasks = [started[i] for i in range(len(jobs))]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        # Every real cell must get to tear its processes down before the caller reports.
        await asyncio.gather(*tasks, return_exceptions=True)
        if pool is not None:
            pool.kill()
        raise
    finally:
        if pool is not None:
            await pool.close()


def expected_s(job: CellJob) -> float:
    """A rough length of the cell, to start long ones first: its load (kept on after the last timed step
    for `after_heal_s`) plus a start-up share per engine."""
    s, w = job.scenario, job.scenario.workload
    timed = [st.when.t for st in s.timeline if isinstance(st.when, At)]
    load = max(w.duration_s, s.min_duration_s, max(timed, default=0.0) + (w.after_heal_s or 0.0))
    shape = parse_topology(job.cell.topology)
    return load + STARTUP_PER_ENGINE_S * shape.engines


# What one more engine adds to a real cell's start-up and teardown on a small machine (measured: a 1p1d cell
# starts serving in about 1.4 s, a loaded 2p1d one in about 3 s).
STARTUP_PER_ENGINE_S = 0.5


def spread(jobs: Sequence[CellJob]) -> list[int]:
    """The order to start jobs in: one cell of each scenario in turn. Cells of one scenario run the same
    timeline, so side by side they would restart, respawn and load their engines at the same moments, and
    those bursts of process start-ups are what a real cell's timing checks feel on a small machine.

    Within that, the longest first (`expected_s`): scenarios by their longest cell, a scenario's cells by
    length. A long cell started last would run on alone after every other one ended, and the whole run
    would wait for it."""
    by_scenario: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        by_scenario.setdefault(job.scenario.name, []).append(i)
    length = [expected_s(j) for j in jobs]
    queues = [sorted(q, key=lambda i: -length[i]) for q in by_scenario.values()]
    queues.sort(key=lambda q: -length[q[0]])
    out: list[int] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


class _SimPool:
    """Worker processes for simulated cells (`harness.cell_worker`), started on first use and reused."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._idle: asyncio.Queue[CellWorker] = asyncio.Queue()
        self._all: list[CellWorker] = []

    async def _take(self) -> CellWorker:
        if self._idle.empty() and len(self._all) < self.workers:
            worker = CellWorker()
            self._all.append(worker)
            return worker
        return await self._idle.get()

    async def run(self, job: CellJob, progress: Any) -> ScenarioResult:
        portable = _portable(job)
        if portable is None:
            # A scenario built with something that cannot cross a process boundary (a lambda in its
            # parameters, say) still runs, here, on a thread as before.
            return await run_job(job, progress)
        worker = await self._take()
        try:
            result = await worker.run(portable)
        except WorkerError:
            # A worker that broke (killed, out of memory, silent past its limit) costs its cell a second
            # try, here.
            worker.kill()
            self._all.remove(worker)
            await worker.close()
            return await run_job(job, progress)
        self._idle.put_nowait(worker)
        if progress is not None and hasattr(progress, "finish"):
            with contextlib.suppress(Exception):
                progress.finish(job.out_dir, result.status or "unknown")
        return result

    def kill(self) -> None:
        """Stop the workers now: a cancelled run must not leave simulations running to their end."""
        for w in self._all:
            w.kill()

    async def close(self) -> None:
        for w in self._all:
            await w.close()
        self._all.clear()


def _portable(job: CellJob) -> CellJob | None:
    """The job as a worker process can take it (the simulated world runs the reference router's core, so a
    router adapter travels as its name), or None when it does not pickle."""
    router = job.router.name if isinstance(job.router, RouterAdapter) else job.router
    out = replace(job, router=router)
    try:
        pickle.dumps(out)
    except Exception:
        return None
    return out


def own_adapter(router: str | RouterAdapter) -> str | RouterAdapter:
    """A cell's own copy of an adapter: an adapter keeps the state of the cell it launched (the workers it
    registered, the operator beside a gateway), and real-time cells overlap on one event loop. A spec string
    is made into an adapter by each cell anyway."""
    return copy.copy(router) if isinstance(router, RouterAdapter) else router


def repeat_dir_name(name: str, run: int, repeat: int) -> str:
    """A cell's folder; with repeats, one per run (`...__run2`)."""
    return name if repeat <= 1 else f"{name}__run{run}"


async def run_suite(
    scenarios: Iterable[Scenario],
    matrix: Iterable[tuple[Scenario, Cell]] | dict[str, Sequence[str]] | None,
    out_dir: str | os.PathLike[str],
    router: str | RouterAdapter = "reference",
    seed: int = 0,
    progress: Any = None,
    world: str = "real",
    settings: str | None = None,
    check_determinism: bool = False,
    jobs: int = 1,
    reuse: bool = False,
    engines: str = "fake",
    repeat: int = 1,
    report_parts: bool = False,
) -> list[ScenarioResult]:
    """Run every cell into `out_dir/<scenario>__<cell>/`, at most `jobs` at once (`harness.parallel`;
    results in cell order whatever `jobs` is), and point `out_dir/../latest` at out_dir. `repeat` > 1 runs
    each cell that many times, into `.../<scenario>__<cell>__run<i>/`, its runs next to each other in the
    results (`harness.races.fold_repeats` folds them).
    `matrix`: explicit (scenario, cell) pairs, or a dict with optional keys `topologies`, `connectors`,
    `transports` filtering each scenario's own matrix (None: all of it). `report_parts`: a report.html
    will show the cells (`reports.cell_part`)."""
    run_dir = Path(out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local folder, once per suite
    update_latest(run_dir)
    scen = list(scenarios)
    if matrix is None or isinstance(matrix, dict):
        m = matrix or {}
        cells = expand_matrix(scen, m.get("topologies"), m.get("connectors"), m.get("transports"))
    else:
        cells = list(matrix)
    run_id = re.sub(r"[^A-Za-z0-9_-]", "", run_dir.name[-12:] or uuid.uuid4().hex[:8])
    work = [
        CellJob(s, cell, run_dir / repeat_dir_name(cell_dir_name(s.name, cell), i, repeat),
                router=own_adapter(router), seed=seed, run_id=run_id,
                world=world, settings=settings, check_determinism=check_determinism, engines=engines,
                report_part=report_parts)
        for s, cell in cells for i in range(1, repeat + 1)
    ]
    return await run_cells(work, jobs, progress, reuse=reuse)
