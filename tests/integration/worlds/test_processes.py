"""ProcessSupervisor: readiness, logs, failure paths, group kills and the no-survivor guarantees."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.worlds.real.log_cap import MARKER_PREFIX, LogCap
from harness.worlds.real.processes import (
    MARKER_ENV,
    ProcessStartError,
    ProcessSupervisor,
    find_marked_processes,
    group_alive,
    pid_alive,
    pids_from_pid_file,
)
from pdchaos.waiting import poll_until

PY = sys.executable


def _py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


async def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    return bool(await poll_until(lambda: not pid_alive(pid), timeout_s, interval_s=0.02))


async def _marked_gone(marker: str, timeout_s: float = 5.0) -> list[int]:
    """Marked pids still alive after timeout_s (a process being torn down may show for a moment)."""
    left: list[int] = []

    def none_left() -> bool:
        nonlocal left
        left = find_marked_processes(marker)
        return not left

    await poll_until(none_left, timeout_s)
    return left


def _describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        except OSError:
            cmd, stat = "?", "?"
        out.append(f"{pid}: {cmd[:200]!r} stat={stat[:80]!r}")
    return "; ".join(out)


async def test_ready_line_parsed_and_logged(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn(
            "echo",
            _py("""
                import json, os, sys, time
                print("starting up", flush=True)
                print("noise", file=sys.stderr, flush=True)
                info = {"port": 1234, "marker": os.environ["PDCHAOS_RUN_MARKER"]}
                print("PDCHAOS_ENGINE_READY " + json.dumps(info))
                time.sleep(30)
            """),
            ready_prefix="PDCHAOS_ENGINE_READY",
            ready_timeout_s=10,
        )
        assert proc.ready_info == {"port": 1234, "marker": sup.marker}
        assert proc.alive and proc.returncode is None
        log = proc.log_path.read_text()
        assert "starting up" in log and "noise" in log
        assert proc.log_path == tmp_path / "echo.log"
        pid = proc.pid
    assert await _gone(pid)
    assert proc.returncode is not None
    records = pids_from_pid_file(tmp_path / "pids.jsonl")
    assert [(r["name"], r["pid"], r["pgid"]) for r in records] == [("echo", pid, pid)]


async def test_child_exiting_before_ready_raises_with_log_tail(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        with pytest.raises(ProcessStartError) as info:
            await sup.spawn(
                "bad",
                _py("import sys; print('config error: port 1 in use'); sys.exit(3)"),
                ready_prefix="PDCHAOS_ENGINE_READY",
                ready_timeout_s=10,
            )
    err = info.value
    assert err.returncode == 3
    assert "exited with code 3" in str(err)
    assert "config error: port 1 in use" in str(err)


async def test_ready_deadline_kills_child_and_reports_tail(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        with pytest.raises(ProcessStartError) as info:
            await sup.spawn(
                "slow",
                _py("import time; print('still loading', flush=True); time.sleep(60)"),
                ready_prefix="READY",
                ready_timeout_s=0.5,
            )
        proc = sup.get("slow")
        assert proc is not None
        assert await _gone(proc.pid)
    assert "did not print READY within 0.5 s" in str(info.value)
    assert "still loading" in str(info.value)


async def test_bad_ready_json_is_an_error(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        with pytest.raises(ProcessStartError, match="bad JSON"):
            await sup.spawn(
                "j", _py("import time; print('READY {nope'); time.sleep(30)"), ready_prefix="READY",
                ready_timeout_s=5,
            )


async def test_bad_name_and_missing_binary(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        with pytest.raises(ValueError):
            await sup.spawn("../evil", [PY, "-c", "pass"])
        with pytest.raises(FileNotFoundError):
            await sup.spawn("nobin", ["/nonexistent/pdchaos-binary"])


async def test_stop_escalates_to_sigkill_when_sigterm_ignored(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn(
            "stubborn",
            _py("""
                import signal, time
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print("READY {}", flush=True)
                time.sleep(60)
            """),
            ready_prefix="READY",
        )
        assert proc.ready_info == {}
        code = await sup.stop(proc, grace_s=0.3)
        assert code == -signal.SIGKILL


async def test_stop_graceful_exit_code(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn(
            "sleeper", _py("print('READY'); import time; time.sleep(60)"), ready_prefix="READY"
        )
        assert await sup.stop(proc, grace_s=2) == -signal.SIGTERM
        assert await proc.wait(0.1) == -signal.SIGTERM


async def test_wait_times_out_with_none(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn("w", _py("import time; time.sleep(60)"))
        assert await proc.wait(0.1) is None
        assert sup.get("w") is proc
        assert sup.get("nope") is None


async def test_group_kill_reaches_grandchildren_after_leader_sigkill(tmp_path: Path) -> None:
    """A crash fault SIGKILLs the leader; its forked child stays in the group and still gets killed."""
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn(
            "forker",
            _py(f"""
                import subprocess, time
                child = subprocess.Popen([{PY!r}, "-c", "import time; time.sleep(60)"])
                print("READY", '{{"grandchild": %d}}' % child.pid, flush=True)
                time.sleep(60)
            """),
            ready_prefix="READY",
        )
        assert proc.ready_info is not None
        grandchild = int(proc.ready_info["grandchild"])
        os.kill(proc.pid, signal.SIGKILL)
        assert await proc.wait(5) == -signal.SIGKILL
        assert pid_alive(grandchild) and group_alive(proc.pgid)
        assert find_marked_processes(sup.marker) == [grandchild]
    assert await _gone(grandchild)
    assert not group_alive(proc.pgid)


async def test_name_reuse_gets_fresh_log(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        a = await sup.spawn("eng", _py("print('first')"))
        await a.wait(5)
        b = await sup.spawn("eng", _py("print('second')"))
        await b.wait(5)
        assert a.log_path != b.log_path
        assert b.log_path.name == "eng.2.log"
        assert sup.get("eng") is b
        assert "second" in b.log_path.read_text()


async def test_closed_supervisor_refuses_spawn(tmp_path: Path) -> None:
    sup = ProcessSupervisor(tmp_path)
    await sup.aclose()
    await sup.aclose()
    with pytest.raises(RuntimeError):
        await sup.spawn("x", [PY, "-c", "pass"])


_HARNESS = """
import asyncio, sys
from pathlib import Path
from harness.worlds.real.processes import ProcessSupervisor

