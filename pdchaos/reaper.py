"""The group reaper: kills the process groups a harness process started once that process is gone.

PR_SET_PDEATHSIG takes a SIGKILLed harness's direct children with it, not what they started: a router
template that runs a wrapper script without `exec`, vLLM's engine-core workers. This small program outlives
the harness on purpose (its own session, no death signal). It reads lines on stdin:

    +PGID MARKER    a group the harness started (its members carry PDCHAOS_RUN_MARKER=MARKER; the marker is
                    the rest of the line)
    -PGID           that group was stopped and reaped by the harness: forget it

and when stdin ends (the harness exited, whichever way: the kernel closes its end of the pipe) it SIGKILLs
every live member of each group still listed that carries the group's marker, so a group id reused by
someone else since is never touched. It reaches what stays in those groups with the marker in its
environment: a process that starts a session of its own or clears its environment (`setsid`, `env -i`, a
container) is out of its sight. Standard library only.

    python -m pdchaos.reaper      (started by harness.worlds.real.reaper; not for people)
"""

from __future__ import annotations

import os
import signal
import sys

# The environment variable every process of a harness run carries (harness.worlds.real.processes).
MARKER_ENV = "PDCHAOS_RUN_MARKER"
# Rounds of the kill pass: a member that forked while the pass ran is found by the next one.
ROUNDS = 5


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def members(pgid: int, marker: str) -> list[int]:
    """Live pids of process group `pgid` whose environment carries the run marker `marker` (exactly: one
    environment entry, not a prefix of another)."""
    needle = b"\0" + f"{MARKER_ENV}={marker}".encode() + b"\0"
    found: list[int] = []
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc (not Linux): nothing can be told apart, so nothing is touched
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        stat = _read(f"/proc/{entry}/stat")
        fields = stat[stat.rfind(b")") + 2 :].split()
        # After the command name: state ppid pgrp ...
        if len(fields) < 3 or fields[0] == b"Z" or int(fields[2]) != pgid:
            continue
        if needle in b"\0" + _read(f"/proc/{entry}/environ"):
            found.append(int(entry))
    return found


def reap(groups: dict[int, str]) -> int:
    """SIGKILL what is left of `groups` (pgid -> marker); how many processes were signalled."""
    hit = 0
    for _ in range(ROUNDS):
        left = [pid for pgid, marker in groups.items() for pid in members(pgid, marker)]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                hit += 1
            except OSError:
                pass
    return hit


def apply(groups: dict[int, str], line: str) -> None:
    """One instruction line (see the module doc); anything else is ignored."""
    head, _, marker = line.rstrip("\r\n").partition(" ")
    try:
        if head.startswith("+") and marker:  # the marker is the rest of the line: it may hold spaces
            groups[int(head[1:])] = marker
        elif head.startswith("-"):
            groups.pop(int(head[1:]), None)
    except ValueError:
        pass


def main() -> int:
    # Terminal signals are the harness's business: this process must still be here when it has gone.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: dict[int, str] = {}
    for raw in sys.stdin.buffer:
        apply(groups, raw.decode("utf-8", "replace"))
    reap(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
