"""Starting and signalling the fake's processes (containers and exec sessions).

Each process leads its own process group, so a signal to the group reaches whatever it forked (a
container's shell and the engine under it), and asks the kernel for SIGKILL when the fake dies
(`die_with_parent` in the fork), so a container never outlives a fake that was SIGKILLed and ran no
cleanup. The kernel ties that signal to the forking *thread*: the fake forks only from its event loop's
thread, which lives as long as the fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from pdchaos.forkserver import die_with_parent


async def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: Path,
                stdout: IO[Any] | int, stderr: IO[Any] | int) -> asyncio.subprocess.Process:
    """Start argv (resolved on env's PATH) in its own session. Raises OSError when it cannot be run."""
    return await asyncio.create_subprocess_exec(
        *argv, env=dict(env), cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=stderr,
        start_new_session=True, preexec_fn=functools.partial(die_with_parent, os.getpid()))


def killpg(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group; a group already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def exit_code(returncode: int) -> int:
    """A container's exit code as the runtime reports it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode

