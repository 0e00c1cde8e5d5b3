"""Process supervision: every OS process the harness starts, and the guarantee that none outlives it.

Guarantees, and how each is met:
- Each child leads its own process group (`start_new_session`), so a signal to the group also reaches
  anything the child forked (a crash fault can SIGKILL a child and leave grandchildren: the group kill
  still finds them).
- Each child asks the kernel for SIGKILL when its parent dies (`prctl(PR_SET_PDEATHSIG, SIGKILL)` in the
  fork, Linux only), so even a SIGKILLed harness, which runs no cleanup at all, takes its children with it.
  The kernel ties PDEATHSIG to the *thread* that forked, not the process: spawn only from a long-lived
  thread (the main thread or the event loop's thread; asyncio forks in the loop thread). Spawning from a
  short-lived worker thread would kill the child when that thread ends.
- `kill_all()` is registered with `atexit` and is idempotent: a normal exit or an unhandled exception
  SIGKILLs every group still alive.
- PDEATHSIG reaches a child, not what it started (a router template's wrapper script that does not `exec`,
  vLLM's workers): every group is also told to one reaper process (`pdchaos.reaper`, in its own session),
  which SIGKILLs the groups still listed once this process is gone, whichever way it went.
- Every child gets `PDCHAOS_RUN_MARKER=<marker>` in its environment and a line in `<log_dir>/pids.jsonl`,
  so a test (or a person) can prove afterwards that nothing of a run is left (`find_marked_processes`).

stdout and stderr of a child go straight to `<log_dir>/<name>.log` (no pipe: a harness that stops reading
can never block a child). Readiness is found by tailing that file for a line starting with the ready
prefix, under a deadline; children get `PYTHONUNBUFFERED=1` so a Python child's ready line reaches the
file at once (a non-Python child must flush its ready line itself).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import os
import re
import signal
import sys
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.text import strip_ansi
from harness.worlds.real.forkserver_client import ForkServerClient, ForkServerSlot, forkable
from harness.worlds.real.log_cap import LogCap, cap_log, log_cap_from_env
from harness.worlds.real.reaper import forget_group, watch_group
from pdchaos.forkserver import die_with_parent
from pdchaos.jsonl import JsonlWriter
from pdchaos.reaper import MARKER_ENV, members


def mark_processes(out: Path) -> str:
    """The marker every process of this command carries (set once per harness process, named after its
    output folder): the cells share one fork server through it (`shared_fork_server`), and
    `find_marked_processes` proves afterwards that nothing is left."""
    return os.environ.setdefault(MARKER_ENV, f"pdchaos-{out.name}-{uuid.uuid4().hex[:8]}")


PID_FILE_NAME = "pids.jsonl"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_LOG_TAIL_BYTES = 4000
# A process that dies with a long backtrace (a Rust panic, a Python traceback) puts the reason far above the
# log's last lines: this much of the log is searched for it.
_EXIT_SEARCH_BYTES = 64_000
# Backtrace frames (Rust: "  12: symbol", "      at file.rs:1:2") say where, not why.
_FRAME = re.compile(r"^\s+(\d+: |at )")
# What says why, most telling first: a panic, an exception's last line, a fatal or error log line.
_WHY = (re.compile(r"panicked at"), re.compile(r"^[\w.]*(Error|Exception)\b"),
        re.compile(r"\b(FATAL|CRITICAL|ERROR)\b"))
_READY_POLL_S = 0.02


class ProcessStartError(RuntimeError):
    """A child exited, or never printed its ready line, before its deadline. The message has its log tail."""

    def __init__(self, message: str, name: str, log_path: Path, returncode: int | None) -> None:
        super().__init__(message)
        self.name = name
        self.log_path = log_path
        self.returncode = returncode


def _make_preexec(parent_pid: int) -> Any:
    """Runs in the forked child before exec: only async-signal-safe work (a syscall, a compare, an exit).
    The parent may die between fork and prctl: then no death signal will ever come, so the child exits."""
    return functools.partial(die_with_parent, parent_pid)


def log_tail(path: Path, max_bytes: int = _LOG_TAIL_BYTES) -> str:
    """The last max_bytes of a log, decoded leniently; '' when it does not exist."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def exit_summary(text: str, lines: int = 5) -> str:
    """Why a process died, from its log: the last line that says so (a panic, else an exception, else a
    fatal or error line) and the line after it, else the last `lines` lines; colour codes and backtrace
    frames left out."""
    kept = [ln.strip() for ln in strip_ansi(text).splitlines() if ln.strip() and not _FRAME.match(ln)]
    for why in _WHY:
        hits = [i for i, line in enumerate(kept) if why.search(line)]
        if hits:
            return " | ".join(kept[hits[-1]:hits[-1] + 2])
    return " | ".join(kept[-lines:])


