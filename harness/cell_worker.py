"""A worker process that runs simulated cells for `harness.parallel`, and the parent's handle on it.

The parent starts `python -m harness.cell_worker <parent pid>` and talks to it over its stdin and stdout
with frames (4-byte big-endian length, then a pickle): a `CellJob` in, `(True, ScenarioResult)` or
`(False, traceback text)` out. The worker keeps its real stdout for frames only and points file
descriptor 1 at stderr, so whatever a cell prints cannot corrupt the stream. It ignores SIGINT (the parent
decides what a cancelled run does) and dies with its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pickle
import signal
import struct
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from harness.checkout import env_with_checkout
from harness.result import ScenarioResult
from harness.routers import RouterAdapter
from harness.runner import Cell, run_scenario
from harness.scenario import Scenario
from harness.worlds.real.backends import EngineChoice
from harness.worlds.sim.world import WALL_LIMIT_S

FRAME = struct.Struct(">I")
_PR_SET_PDEATHSIG = 1
CLOSE_WAIT_S = 5.0
# The longest a worker may take to answer one job: past the simulated world's own wall-clock limit (a cell
# that runs that long ends as an error, with its history). A worker silent this long is stopped or
# deadlocked: it is killed and the cell runs again in the parent.
ANSWER_LIMIT_S = WALL_LIMIT_S + 600.0


class WorkerError(RuntimeError):
    """The worker broke (died, answered something that is not a frame, or did not answer in time)."""


@dataclass
class CellJob:
    """One cell to run: `run_scenario`'s arguments."""

    scenario: Scenario
    cell: Cell
    out_dir: Path
    router: str | RouterAdapter = "reference"
    seed: int = 0
    run_id: str | None = None
    world: str = "real"
    settings: str | None = None
    check_determinism: bool = False
    # A backend spec (`fake`, `vllm`, `command:FILE`, `k8s:FILE`) or a parsed choice (a sweep's k8s table).
    engines: str | EngineChoice = "fake"
    # The cell will be in a report.html: its plot and tables are rendered where it ran.
    report_part: bool = False


async def run_job(job: CellJob, progress: Any = None) -> ScenarioResult:
    """One job, here (a worker process calls this too)."""
    return await run_scenario(
        job.scenario, job.cell.topology, job.cell.connector, job.cell.transport, job.router, job.out_dir,
        seed=job.seed, progress=progress, run_id=job.run_id, world=job.world, settings=job.settings,
        check_determinism=job.check_determinism, engines=job.engines, report_part=job.report_part,
    )


class CellWorker:
    """The parent's end: one worker process, started on the first job, one job at a time."""

    def __init__(self, answer_limit_s: float = ANSWER_LIMIT_S) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self.answer_limit_s = answer_limit_s

    async def _start(self) -> asyncio.subprocess.Process:
        env = env_with_checkout(os.environ)
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "harness.cell_worker", str(os.getpid()),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        )

    async def run(self, job: Any) -> Any:
        """The job's result; WorkerError when the worker could not give one."""
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await self._start()
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        data = pickle.dumps(job)
        try:
            async with asyncio.timeout(self.answer_limit_s):
                proc.stdin.write(FRAME.pack(len(data)) + data)
                await proc.stdin.drain()
                head = await proc.stdout.readexactly(FRAME.size)
                body = await proc.stdout.readexactly(FRAME.unpack(head)[0])
            ok, value = pickle.loads(body)
        except TimeoutError:
            raise WorkerError(f"cell worker {proc.pid} gave no answer in {self.answer_limit_s:g} s") from None
        except (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError) as e:
            raise WorkerError(f"cell worker {proc.pid} broke: {type(e).__name__}: {e}") from e
        if not ok:
            raise WorkerError(f"cell worker {proc.pid} failed:\n{value}")
        return value

    def kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    async def close(self) -> None:
        """End the worker: EOF on its stdin ends its loop; one that does not leave in time is killed."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), CLOSE_WAIT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


# ---------------------------------------------------------------- the worker's end


def _die_with(parent: int) -> bool:
    """Arm the parent-death signal; False when the parent is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == parent


def _read_frame(inp: BinaryIO) -> bytes | None:
    head = inp.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    body = inp.read(size)
    return body if len(body) == size else None


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer jobs until EOF."""
    while (data := _read_frame(inp)) is not None:
        try:
            answer: tuple[bool, Any] = (True, asyncio.run(run_job(pickle.loads(data))))
        except BaseException:  # a worker answers every job: the parent decides what a failure means
            answer = (False, traceback.format_exc())
        blob = pickle.dumps(answer)
        out.write(FRAME.pack(len(blob)) + blob)
        out.flush()


def main(argv: list[str]) -> int:
    if argv and not _die_with(int(argv[0])):
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
