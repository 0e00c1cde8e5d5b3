"""The worker process behind simulated cells at --jobs N: it answers a job, and one that stops answering
(stopped, deadlocked) is an error after its limit, never a run waiting for good."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from harness.cell_worker import CellJob, CellWorker, WorkerError
from harness.runner import Cell
from harness.suite import load_named


def _job(tmp_path: Path) -> CellJob:
    (scenario,) = load_named(["late_pull_after_kv_abort"])
    return CellJob(scenario, Cell("1p1d", "mooncake", "http"), tmp_path / "cell", world="sim")


async def test_a_worker_answers_a_simulated_cell(tmp_path: Path) -> None:
    worker = CellWorker()
    try:
        result = await worker.run(_job(tmp_path))
    finally:
        await worker.close()
    assert result.status == "pass" and result.world == "sim"
    assert (tmp_path / "cell" / "history.jsonl").stat().st_size > 0


async def test_a_worker_that_stops_answering_is_an_error_after_its_limit(tmp_path: Path) -> None:
    worker = CellWorker(answer_limit_s=1.0)
    started = asyncio.get_running_loop().create_future()
    real_start = worker._start

    async def start_then_stop() -> asyncio.subprocess.Process:
        proc = await real_start()
        os.kill(proc.pid, signal.SIGSTOP)  # as a debugger, a ^Z or a deadlock would leave it
        started.set_result(proc)
        return proc

    worker._start = start_then_stop  # type: ignore[method-assign]
    try:
        with pytest.raises(WorkerError, match="gave no answer in 1 s"):
            await asyncio.wait_for(worker.run(_job(tmp_path)), 30)
    finally:
        worker.kill()
        await worker.close()
    proc = started.result()
    assert proc.returncode is not None  # killed, reaped: nothing left of it
