"""The group reaper: what a SIGKILLed harness started is killed even when PDEATHSIG cannot reach it (a
grandchild: a wrapper script's child that was not `exec`ed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from harness.worlds.real.processes import MARKER_ENV, pid_alive
from pdchaos.waiting import poll_until_sync

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and PDEATHSIG")


def _group_with_a_grandchild(marker: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, MARKER_ENV: marker}
    return subprocess.Popen(["sh", "-c", "sleep 300 & wait"], env=env, start_new_session=True)


def _reaper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pdchaos.reaper"], stdin=subprocess.PIPE,
                            start_new_session=True)


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_the_reaper_kills_listed_groups_when_its_input_ends_and_only_those() -> None:
    marker = f"pdchaos-my run {uuid.uuid4().hex}"  # from `--out "runs/my run"`: spaces in it
    listed, forgotten, other_marker = groups = [_group_with_a_grandchild(marker) for _ in range(3)]
    try:
        assert poll_until_sync(lambda: all(_children(p.pid) for p in groups), 10)
        (grandchild,) = _children(listed.pid)
        reaper = _reaper()
        assert reaper.stdin is not None
        reaper.stdin.write(f"+{listed.pid} {marker}\n+{forgotten.pid} {marker}\n-{forgotten.pid}\n"
                           f"+{other_marker.pid} pdchaos-someone-else\nnonsense\n".encode())
        reaper.stdin.close()
        assert reaper.wait(10) == 0
        assert listed.wait(5) == -signal.SIGKILL
        assert poll_until_sync(lambda: not pid_alive(grandchild), 5)
        assert forgotten.poll() is None and other_marker.poll() is None  # forgotten; another run's marker
    finally:
        for p in groups:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


HARNESS = textwrap.dedent("""
    import asyncio, json, sys, time
    from pathlib import Path
    from harness.worlds.real.processes import ProcessSupervisor

    async def main():
        sup = ProcessSupervisor(Path(sys.argv[1]), marker=sys.argv[2])
        wrapper = ["sh", "-c", "sleep 300 & echo READY {} ; wait"]
        proc = await sup.spawn("wrapper", wrapper, ready_prefix="READY")
        print(json.dumps({"pid": proc.pid}), flush=True)
        await asyncio.sleep(300)

    asyncio.run(main())
""")


def test_a_sigkilled_harness_takes_its_childs_children_along(tmp_path: Path) -> None:
    marker = f"pdchaos-reaper-test-{uuid.uuid4().hex}"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path), marker], stdout=subprocess.PIPE,
                               start_new_session=True)
    try:
        assert harness.stdout is not None
        wrapper = json.loads(harness.stdout.readline())["pid"]
        grandchildren = _children(wrapper)
        assert grandchildren, "the wrapper's sleep did not start"
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait(5)
        # PDEATHSIG takes the wrapper; the reaper, its sleep.
        assert poll_until_sync(lambda: not any(pid_alive(p) for p in [wrapper, *grandchildren]), 10), (
            f"left alive: {[p for p in [wrapper, *grandchildren] if pid_alive(p)]}")
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(5)


def test_a_forked_child_does_not_hold_its_parents_lifeline() -> None:
    """A process pool's worker forked after the harness started groups: were it to keep the parent's pipe
    open, the parent's reaper would wait for the worker after a SIGKILL of the parent, and not reap."""
    from harness.worlds.real import reaper

    marker = f"pdchaos-reaper-test-{uuid.uuid4().hex}"
    group = _group_with_a_grandchild(marker)
    try:
        reaper.watch_group(group.pid, marker)
        assert reaper._REAPER._pipe is not None
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit status
            os._exit(0 if reaper._REAPER._pipe is None and reaper._REAPER._proc is None else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert reaper._REAPER._pipe is not None  # the parent's own is untouched
    finally:
        os.killpg(group.pid, signal.SIGKILL)
        group.wait(5)
        reaper.forget_group(group.pid)