# Causes a harness user can act on, and what to do: (a pattern in the exit summary, the advice).
_PORT_TAKEN = re.compile(r"address already in use|os error 98", re.I)
_EXIT_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_PORT_TAKEN,
     "a port it was given was taken before it bound it by a program that is not pdchaos (pdchaos runs claim "
     "theirs); PDCHAOS_PORT_POOL=LOW-HIGH moves the runs to ports nothing else uses"),
    (re.compile(r"harmony encoding|downloading or loading vocab file", re.I),
     "this gateway downloads a tiktoken vocabulary (o200k_base) when it starts; offline, set "
     "TIKTOKEN_ENCODINGS_BASE to a folder holding o200k_base.tiktoken"),
)


def exit_hint(summary: str) -> str | None:
    """What to do about a known cause of death named in an exit summary; None for the others."""
    for pattern, advice in _EXIT_HINTS:
        if pattern.search(summary):
            return advice
    return None


def lost_its_port(log_path: Path) -> bool:
    """Whether a child that died starting says a port it was given was taken: another process bound it
    between the harness choosing it and the child binding it (a start elsewhere may succeed)."""
    return bool(_PORT_TAKEN.search(exit_summary(log_tail(log_path, _EXIT_SEARCH_BYTES))))


def exit_evidence(path: Path) -> str:
    """`exit_summary` of the end of the log at `path`, with `exit_hint`'s advice when it knows the cause."""
    summary = exit_summary(log_tail(path, _EXIT_SEARCH_BYTES))
    hint = exit_hint(summary)
    return summary if hint is None else f"{summary} (hint: {hint})"


