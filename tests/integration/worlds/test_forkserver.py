"""The fork server: engines and routers forked from one preloaded process behave as exec'd ones do (ready
line, log, exit code, own process group, signals, environment), and none outlives the server or the
harness."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from fake_engines.control_client import ControlError, EngineControlClient
from fake_engines.core.timing import PROCESS_START_S
from harness.worlds.real.engines import ENGINE_READY_PREFIX
from harness.worlds.real.forkserver_client import ENABLE_ENV, ForkServerClient, forkable
from harness.worlds.real.processes import (
    ProcessSupervisor,
    find_marked_processes,
    pid_alive,
    shared_fork_server,
)
from pdchaos.forkserver import read_frame, write_frame
from pdchaos.ports import free_port
from pdchaos.waiting import poll_until

ENGINE = [sys.executable, "-m", "fake_engines"]


def _engine_argv(name: str = "prefill-0") -> list[str]:
    return [*ENGINE, "--name", name, "--role", "prefill", "--connector", "nixl", "--control-open",
            "--http-port", str(free_port()), "--grpc-port", str(free_port()),
            "--control-port", str(free_port()), "--nixl-port", str(free_port())]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[1])


def _names(pid_file: Path) -> list[str]:
    return [json.loads(line)["name"] for line in pid_file.read_text().splitlines()]


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


async def test_engine_is_forked_serves_and_stops(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        loop = asyncio.get_running_loop()
        started = loop.time()
        proc = await sup.spawn("prefill-0", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
        # A forked engine still takes an exec'd one's start-up to serve (the timing model's, as simulated).
        assert loop.time() - started >= PROCESS_START_S
        assert proc.ready_info and proc.ready_info.get("role") == "prefill"
        server = sup.fork_server
        assert server is not None and server.pid != proc.pid
        # Its own session and group, a child of the fork server, named after the engine.
        assert os.getpgid(proc.pid) == proc.pid and os.getsid(proc.pid) == proc.pid
        assert _parent(proc.pid) == server.pid
        assert _comm(proc.pid) == "prefill-0"
        # The server's environment carries the run marker, so a forked child is found as an exec'd one is.
        assert proc.pid in find_marked_processes(sup.marker)
        proc.signal(signal.SIGSTOP)
        proc.signal(signal.SIGCONT)
        code = await sup.stop(proc, grace_s=5.0)
        assert code == 0, (tmp_path / "prefill-0.log").read_text()
        assert not pid_alive(proc.pid)
    assert not pid_alive(server.pid)
    assert _names(tmp_path / "pids.jsonl") == ["forkserver", "prefill-0"]


async def test_exit_code_and_log_of_a_failing_child(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn("bad", [*ENGINE, "--role", "nobody"])
        assert await proc.wait(10.0) == 2
        assert "invalid choice" in (tmp_path / "bad.log").read_text()
        sigkilled = await sup.spawn("engine", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
        sigkilled.signal(signal.SIGKILL)
        assert await sigkilled.wait(10.0) == -signal.SIGKILL


async def test_child_gets_its_own_environment(tmp_path: Path) -> None:
    """The control token comes from PDCHAOS_CONTROL_TOKEN when no flag gives it: each child reads its own."""
    async with ProcessSupervisor(tmp_path) as sup:
        procs = {}
        for name in ("one", "two"):
            argv = [a for a in _engine_argv(name) if a != "--control-open"]
            procs[name] = await sup.spawn(name, argv, env={"PDCHAOS_CONTROL_TOKEN": f"token-{name}"},
                                          ready_prefix=ENGINE_READY_PREFIX)
        for name, proc in procs.items():
            i = proc.argv.index("--control-port")
            url = f"http://127.0.0.1:{proc.argv[i + 1]}"
            state = await EngineControlClient(url, f"token-{name}", 5.0).state()
            assert state["name"] == name
            other = "two" if name == "one" else "one"
            with pytest.raises(ControlError):
                await EngineControlClient(url, f"token-{other}", 5.0).state()
        # /proc shows the environment the server was exec'd with; the child's own is what it reads.
        assert b"token-one" not in _environ(procs["one"].pid)


async def test_other_interpreter_settings_are_execed(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        forked = await sup.spawn("one", _engine_argv("one"), ready_prefix=ENGINE_READY_PREFIX)
        other = await sup.spawn("two", _engine_argv("two"), env={"PYTHONHASHSEED": "7"},
                                ready_prefix=ENGINE_READY_PREFIX)
        server = sup.fork_server
        assert server is not None
        assert _parent(forked.pid) == server.pid
        assert _parent(other.pid) == os.getpid()


async def test_switched_off_execs_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENABLE_ENV, "0")
    assert forkable(_engine_argv()) is None
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn("prefill-0", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
        assert sup.fork_server is None and _comm(proc.pid).startswith("python")


def test_only_this_interpreter_and_known_modules_are_forked() -> None:
    assert forkable([sys.executable, "-m", "fake_engines", "--role", "decode"]) == "fake_engines"
    assert forkable([sys.executable, "-m", "reference_router"]) == "reference_router"
    assert forkable([sys.executable, "-m", "harness.cli"]) is None
    assert forkable(["/nonexistent/python3", "-m", "fake_engines"]) is None
    assert forkable([sys.executable, "-c", "pass"]) is None
    assert forkable(["toxiproxy-server"]) is None


async def test_server_death_takes_its_children_and_fails_their_handles(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path) as sup:
        proc = await sup.spawn("prefill-0", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
        server = sup.fork_server
        assert server is not None
        os.kill(server.pid, signal.SIGKILL)
        assert await proc.wait(10.0) == -signal.SIGKILL
        assert await poll_until(lambda: not pid_alive(proc.pid), 5.0, interval_s=0.02)
        # The next child gets a fresh server.
        again = await sup.spawn("prefill-0", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
        assert sup.fork_server is not None and sup.fork_server.pid != server.pid
        await sup.stop(again)


async def test_server_answers_a_bad_request_with_an_error(tmp_path: Path) -> None:
    client = await ForkServerClient.start(dict(os.environ), tmp_path / "fs.log")
    try:
        assert client.proc.stdin is not None
        with pytest.raises(Exception, match="cannot open the log"):
            await client.spawn("fake_engines", ["--help"], dict(os.environ), tmp_path / "no" / "x.log")
        child = await client.spawn("fake_engines", ["--help"], dict(os.environ), tmp_path / "help.log")
        assert await asyncio.wait_for(child.wait(), 10.0) == 0
        assert "usage: pdchaos-engine" in (tmp_path / "help.log").read_text()
    finally:
        await client.aclose()
    assert client.proc.returncode is not None


def test_frames_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "frames"
    with open(path, "wb") as out:
        write_frame(out, {"op": "spawn", "id": 1})
        write_frame(out, {"exit": 5, "code": -9})
    with open(path, "rb") as inp:
        assert read_frame(inp) == {"op": "spawn", "id": 1}
        assert read_frame(inp) == {"exit": 5, "code": -9}
        assert read_frame(inp) is None
    path.write_bytes(b"\x00\x00\x00\x02[]")
    with open(path, "rb") as inp, pytest.raises(ValueError, match="object"):
        read_frame(inp)


async def test_supervisors_of_one_run_share_a_server(tmp_path: Path) -> None:
    marker = "pdchaos-test-shared-forkserver"
    async with shared_fork_server(tmp_path, marker):
        async with (ProcessSupervisor(tmp_path / "a", marker) as a,
                    ProcessSupervisor(tmp_path / "b", marker) as b):
            pa = await a.spawn("prefill-0", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
            pb = await b.spawn("prefill-0", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
            assert a.fork_server is not None and a.fork_server is b.fork_server
            server = a.fork_server
            assert _parent(pa.pid) == _parent(pb.pid) == server.pid
            # Another run's supervisor does not share it.
            async with ProcessSupervisor(tmp_path / "c") as c:
                pc = await c.spawn("prefill-0", _engine_argv(), ready_prefix=ENGINE_READY_PREFIX)
                assert c.fork_server is not server and _parent(pc.pid) == c.fork_server.pid
        # Cells end, the run's server stays for the next cell...
        assert pid_alive(server.pid) and not pid_alive(pa.pid)
        for sup_dir in ("a", "b"):
            assert _names(tmp_path / sup_dir / "pids.jsonl") == ["forkserver", "prefill-0"]
    # ...and ends with the run.
    assert await poll_until(lambda: not pid_alive(server.pid), 5.0, interval_s=0.02)
    assert (tmp_path / "forkserver.log").exists()