async def main():
    sup = ProcessSupervisor(Path(sys.argv[1]), marker=sys.argv[2])
    for i in range(2):
        code = "import time; print('READY', flush=True); time.sleep(60)"
        await sup.spawn(f"c{i}", [sys.executable, "-c", code], ready_prefix="READY")
    print("SPAWNED", flush=True)
    if sys.argv[3] == "exit":
        sys.stdin.readline()  # the test has seen the children alive: go
        return  # no aclose: atexit must clean up
    await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["sigkill", "exit"])
async def test_children_die_with_the_harness(tmp_path: Path, how: str) -> None:
    """SIGKILL of the harness: PDEATHSIG takes the children. An exit without cleanup: atexit does."""
    marker = f"pdchaos-test-{os.getpid()}-{how}-{time.monotonic_ns()}"
    harness = subprocess.Popen(  # noqa: ASYNC220 - the harness under test, reaped in a thread
        [PY, "-c", _HARNESS, str(tmp_path), marker, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert harness.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(harness.stdout.readline), 20)
        assert line.strip() == "SPAWNED"
        records = pids_from_pid_file(tmp_path / "pids.jsonl")
        assert len(records) == 2
        assert all(pid_alive(r["pid"]) for r in records)
        # The harness itself carries the marker in its argv; its children carry it in their environment.
        assert sorted([harness.pid, *(r["pid"] for r in records)]) == find_marked_processes(marker)
        if how == "sigkill":
            harness.kill()
        else:
            assert harness.stdin is not None
            harness.stdin.write("go\n")
            harness.stdin.close()
        await asyncio.wait_for(asyncio.to_thread(harness.wait), 20)
        for r in records:
            assert await _gone(r["pid"]), f"{r['name']} survived the harness"
            assert not group_alive(r["pgid"])
        left = await _marked_gone(marker)
        assert left == [], f"marked processes left: {_describe(left)}"
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
            harness.wait()
        for pid in find_marked_processes(marker):
            os.kill(pid, signal.SIGKILL)


def test_marker_env_name_is_stable() -> None:
    assert MARKER_ENV == "PDCHAOS_RUN_MARKER"


async def test_marker_inherited_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MARKER_ENV, "pdchaos-inherited-xyz")
    async with ProcessSupervisor(tmp_path) as sup:
        assert sup.marker == "pdchaos-inherited-xyz"
        proc = await sup.spawn(
            "m", _py("import os, json; print('READY', json.dumps({'m': os.environ['PDCHAOS_RUN_MARKER']}))"),
            ready_prefix="READY",
        )
        assert proc.ready_info == {"m": "pdchaos-inherited-xyz"}
    monkeypatch.delenv(MARKER_ENV)
    assert ProcessSupervisor(tmp_path / "b").marker.startswith("pdchaos-")
    assert ProcessSupervisor(tmp_path / "c", marker="given").marker == "given"


async def test_stop_wakes_a_stopped_child_for_its_sigterm(tmp_path: Path) -> None:
    """A SIGSTOP wedge must not cost the whole grace period: the child gets SIGCONT and handles SIGTERM."""
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn(
            "wedged",
            _py("""
                import signal, sys, time
                signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
                print("READY", flush=True)
                time.sleep(60)
            """),
            ready_prefix="READY",
        )
        proc.signal(signal.SIGSTOP)
        # Exit code 7 is the child's own SIGTERM handler; a child left stopped would be SIGKILLed (-9).
        assert await sup.stop(proc, grace_s=10.0) == 7