@dataclass
class ManagedProcess:
    """A child the supervisor started. `pid` is also its process group id."""

    name: str
    pid: int
    argv: list[str]
    log_path: Path
    ready_info: dict[str, Any] | None = None
    marker: str | None = None
    # Its ready line is still being looked for in its log: the log is not cut meanwhile.
    starting: bool = False
    # What the log cap cut from its log so far, and why its last cut failed (None: none did).
    log_bytes_cut: int = 0
    log_cut_error: str | None = None
    # An asyncio.subprocess.Process, or a ForkedChild when the fork server started it.
    _proc: Any = field(default=None, repr=False)

    @property
    def pgid(self) -> int:
        return self.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    @property
    def alive(self) -> bool:
        return self.returncode is None

    @property
    def lost_with_fork_server(self) -> bool:
        """Killed because the fork server it came from died, not by anything of its own."""
        return bool(getattr(self._proc, "server_lost", False))

    def signal(self, sig: int) -> bool:
        """Send sig to the child's whole process group. False when nothing of the group is left.

        While the leader is not reaped its pid (= the group id) cannot be reused, so the group is signalled
        directly. Once it is reaped the id may belong to someone else (pid_max can be as low as 32768):
        then only processes still in that group *and* carrying the run's marker are signalled.
        """
        if self._proc is None or self._proc.returncode is None or self.marker is None:
            try:
                os.killpg(self.pid, sig)
                return True
            except (ProcessLookupError, PermissionError):
                return False
        hit = False
        for pid in members(self.pgid, self.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                hit = True
        return hit

    async def wait(self, timeout_s: float) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running after timeout_s."""
        if self._proc is None:
            return None
        try:
            return await asyncio.wait_for(self._proc.wait(), timeout=timeout_s)
        except TimeoutError:
            return None


_LIVE_SUPERVISORS: weakref.WeakSet[ProcessSupervisor] = weakref.WeakSet()
# (event loop id, marker) -> the fork server every supervisor of that run shares (`shared_fork_server`).
_SHARED_SLOTS: dict[tuple[int, str], ForkServerSlot] = {}


def _kill_all_live() -> None:
    for sup in list(_LIVE_SUPERVISORS):
        sup.kill_all()
    for slot in list(_SHARED_SLOTS.values()):
        slot.kill()


def fork_server_env(marker: str) -> dict[str, str]:
    """A fork server's own environment: this process's, with the run's marker (so its children, whose /proc
    environ is the server's, are found as the run's) and unbuffered output."""
    env = {**os.environ, MARKER_ENV: marker}
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@contextlib.asynccontextmanager
async def shared_fork_server(log_dir: Path, marker: str | None = None) -> AsyncIterator[None]:
    """Within the block, every supervisor on this event loop with the run's marker (default:
    $PDCHAOS_RUN_MARKER, which `pdchaos run` sets) forks its children from one server, started at the first
    child (its log: `<log_dir>/forkserver.log`) and ended with the block: one preload for a whole suite of
    cells rather than one per cell. Without a marker there is nothing to share and the block does nothing."""
    marker = marker or os.environ.get(MARKER_ENV)
    key = (id(asyncio.get_running_loop()), marker or "")
    if not marker or key in _SHARED_SLOTS:
        yield
        return
    Path(log_dir).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - one local folder
    slot = ForkServerSlot(fork_server_env(marker), lambda: Path(log_dir) / "forkserver.log",
                          _make_preexec(os.getpid()))
    _SHARED_SLOTS[key] = slot
    try:
        yield
    finally:
        _SHARED_SLOTS.pop(key, None)
        try:
            await slot.aclose()
        finally:
            slot.kill()


atexit.register(_kill_all_live)


class ProcessSupervisor:
    """Starts, watches and stops the harness's OS processes: `async with ProcessSupervisor(dir) as sup:`.

    `marker` (default: $PDCHAOS_RUN_MARKER, else a fresh `pdchaos-<hex>`) is put in every child's
    environment as PDCHAOS_RUN_MARKER. `log_cap`: the size cap on each live child's log, looked at every
    `log_cap_poll_s` (default: PDCHAOS_LOG_CAP_MB's, see `harness.worlds.real.log_cap`; None: no cap).
    Spawn from the event loop's thread only (see the module docstring on PDEATHSIG).
    """

    def __init__(self, log_dir: Path, marker: str | None = None,
                 log_cap: LogCap | Literal["env"] | None = "env", log_cap_poll_s: float = 2.0) -> None:
        self.log_cap = log_cap_from_env() if log_cap == "env" else log_cap
        self.log_cap_poll_s = log_cap_poll_s
        self._log_watch: asyncio.Task[None] | None = None
        self._cutting: asyncio.Future[int] | None = None
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # A marker inherited from our own environment wins over a fresh one, so every supervisor of one
        # `pdchaos run` (and of a test that started it) tags its children alike.
        self.marker = marker or os.environ.get(MARKER_ENV) or f"pdchaos-{uuid.uuid4().hex[:16]}"
        self.pid_file = self.log_dir / PID_FILE_NAME
        self._pids = JsonlWriter(self.pid_file)
        self._procs: list[ManagedProcess] = []
        self._closed = False
        self._own_slot: ForkServerSlot | None = None
        self._servers_recorded: set[int] = set()
        # The server this supervisor's latest forked child came from.
        self.fork_server: ForkServerClient | None = None
        _LIVE_SUPERVISORS.add(self)

    @property
    def processes(self) -> list[ManagedProcess]:
        return list(self._procs)

    def get(self, name: str) -> ManagedProcess | None:
        """The most recent process started under this name."""
        return next((proc for proc in reversed(self._procs) if proc.name == name), None)

    async def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        ready_prefix: str | None = None,
        ready_timeout_s: float = 20.0,
    ) -> ManagedProcess:
        """Start argv; with ready_prefix, return only once a stdout line `<prefix> {json}` appeared.

        Raises ProcessStartError (the child's group killed, its log tail in the message) if it exits or the
        deadline passes first, and ValueError for a bad name. A name used twice gets `.2`, `.3` log files.
        """
        if self._closed:
            raise RuntimeError("supervisor is closed")
        if not _NAME_RE.match(name):
            raise ValueError(f"process name {name!r} must match {_NAME_RE.pattern}")
        log_path = self._fresh_log_path(name)
        child_env = {**os.environ, **(env or {}), MARKER_ENV: self.marker}
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        module = forkable(argv)
        server = None if module is None else await self._fork_server(child_env)
        if module is not None and server is not None:
            proc: Any = await server.spawn(module, list(argv[3:]), child_env, log_path, name=name)
        else:
            # A local file open, not a network wait: fine on the loop.
            with open(log_path, "ab") as log_fh:  # noqa: ASYNC230
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_fh,
                    stderr=asyncio.subprocess.STDOUT,
                    env=child_env,
                    start_new_session=True,
                    preexec_fn=_make_preexec(os.getpid()),
                )
        managed = ManagedProcess(
            name=name, pid=proc.pid, argv=list(argv), log_path=log_path, marker=self.marker, _proc=proc
        )
        self._procs.append(managed)
        self._watch_logs()
        watch_group(managed.pgid, self.marker)
        self._pids.write(
            {"name": name, "pid": proc.pid, "pgid": proc.pid, "argv": list(argv), "ts": time.time()}
        )
        if ready_prefix is not None:
            managed.starting = True
            try:
                managed.ready_info = await self._await_ready(managed, ready_prefix, ready_timeout_s)
            except BaseException:
                # Cancelled or failed while starting: the half-started child must not survive us.
                managed.signal(signal.SIGKILL)
                raise
            finally:
                managed.starting = False
        return managed

    def _watch_logs(self) -> None:
        if self.log_cap is not None and self._log_watch is None:
            self._log_watch = asyncio.get_running_loop().create_task(self._cap_logs(self.log_cap))

    async def _cap_logs(self, cap: LogCap) -> None:
        while True:
            await asyncio.sleep(self.log_cap_poll_s)
            for proc in list(self._procs):
                if proc.alive and not proc.starting and _size(proc.log_path) > cap.limit_bytes:
                    # A cut copies its tail (megabytes) back: off the loop. Shielded: a cut under way
                    # finishes (aclose waits for it) rather than leaving a half-cut log behind.
                    self._cutting = asyncio.ensure_future(asyncio.to_thread(cap_log, proc.log_path, cap))
                    try:
                        proc.log_bytes_cut += await asyncio.shield(self._cutting)
                    except Exception as e:  # a full disk, say: the log stays as it is; the next look tries
                        proc.log_cut_error = f"{type(e).__name__}: {e}"
                    finally:
                        self._cutting = None

    def _fork_slot(self) -> ForkServerSlot:
        """The run's shared fork server when one is kept for this marker (`shared_fork_server`), else this
        supervisor's own, started at its first forked child (its log: forkserver.log)."""
        shared = _SHARED_SLOTS.get((id(asyncio.get_running_loop()), self.marker))
        if shared is not None:
            return shared
        if self._own_slot is None:
            env = fork_server_env(self.marker)
            log_path = lambda: self._fresh_log_path("forkserver")  # noqa: E731 - called at each (re)start
            self._own_slot = ForkServerSlot(env, log_path, _make_preexec(os.getpid()))
        return self._own_slot

    async def _fork_server(self, env: Mapping[str, str]) -> ForkServerClient | None:
        server = await self._fork_slot().get(env)
        if server is not None and server.pid not in self._servers_recorded:
            self._servers_recorded.add(server.pid)
            self._pids.write({"name": "forkserver", "pid": server.pid, "pgid": server.pid,
                              "argv": [sys.executable, "-m", "pdchaos.forkserver"], "ts": time.time()})
        self.fork_server = server or self.fork_server
        return server

    def _fresh_log_path(self, name: str) -> Path:
        path = self.log_dir / f"{name}.log"
        n = 2
        while path.exists():
            path = self.log_dir / f"{name}.{n}.log"
            n += 1
        return path

    async def _await_ready(self, proc: ManagedProcess, prefix: str, timeout_s: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        offset = 0
        pending = b""
        needle = prefix.encode()
        while True:
            exited = proc.returncode is not None
            try:
                with open(proc.log_path, "rb") as fh:  # noqa: ASYNC230 - small local read
                    fh.seek(offset)
                    chunk = fh.read()
            except OSError:
                chunk = b""
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.strip()
                if line.startswith(needle):
                    return self._parse_ready(proc, prefix, line[len(needle) :].decode("utf-8", "replace"))
            if exited:
                raise self._start_error(proc, f"exited with code {proc.returncode} before printing {prefix}")
            if loop.time() >= deadline:
                raise self._start_error(proc, f"did not print {prefix} within {timeout_s:g} s")
            await asyncio.sleep(_READY_POLL_S)

    def _parse_ready(self, proc: ManagedProcess, prefix: str, rest: str) -> dict[str, Any]:
        rest = rest.strip()
        if not rest:
            return {}
        try:
            info = json.loads(rest)
        except json.JSONDecodeError as exc:
            raise self._start_error(proc, f"printed {prefix} with bad JSON ({exc})") from None
        if not isinstance(info, dict):
            raise self._start_error(proc, f"printed {prefix} with a non-object payload")
        return info

    def _start_error(self, proc: ManagedProcess, what: str) -> ProcessStartError:
        proc.signal(signal.SIGKILL)
        tail = log_tail(proc.log_path).rstrip()
        msg = f"process {proc.name!r} (pid {proc.pid}) {what}; log {proc.log_path}"
        if tail:
            msg += ":\n" + "\n".join("  | " + ln for ln in tail.splitlines()[-30:])
        return ProcessStartError(msg, proc.name, proc.log_path, proc.returncode)

    async def stop(self, proc: ManagedProcess, grace_s: float = 2.0) -> int | None:
        """SIGTERM the group, SIGKILL it after grace_s; the exit code (None if it could not be reaped).

        The group is SIGKILLed at the end even when the leader exited in time, so stragglers die too.
        """
        if proc.alive:
            proc.signal(signal.SIGTERM)
            # A wedged (SIGSTOPped) child would hold the SIGTERM pending for the whole grace: wake it.
            proc.signal(signal.SIGCONT)
            code = await proc.wait(grace_s)
            if code is None:
                proc.signal(signal.SIGKILL)
                code = await proc.wait(max(grace_s, 1.0))
        else:
            code = proc.returncode
        proc.signal(signal.SIGKILL)
        if code is not None and not members(proc.pgid, self.marker):
            forget_group(proc.pgid)  # emptied: the reaper must leave its id alone from now on
        return code

    async def _stop_log_watch(self) -> None:
        """End the log cap's task, and let a cut under way finish (it rewrites a log's tail)."""
        watch, cutting = self._log_watch, self._cutting
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        if cutting is not None:
            await asyncio.gather(cutting, return_exceptions=True)

    def kill_all(self) -> None:
        """SIGKILL every process group this supervisor started. Sync, idempotent, safe at atexit."""
        for proc in self._procs:
            proc.signal(signal.SIGKILL)
        if self._own_slot is not None:
            self._own_slot.kill()

    async def aclose(self, grace_s: float = 2.0) -> None:
        """Stop every child (concurrently), then close the pid file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._stop_log_watch()
            await asyncio.gather(*(self.stop(p, grace_s) for p in self._procs), return_exceptions=True)
            if self._own_slot is not None:
                await self._own_slot.aclose()
        finally:
            self.kill_all()
            self._pids.close()
            _LIVE_SUPERVISORS.discard(self)

    async def __aenter__(self) -> ProcessSupervisor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.aclose()
        except BaseException:
            self.kill_all()
            raise


def log_cap_notes(procs: Sequence[ManagedProcess]) -> list[str]:
    """What the log cap took from these processes' logs, a line each (a report's notes: a log read later
    has a gap there)."""
    notes = []
    for p in procs:
        if p.log_bytes_cut:
            notes.append(f"log cap: {p.log_bytes_cut / 1e6:.1f} MB cut from the middle of {p.log_path.name}")
        if p.log_cut_error:
            notes.append(f"log cap: {p.log_path.name} could not be cut: {p.log_cut_error}")
    return notes


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_proc_file(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _all_pids() -> list[int]:
    try:
        return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return []


def find_marked_processes(marker: str) -> list[int]:
    """Live pids (zombies excluded) whose environment or argv contains marker. Linux /proc only."""
    needle, me = marker.encode(), os.getpid()
    return sorted(pid for pid in _all_pids() if pid != me
                  and (needle in _read_proc_file(pid, "environ") or needle in _read_proc_file(pid, "cmdline"))
                  and pid_alive(pid))


def pids_from_pid_file(path: Path) -> list[dict[str, Any]]:
    """Records of a run's `pids.jsonl` ({name, pid, pgid, argv, ts}); [] when absent."""
    from pdchaos.jsonl import read_jsonl

    if not Path(path).exists():
        return []
    return list(read_jsonl(path))


def pid_alive(pid: int) -> bool:
    """True when pid exists and is not a zombie (dead, waiting to be reaped)."""
    stat = _read_proc_file(pid, "stat")
    # State is the field after the ")" closing the command name.
    return bool(stat) and stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def pids_in_group(pgid: int) -> list[int]:
    """The non-zombie processes of process group pgid (a zombie holds nothing; PID 1 may never reap it)."""
    found: list[int] = []
    for pid in _all_pids():
        stat = _read_proc_file(pid, "stat")
        fields = stat[stat.rfind(b")") + 2 :].split()  # after the name: state ppid pgrp ...
        if len(fields) >= 3 and fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(pid)
    return found


def group_alive(pgid: int) -> bool:
    """True when some non-zombie process is in process group pgid."""
    return bool(pids_in_group(pgid))
