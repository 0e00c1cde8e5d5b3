"""A command template's command (kill, stop, pause, resume an engine elsewhere) leaves nothing behind: past
its time or when the run is cancelled, its whole process group goes, not only the shell."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from types import SimpleNamespace

from harness.worlds.real.command_engines import CommandFleet, CommandTemplates
from harness.worlds.real.processes import find_marked_processes
from pdchaos.waiting import poll_until


def _fleet(tmp_path: Path, timeout_s: float) -> SimpleNamespace:
    (tmp_path / "engines").mkdir()
    return SimpleNamespace(out_dir=tmp_path, paused=set(),
                           templates=CommandTemplates(start="true", command_timeout_s=timeout_s))


def _command(marker: str) -> str:
    # The shell starts a child that would outlive it (as an ssh or a kubectl would), then waits.
    return f"PDCHAOS_T={marker} sleep 300 & PDCHAOS_T={marker} sleep 300; wait"


async def _none_left(marker: str) -> bool:
    return bool(await poll_until(lambda: not find_marked_processes(marker), 5.0, interval_s=0.05))


async def test_a_command_past_its_time_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    marker = f"pdchaos-cmdtest-{uuid.uuid4().hex[:8]}"
    fleet = _fleet(tmp_path, 0.5)
    ok = await CommandFleet._run(fleet, "prefill-0", signal.SIGSTOP, _command(marker))  # type: ignore[arg-type]
    assert ok is False and "prefill-0" not in fleet.paused
    assert await _none_left(marker), find_marked_processes(marker)
    assert "# exit None" in (tmp_path / "engines" / "prefill-0.commands.log").read_text()


async def test_a_cancelled_run_kills_the_command_it_was_waiting_for(tmp_path: Path) -> None:
    marker = f"pdchaos-cmdtest-{uuid.uuid4().hex[:8]}"
    fleet = _fleet(tmp_path, 60.0)
    task = asyncio.ensure_future(CommandFleet._run(fleet, "decode-0", signal.SIGKILL, _command(marker)))  # type: ignore[arg-type]
    assert await poll_until(lambda: len(find_marked_processes(marker)) >= 2, 5.0, interval_s=0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await _none_left(marker), find_marked_processes(marker)


async def test_a_command_that_ends_in_time_says_its_exit(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 5.0)
    assert await CommandFleet._run(fleet, "prefill-0", signal.SIGSTOP, "true") is True  # type: ignore[arg-type]
    assert fleet.paused == {"prefill-0"}
    assert await CommandFleet._run(fleet, "prefill-0", signal.SIGCONT, "exit 3") is False  # type: ignore[arg-type]
    assert fleet.paused == {"prefill-0"}
    assert "# exit 3" in (tmp_path / "engines" / "prefill-0.commands.log").read_text()
