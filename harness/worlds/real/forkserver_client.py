"""The supervisor's side of `pdchaos.forkserver`: start it, ask it for children, learn when they end.

A forked child is not this process's child (the fork server is its parent and reaps it), so its handle,
`ForkedChild`, learns the exit code from the server's `exit` frame rather than from waitpid. It offers the
two things the supervisor uses of an `asyncio.subprocess.Process`: `returncode` and `wait()`.

If the server dies, its children die with it (their death signal is tied to it): every child still
running is then marked killed, and every spawn waiting for an answer fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fake_engines.core.timing import PROCESS_START_S
from pdchaos.forkserver import FRAME

# What a real cell starts again and again (everything else is exec'd as before), and how long each forked
# child waits before it starts: the start-up an exec'd one has, where the timing model counts on it (an
# engine's outage after a crash lasts until its respawn serves; the simulated world waits the same).
FORKABLE_MODULES = {"fake_engines": PROCESS_START_S, "reference_router": 0.0}
PRELOAD = ("fake_engines.cli", "reference_router.cli")
# Set to 0 to start every child as a fresh interpreter (to rule the fork server out while debugging).
ENABLE_ENV = "PDCHAOS_FORKSERVER"
_START_TIMEOUT_S = 30.0
_SPAWN_TIMEOUT_S = 10.0


class ForkServerError(RuntimeError):
    """The fork server did not start, or did not answer a spawn."""


def interpreter_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables a Python interpreter reads only as it starts (PYTHONPATH, PYTHONHASHSEED...): a child
    forked from a server started with other values would not see its own, so it is exec'd instead."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith("PYTHON")))


def forkable(argv: Sequence[str]) -> str | None:
    """The module to fork for argv (`<this python> -m <module> ...`), or None to exec argv as it is."""
    if os.environ.get(ENABLE_ENV, "1") == "0" or len(argv) < 3:
        return None
    if argv[0] != sys.executable or argv[1] != "-m" or argv[2] not in FORKABLE_MODULES:
        return None
    return argv[2]


class ForkedChild:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        # Killed because its fork server died (the harness's loss), not by anything of its own.
        self.server_lost = False
        self._ended = asyncio.Event()

    def ended(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode


class ForkServerClient:
    """One fork server process; `start()` it, `spawn()` children, `aclose()` it when its children are gone."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._children: dict[int, ForkedChild] = {}
        self._early_exits: dict[int, int] = {}
        self._reader: asyncio.Task[None] | None = None
        self._dead = False

    @classmethod
    async def start(cls, env: Mapping[str, str], log_path: Path,
                    preexec: Callable[[], None] | None = None) -> ForkServerClient:
        server_env = dict(env)
        server_env["PDCHAOS_FORKSERVER_PARENT"] = str(os.getpid())
        server_env.setdefault("PYTHONUNBUFFERED", "1")
        with open(log_path, "ab") as log_fh:  # noqa: ASYNC230 - a local file open
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pdchaos.forkserver", *PRELOAD,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log_fh,
                env=server_env, start_new_session=True, preexec_fn=preexec,
            )
        client = cls(proc)
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                hello = await client._read_frame()
        except (TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            client.kill()
            raise ForkServerError(
                f"the fork server did not start ({type(exc).__name__}); log {log_path}") from None
        if not hello or "ready" not in hello:
            client.kill()
            raise ForkServerError(f"the fork server said {hello!r} instead of ready; log {log_path}")
        client._reader = asyncio.create_task(client._read_loop(), name="forkserver-reader")
        return client

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _read_frame(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        head = await self.proc.stdout.readexactly(FRAME.size)
        (size,) = FRAME.unpack(head)
        doc = json.loads(await self.proc.stdout.readexactly(size))
        if not isinstance(doc, dict):
            raise ValueError("the fork server sent a frame that is not an object")
        return doc

    async def _read_loop(self) -> None:
        try:
            while True:
                doc = await self._read_frame()
                if "exit" in doc:
                    pid, code = int(doc["exit"]), int(doc["code"])
                    child = self._children.pop(pid, None)
                    if child is None:
                        self._early_exits[pid] = code
                    else:
                        child.ended(code)
                    continue
                fut = self._pending.pop(int(doc.get("id", -1)), None)
                if fut is not None and not fut.done():
                    fut.set_result(doc)
        except (asyncio.IncompleteReadError, ValueError, ConnectionError):
            pass
        finally:
            self._server_gone()

    def _server_gone(self) -> None:
        """The server's children got SIGKILL from the kernel when it died; say so, and make sure of it."""
        self._dead = True
        for pid, child in list(self._children.items()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            child.server_lost = True
            child.ended(-signal.SIGKILL)
        self._children.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ForkServerError("the fork server exited"))
        self._pending.clear()

    @property
    def alive(self) -> bool:
        """Still answering: its output has not ended and it has not exited."""
        return not self._dead and self.proc.returncode is None

    async def spawn(self, module: str, args: Sequence[str], env: Mapping[str, str], log_path: Path,
                    name: str = "", cwd: str | None = None) -> ForkedChild:
        if self._dead:
            raise ForkServerError("the fork server has exited")
        assert self.proc.stdin is not None
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        req = {"op": "spawn", "id": rid, "module": module, "args": list(args), "env": dict(env),
               "cwd": cwd or os.getcwd(), "log": str(log_path), "name": name,
               "start_delay_s": FORKABLE_MODULES.get(module, 0.0)}
        data = json.dumps(req, separators=(",", ":")).encode()
        self.proc.stdin.write(FRAME.pack(len(data)) + data)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancellation of this task that
            # arrives as the answer does, and a cancelled run must end cancelled.
            async with asyncio.timeout(_SPAWN_TIMEOUT_S):
                await self.proc.stdin.drain()
                answer = await asyncio.shield(fut)
        except (TimeoutError, ConnectionError) as exc:
            self._pending.pop(rid, None)
            raise ForkServerError(f"the fork server did not answer a spawn of {module} ({exc!r})") from None
        if "error" in answer:
            raise ForkServerError(f"the fork server could not start {module}: {answer['error']}")
        pid = int(answer["pid"])
        child = ForkedChild(pid)
        if pid in self._early_exits:
            child.ended(self._early_exits.pop(pid))
        else:
            self._children[pid] = child
        return child

    def kill(self) -> None:
        """SIGKILL the server (its children follow through their death signal). Sync, idempotent."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def aclose(self, timeout_s: float = 2.0) -> None:
        """End the server: close its input (it exits at end of input), SIGKILL it if it lingers."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            async with asyncio.timeout(timeout_s):
                await self.proc.wait()
        except TimeoutError:
            self.kill()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self.proc.wait()
        self.kill()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


class ForkServerSlot:
    """Where one fork server lives: started at the first child that asks, started again if it died, and no
    server at all (None: exec the child) for a child whose interpreter settings differ from the server's."""

    def __init__(self, base_env: Mapping[str, str], log_path: Callable[[], Path],
                 preexec: Callable[[], None] | None = None) -> None:
        self.base_env = dict(base_env)
        self._log_path = log_path
        self._preexec = preexec
        self._lock = asyncio.Lock()
        self.client: ForkServerClient | None = None

    async def get(self, env: Mapping[str, str]) -> ForkServerClient | None:
        if interpreter_env(env) != interpreter_env(self.base_env):
            return None
        async with self._lock:
            if self.client is not None and not self.client.alive:
                self.client.kill()
                self.client = None
            if self.client is None:
                self.client = await ForkServerClient.start(self.base_env, self._log_path(), self._preexec)
            return self.client

    def kill(self) -> None:
        if self.client is not None:
            self.client.kill()

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