async def test_after_the_leader_is_reaped_only_marked_group_members_are_signalled(tmp_path: Path) -> None:
    """Once the leader is reaped its pid may be reused: the supervisor then signals only processes of the
    old group that carry the run marker. An unmarked member (stand-in for a stranger) is left alone."""
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn(
            "leader",
            _py(f"""
                import json, os, subprocess, time
                env = {{k: v for k, v in os.environ.items() if k != "PDCHAOS_RUN_MARKER"}}
                sleep = [{PY!r}, "-c", "import time; time.sleep(60)"]
                marked = subprocess.Popen(sleep)
                stranger = subprocess.Popen(sleep, env=env)
                print("READY", json.dumps({{"marked": marked.pid, "stranger": stranger.pid}}), flush=True)
                time.sleep(60)
            """),
            ready_prefix="READY",
        )
        assert proc.ready_info is not None
        marked, stranger = int(proc.ready_info["marked"]), int(proc.ready_info["stranger"])
        try:
            os.kill(proc.pid, signal.SIGKILL)
            assert await proc.wait(5) == -signal.SIGKILL
            assert proc.signal(signal.SIGKILL) is True
            assert await _gone(marked)
            assert pid_alive(stranger)
            assert proc.signal(signal.SIGKILL) is False  # nothing marked left
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stranger, signal.SIGKILL)
    assert await _gone(stranger)


async def test_a_chatty_childs_log_is_capped_while_it_runs(tmp_path: Path) -> None:
    cap = LogCap(200_000, 20_000, 40_000)
    async with ProcessSupervisor(tmp_path, log_cap=cap, log_cap_poll_s=0.05) as sup:
        proc = await sup.spawn(
            "chatty",
            _py("""
                import sys, time
                print("READY", flush=True)
                for i in range(40_000):
                    sys.stdout.write(f"request {i:06d} {'x' * 60}\\n")
                    if i % 1000 == 999:
                        sys.stdout.flush()
                        time.sleep(0.02)
                print("done", flush=True)
                time.sleep(30)
            """),
            ready_prefix="READY",
        )
        assert await poll_until(lambda: proc.log_path.read_bytes().endswith(b"done\n"), 30, interval_s=0.05)
        await asyncio.sleep(0.2)  # one more look after the last burst
        text = proc.log_path.read_bytes()
    assert proc.log_bytes_cut > 2_000_000
    assert len(text) <= cap.limit_bytes
    assert text.startswith(b"READY\nrequest 000000 ")
    assert MARKER_PREFIX in text and text.endswith(b"request 039999 " + b"x" * 60 + b"\ndone\n")


async def test_no_cap_leaves_the_log_whole(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path, log_cap=None, log_cap_poll_s=0.05) as sup:
        proc = await sup.spawn("chatty", _py("import time; print('y' * 300_000, flush=True); time.sleep(30)"))
        assert await poll_until(lambda: proc.log_path.stat().st_size == 300_001, 10, interval_s=0.05)
        await asyncio.sleep(0.3)  # six looks at a live child's log
        assert proc.alive
    assert len(proc.log_path.read_bytes()) == 300_001 and proc.log_bytes_cut == 0


async def test_a_failing_cut_is_said_on_the_process_and_the_supervisor_still_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.worlds.real.processes as processes

    def full_disk(path: Path, cap: LogCap) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(processes, "cap_log", full_disk)
    sup = ProcessSupervisor(tmp_path, log_cap=LogCap(1000, 100, 100), log_cap_poll_s=0.05)
    proc = await sup.spawn("chatty", _py("import time; print('y' * 5000, flush=True); time.sleep(30)"))
    assert await poll_until(lambda: proc.log_cut_error is not None, 10, interval_s=0.05)
    assert "No space left" in str(proc.log_cut_error)
    await sup.aclose()
    assert await _gone(proc.pid)


async def test_what_the_cap_took_is_said_in_a_note(tmp_path: Path) -> None:
    from harness.worlds.real.processes import log_cap_notes

    async with ProcessSupervisor(tmp_path, log_cap=LogCap(100_000, 1000, 1000), log_cap_poll_s=0.05) as sup:
        quiet = await sup.spawn("quiet", _py("import time; print('hello', flush=True); time.sleep(30)"))
        chatty = await sup.spawn("chatty", _py("import time; print(('y' * 99 + '\\n') * 5000, flush=True); "
                                               "time.sleep(30)"))
        assert await poll_until(lambda: chatty.log_bytes_cut > 0, 10, interval_s=0.05)
    notes = log_cap_notes([quiet, chatty])
    assert notes == [f"log cap: {chatty.log_bytes_cut / 1e6:.1f} MB cut from the middle of chatty.log"]
