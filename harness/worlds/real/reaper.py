"""The harness side of `pdchaos.reaper`: one reaper process per harness process, told of every process
group the harness starts and of each one it has stopped, so that groups outlive a SIGKILLed harness only
for the moment the reaper needs to find them (see `pdchaos.reaper` for why PDEATHSIG is not enough)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from typing import IO

from harness.checkout import env_with_checkout
from pdchaos.reaper import MARKER_ENV


class GroupReaper:
    """Started at the first group it is told of; its stdin is the lifeline (the harness never closes it:
    the kernel does, when the harness exits)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: IO[bytes] | None = None
        # Held for the life of this process: a dropped Popen of a running child would be reported as a leak.
        self._proc: subprocess.Popen[bytes] | None = None
        self._broken = False

    def forked(self) -> None:
        """In a forked child (a process pool's worker): the parent's lifeline is not ours to hold. Keeping it
        open would keep the parent's reaper waiting after the parent died; the child starts its own."""
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe.fileno())  # not close(): that would flush the parent's buffered lines
        self._lock = threading.Lock()
        self._pipe, self._proc, self._broken = None, None, False

    def watch(self, pgid: int, marker: str) -> None:
        self._send(f"+{pgid} {marker}\n", start=True)

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}\n", start=False)

    def _send(self, line: str, start: bool) -> None:
        with self._lock:
            if self._pipe is None and start and not self._broken:
                self._proc = self._start()
                self._pipe = None if self._proc is None else self._proc.stdin
            if self._pipe is None:
                return
            try:
                self._pipe.write(line.encode())
                self._pipe.flush()
            except OSError:  # the reaper was killed: best effort, the other guarantees still hold
                self._pipe, self._broken = None, True

    @staticmethod
    def _start() -> subprocess.Popen[bytes] | None:
        # Not marked: a search for a run's leftover processes must not find the reaper of a live harness. This
        # checkout on its path (it may not be installed), and / as its folder (it must not hold the run's).
        env = env_with_checkout({k: v for k, v in os.environ.items() if k != MARKER_ENV})
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pdchaos.reaper"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=env, start_new_session=True, cwd="/",
            )
        except OSError:
            return None
        return proc


_REAPER = GroupReaper()
os.register_at_fork(after_in_child=_REAPER.forked)


def watch_group(pgid: int, marker: str) -> None:
    """Have the reaper kill group `pgid` (its members marked `marker`) if this process dies first."""
    _REAPER.watch(pgid, marker)


def forget_group(pgid: int) -> None:
    """Group `pgid` is stopped and reaped: the reaper must leave its id alone."""
    _REAPER.forget(pgid)
