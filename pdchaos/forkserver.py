"""A fork server: a process that imports the project's engines and router once, then forks each child from
itself instead of starting a fresh interpreter that imports them again.

A real-time cell starts three to six Python processes (router, engines, their restarts), and each spent
about half a CPU-second importing aiohttp, grpc and the project before it served anything: on a 2-core
machine that was a third of the default suite's CPU. A forked child starts in milliseconds.

    python -m pdchaos.forkserver MODULE [MODULE ...]     # modules to import before serving

The parent (`harness.worlds.real.forkserver_client`) talks to it over its stdin and stdout in frames: a
4-byte big-endian length, then a JSON object.

- in:  `{"op": "spawn", "id": N, "module": M, "args": [...], "env": {...}, "cwd": DIR, "log": PATH,
  "name": NAME, "start_delay_s": S}` (NAME: the child's `ps` name; S: seconds the child sleeps before it
  runs M, the start-up an exec'd process has where the caller's timing depends on it)
- out: `{"id": N, "pid": P}` or `{"id": N, "error": TEXT}`; later `{"exit": P, "code": C}` when child P ends
  (C negative: killed by signal -C, as `subprocess` reports it).

Each child runs `python -m M args...` as a fresh process would: its own session and process group, the
environment it was given, stdin from /dev/null, stdout and stderr into its log, and a death signal tied to
this server (which has one tied to the harness), so no child outlives a SIGKILLed harness. The server
imports nothing from the harness and starts no thread, so a fork copies a single-threaded process.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import struct
import sys
import time
from typing import Any, BinaryIO

FRAME = struct.Struct(">I")
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_MAX_FRAME = 64 << 20


def write_frame(out: BinaryIO, doc: dict[str, Any]) -> None:
    data = json.dumps(doc, separators=(",", ":")).encode()
    out.write(FRAME.pack(len(data)) + data)
    out.flush()


def _read_exact(inp: BinaryIO, size: int) -> bytes:
    """size bytes, fewer only at end of input (a pipe may hand them over in pieces)."""
    buf = b""
    while len(buf) < size:
        chunk = inp.read(size - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def read_frame(inp: BinaryIO) -> dict[str, Any] | None:
    """The next frame, or None at end of input."""
    head = _read_exact(inp, FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    if size > _MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    data = _read_exact(inp, size)
    if len(data) < size:
        return None
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("a frame must hold a JSON object")
    return doc


def _prctl() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def set_comm(name: str) -> None:
    """Name this process in `ps -o comm` and /proc/PID/comm (its cmdline stays the server's)."""
    if _PRCTL is not None and name:
        _PRCTL(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


class ForkServer:
    def __init__(self, inp: BinaryIO, out: BinaryIO) -> None:
        self.inp = inp
        self.out = out
        self.children: set[int] = set()
        self.server_pid = os.getpid()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def serve(self) -> int:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        while True:
            ready, _, _ = select.select([self.inp, self.wake_r], [], [])
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
            self.reap()
            if self.inp in ready:
                try:
                    req = read_frame(self.inp)
                except ValueError as exc:
                    print(f"forkserver: bad request: {exc}", file=sys.stderr)
                    return 2
                if req is None:
                    return 0
                self.handle(req)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            write_frame(self.out, {"exit": pid, "code": exit_code(status)})

    def handle(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        if req.get("op") != "spawn":
            write_frame(self.out, {"id": rid, "error": f"unknown op {req.get('op')!r}"})
            return
        try:
            log_fd = os.open(str(req["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except (KeyError, OSError) as exc:
            write_frame(self.out, {"id": rid, "error": f"cannot open the log: {exc}"})
            return
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(log_fd)
            write_frame(self.out, {"id": rid, "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            self.become_child(req, log_fd)  # never returns
        os.close(log_fd)
        self.children.add(pid)
        write_frame(self.out, {"id": rid, "pid": pid})

    def become_child(self, req: dict[str, Any], log_fd: int) -> None:
        code = 1
        try:
            os.setsid()
            die_with_parent(self.server_pid)
            set_comm(str(req.get("name") or ""))
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            for fd in (null, log_fd, self.wake_r, self.wake_w, self.inp.fileno(), self.out.fileno()):
                with contextlib.suppress(OSError):
                    os.close(fd)
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in dict(req.get("env") or {}).items()})
            os.chdir(str(req.get("cwd") or "."))
            delay = float(req.get("start_delay_s") or 0.0)
            if delay > 0:
                time.sleep(delay)
            module = str(req["module"])
            sys.argv = [module, *(str(a) for a in req.get("args") or [])]
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, int | None):
                    print(exc.code, file=sys.stderr)
            with contextlib.suppress(BaseException):
                atexit._run_exitfuncs()
        except BaseException:
            import traceback

            with contextlib.suppress(BaseException):
                traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def main(argv: list[str] | None = None) -> int:
    modules = list(sys.argv[1:] if argv is None else argv)
    parent = int(os.environ.get("PDCHAOS_FORKSERVER_PARENT", "0") or 0)
    if parent:
        die_with_parent(parent)
    # Frames go over the real stdout; anything printed (by an import, say) goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in modules:
        importlib.import_module(name)
    server = ForkServer(inp, out)
    write_frame(out, {"ready": os.getpid(), "modules": modules})
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
