"""Engine lifecycle: bind and close every listener, restart in process, die, crash.

`start_engine(config)` is the in-process entry point used by the CLI, the harness and the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web

from fake_engines.config import EngineConfig
from fake_engines.control import control_app
from fake_engines.core.bootstrap import query_engine_ids
from fake_engines.core.calls import BOOTSTRAP_QUERY
from fake_engines.core.identity import rank_engine_ids
from fake_engines.core.timing import SHUTDOWN_GRACE_S
from fake_engines.engine import Engine
from fake_engines.grpc_api import make_grpc_server
from fake_engines.http_api import HttpSurface, RecordedCalls, error_body
from fake_engines.kv_channel import SideChannelServer
from pdchaos.aiohttp_errors import answer_parser_errors_as_json
from pdchaos.ports import free_port

log = logging.getLogger(__name__)

# How often a graceful stop looks again whether its in-flight work is done.
_DRAIN_POLL_S = 0.02


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class EngineHandle:
    """One fake engine. Serving listeners come and go with restarts; the control API stays up throughout."""

    def __init__(self, config: EngineConfig, process_exit: bool = False) -> None:
        # In a real process (CLI) crash/die end the process; in process (tests, harness) they only close it.
        self.process_exit = process_exit
        self.started_at_wall = time.time()
        self.serving = False
        self.closed = asyncio.Event()
        self._closing = False
        self.exit_code = 0
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port
        self.bootstrap_port = 0
        self.nixl_port = 0
        self.control_port = config.control_port
        if config.connector == "mooncake" and config.role in ("prefill", "both"):
            self.bootstrap_port = config.bootstrap_port or free_port()
        if config.connector == "nixl" and config.role in ("prefill", "both"):
            self.nixl_port = config.nixl_port or free_port()
        self.config = config.with_(bootstrap_port=self.bootstrap_port, nixl_port=self.nixl_port)
        self.engine = Engine(self.config)
        self._runners: list[web.AppRunner] = []
        self._grpc: grpc.aio.Server | None = None
        self._side: list[SideChannelServer] = []
        self._control_runner: web.AppRunner | None = None
        self._lifecycle = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.on_exit: Callable[[int], None] | None = None

    # -- identity / state -----------------------------------------------------------------------------------
    @property
    def engine_id(self) -> str:
        return self.engine.engine_id

    @property
    def side_channel_port(self) -> int | None:
        if self.config.connector == "nixl":
            return self.nixl_port or None
        ports = self.engine.state.side_channel_ports
        return ports[0] if ports else None

    def url(self, kind: str = "http") -> str:
        port = {"http": self.http_port, "grpc": self.grpc_port, "control": self.control_port}[kind]
        scheme = "grpc" if kind == "grpc" else "http"
        return f"{scheme}://{self.config.host}:{port}"

    def state(self) -> dict[str, Any]:
        e = self.engine
        return {
            "name": self.config.name,
            "pid": os.getpid(),
            "role": self.config.role,
            "connector": self.config.connector,
            "engine_id": e.engine_id,
            "generation": e.identity.generation,
            "started_at": self.started_at_wall,
            "http_port": self.http_port or None,
            "grpc_port": self.grpc_port or None,
            "bootstrap_port": self.bootstrap_port or None,
            "side_channel_port": self.side_channel_port,
            "nixl_port": self.nixl_port or None,
            "control_port": self.control_port or None,
            "serving": self.serving,
            "dead": e.state.dead,
            "draining": e.state.draining,
            "faults": e.state.faults.as_dict(),
        }

    # -- serving listeners ----------------------------------------------------------------------------------
    async def _start_serving(self) -> None:
        cfg, e = self.config, self.engine
        host = cfg.host
        try:
            if cfg.connector == "mooncake" and cfg.role in ("prefill", "both"):
                ids = rank_engine_ids(e.engine_id, cfg.dp_size)
                ports = []
                for rank_id in ids:
                    srv = SideChannelServer(host, 0, self._responder(rank_id))
                    ports.append(await srv.start())
                    self._side.append(srv)
                e.state.side_channel_ports = ports
                await self._start_app(self._bootstrap_app(), self.bootstrap_port)
            elif cfg.connector == "nixl" and cfg.role in ("prefill", "both"):
                srv = SideChannelServer(host, self.nixl_port, self._responder(None))
                await srv.start()
                self._side.append(srv)
                e.state.side_channel_ports = [self.nixl_port]
            if self.grpc_port:
                server, bound = make_grpc_server(e, host, self.grpc_port)
                await server.start()
                self._grpc = server
                self.grpc_port = bound
            if self.http_port:
                await self._start_app(HttpSurface(e).app(), self.http_port)
        except BaseException:
            await self._stop_serving()
            raise
        self.serving = True

    def _responder(self, rank_id: str | None) -> Callable[[Any], Any]:
        async def respond(msg: Any) -> bytes:
            # NIXL listens on a fixed port across restarts, so it must answer with the id of *this* start.
            return await self.engine.answer_side_channel(msg, rank_id or self.engine.engine_id)

        return respond

    def _bootstrap_app(self) -> web.Application:
        app = web.Application()
        recorded = RecordedCalls(self.engine)

        async def query(request: web.Request) -> web.Response:
            async def answer() -> tuple[web.Response, dict[str, Any]]:
                reply = await self.engine.bootstrap_answer()
                return web.json_response(reply), {"engine_ids": query_engine_ids(reply)}

            return await recorded.answer(request, BOOTSTRAP_QUERY, answer)

        app.router.add_get("/query", query)
        recorded.install(app)
        return app

    async def _start_app(self, app: web.Application, port: int) -> None:
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_GRACE_S, access_log=None, handle_signals=False)
        await runner.setup()
        # Like vLLM, every error is JSON, aiohttp's own parse errors included.
        answer_parser_errors_as_json(runner, error_body)
        self._runners.append(runner)
        site = web.TCPSite(runner, self.config.host, port, reuse_address=True)
        await site.start()

    async def _stop_serving(self) -> None:
        self.serving = False
        if self._grpc is not None:
            server, self._grpc = self._grpc, None
            await server.stop(grace=SHUTDOWN_GRACE_S)
        for srv in self._side:
            await srv.close()
        self._side.clear()
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        self._runners.clear()
        self.engine.state.side_channel_ports = []

    async def start(self) -> None:
        """First start: control API at once, serving listeners after the load time."""
        if self.control_port:
            self._control_runner = web.AppRunner(
                control_app(self), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S
            )
            await self._control_runner.setup()
            await web.TCPSite(
                self._control_runner, self.config.host, self.control_port, reuse_address=True
            ).start()
        if self.config.load_time_s > 0:
            await asyncio.sleep(self.config.load_time_s)
        async with self._lifecycle:
            self.engine.state.start(self.engine.now())
            self.started_at_wall = time.time()
            await self._start_serving()
        if self.config.role in ("decode", "both") and self.config.connector != "none":
            self._spawn(self._log_kv_transfer_metrics())

    async def _log_kv_transfer_metrics(self) -> None:
        """vLLM's periodic stats line for KV transfers, in its wording: printed each stats interval in which a
        decode pulled KV (PD suites read the successful count from the worker's log)."""
        interval = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10") or 10)
        counts, last = self.engine.state.outcome_counts, 0
        while True:
            await asyncio.sleep(interval)
            pulled = counts.get("pulled", 0)
            if pulled > last:
                log.info("KV Transfer metrics: Num successful transfers=%d", pulled - last)
                last = pulled

    # -- faults that change the process ---------------------------------------------------------------------
    async def restart(self, down_s: float = 0.0, engine_id: str | None = None) -> dict[str, Any]:
        """Stop serving, stay down `down_s`, serve again on the same ports with a new identity."""
        if down_s < 0:
            raise ValueError("down_s must be >= 0")
        async with self._lifecycle:
            before = self.state()
            await self._stop_serving()
            if down_s > 0:
                await asyncio.sleep(down_s)
            cleared = self.engine.restart(engine_id)
            self.started_at_wall = time.time()
            await self._start_serving()
            after = self.state()
        changed = {
            k: {"old": before[k], "new": after[k]}
            for k in ("engine_id", "generation", "started_at", "side_channel_port")
            if before[k] != after[k]
        }
        changed["down_s"] = down_s
        if cleared:
            changed["faults_cleared"] = cleared
        return changed

    async def drain(self) -> dict[str, Any]:
        """Graceful stop (SIGTERM): refuse new work and wait until the core says in-flight requests and the
        KV decodes have yet to pull are done (bounded by the core's drain rule). The caller closes after."""
        state, now = self.engine.state, self.engine.now
        start = now()
        held, running = state.store.live(start), state.active
        state.begin_drain(start)
        while not state.drained(now()):
            await asyncio.sleep(max(0.0, min(_DRAIN_POLL_S, state.drain_wake(now()) - now())))
        waited = now() - start
        log.warning("graceful stop: %d KV held and %d request(s) running at SIGTERM; done after %.3f s "
                    "(%d KV left unpulled)", held, running, waited, state.store.live(now()))
        return {"held_kv": held, "running": running, "waited_s": round(waited, 3)}

    def crash(self) -> dict[str, Any]:
        """SIGKILL itself shortly after the answer has gone out (in process: close everything at once)."""
        self._spawn(self._crash_later())
        return {"crash": {"pid": os.getpid(), "in": 0.05}}

    async def _crash_later(self) -> None:
        await asyncio.sleep(0.05)
        if self.process_exit:
            _kill_self()
        await self.close(exit_code=137)

    def die(self, exit_after_s: float = 5.0) -> dict[str, Any]:
        """Engine death: health turns 503 / unhealthy now, the process goes away `exit_after_s` later."""
        if exit_after_s < 0:
            raise ValueError("exit_after_s must be >= 0")
        changed = self.engine.state.die()
        self._spawn(self._exit_later(exit_after_s))
        return {**changed, "exit_after_s": exit_after_s}

    async def _exit_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.close(exit_code=1)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, exit_code: int = 0) -> None:
        """Stop everything, control API included. Idempotent."""
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.exit_code = exit_code
        await self._stop_serving()
        if self._control_runner is not None:
            runner, self._control_runner = self._control_runner, None
            with contextlib.suppress(Exception):
                await runner.cleanup()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self.engine.close()
        self.closed.set()
        if self.on_exit is not None:
            self.on_exit(exit_code)

    async def wait_closed(self) -> int:
        await self.closed.wait()
        return self.exit_code


async def start_engine(config: EngineConfig, process_exit: bool = False) -> EngineHandle:
    """Start a fake engine in this process and return once it serves (after `config.load_time_s`)."""
    handle = EngineHandle(config, process_exit=process_exit)
    try:
        await handle.start()
    except BaseException:
        await handle.close(exit_code=1)
        raise
    return handle
