"""Ports claimed host-wide: what keeps `pdchaos` runs side by side on one machine off each other's ports.

A port handed to a server that binds it later is free at the moment it is chosen, so another process
drawing from the same pool can choose it too; an engine restarting on its own ports leaves them free for its
down time, when any other run may take them. Each process therefore claims the ports it hands out in a
folder shared by the user's processes (`claims_dir()`: one file per port, naming its owner) and skips
ports a live process has claimed. Claims are made under an exclusive lock on that folder, so two processes
never both take one; a claim whose owner is gone (killed, crashed) is taken over. A process gives its claims
up when it exits, or when it forgets the ports (`release`). A claim names its owner by pid and start time,
so a pid the kernel has since given to another process does not keep the port.

Claims are advisory: a program that is not pdchaos does not read them (the pool lies below the kernel's
ephemeral range, where outgoing connections take their ports, for that reason). A folder that cannot be
used leaves a process with its own memory of the ports it handed out, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

# Overrides where the claims live (tests; users whose temporary folder is not shared by their runs).
CLAIMS_DIR_ENV = "PDCHAOS_PORT_CLAIMS"
_LOCK_NAME = ".lock"
_lock = threading.Lock()
_mine: set[int] = set()


def claims_dir() -> Path:
    chosen = os.environ.get(CLAIMS_DIR_ENV)
    if chosen:
        return Path(chosen)
    return Path(tempfile.gettempdir()) / f"pdchaos-ports-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _started(pid: int) -> str:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22); "" where unknown. With
    the pid it names one process for good: a pid the kernel gave again to another process is not the one
    that made a claim."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _claimant(pid: int) -> str:
    return f"{pid} {_started(pid)}".strip()


def _holder(path: Path) -> int | None:
    """The live process holding the claim at `path`, if any (a missing, unreadable or stale file: None)."""
    try:
        words = path.read_text(encoding="ascii").split()
        pid = int(words[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid <= 0 or not _alive(pid):
        return None
    if len(words) > 1 and words[1] != _started(pid):  # the pid was given to another process since
        return None
    return pid


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder / _LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def claim(candidates: Iterable[int], wanted: int, usable: Callable[[int], bool]) -> list[int] | None:
    """Up to `wanted` ports from `candidates` (in their order) that no other live process has claimed and
    `usable` accepts (e.g. bindable now), claimed for this process. None: the claims folder cannot be used
    (the caller chooses without it)."""
    folder = claims_dir()
    me = os.getpid()
    stamp = _claimant(me)
    got: list[int] = []
    try:
        with _lock, _locked(folder):
            for port in candidates:
                if len(got) >= wanted:
                    break
                path = folder / str(port)
                holder = _holder(path)
                if holder is not None and holder != me:
                    continue
                if not usable(port):
                    continue
                path.write_text(stamp, encoding="ascii")
                _mine.add(port)
                got.append(port)
    except OSError:
        return None
    return got


def release(ports: Iterable[int]) -> None:
    """Give up this process's claims on `ports` (the others' claims are left alone)."""
    folder = claims_dir()
    me = _claimant(os.getpid())
    with contextlib.suppress(OSError), _lock, _locked(folder):
        for port in list(ports):
            if port not in _mine:
                continue
            _mine.discard(port)
            path = folder / str(port)
            with contextlib.suppress(OSError):
                # A child forked without exec inherits `_mine`: only the claimant's own files go.
                if path.read_text(encoding="ascii").strip() == me:
                    path.unlink()


def _release_all() -> None:
    release(set(_mine))


atexit.register(_release_all)
