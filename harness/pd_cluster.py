"""A running PD topology for a test: fake engines plus the reference router on loopback (`PDCluster`).

`running_cluster` brings one up and always tears it down. The cluster's processes are owned by a private
event-loop thread that lives as long as the cluster (their parent-death signal is tied to that thread), so it
works from sync and async tests alike; teardown kills every process group it started, whatever the caller
did. The pytest plugin's `pd_cluster` fixture is a thin wrapper around it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import uuid
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class _LoopThread:
    """An event loop on a thread of its own that lives as long as the cluster (see the module docstring)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="pd-cluster-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"pd_cluster call did not finish within {timeout_s} s") from None

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        if not self._thread.is_alive():
            self.loop.close()


@dataclass
class ClusterConfig:
    topology: str = "1p1d"
    connector: str = "mooncake"
    transport: str = "http"
    router: Any = None  # harness.scenario.RouterSettings; None: fast test defaults
    engines: Any = None  # harness.scenario.EngineSettings; None: fast test defaults
    ready_timeout_s: float = 20.0


@dataclass
class PDCluster:
    """A running topology: fake engines plus the reference router, all on loopback.

    Addresses: `router_url`, `engine_urls[name]` (what the router was given: http:// or grpc://),
    `http_urls[name]`, `control_urls[name]`; `topology` (harness.topology.Topology) has everything else.
    Engine names are `prefill-0..`, `decode-0..`.
    Control (async, usable from any event loop): `control(name)` -> EngineControlClient (restart, crash,
    fault, ...), `workers()`, `worker(name)`, `add_worker(name)`, `patch_worker(name, body)`,
    `remove_worker(name)`, `wait_status(name, status)`; `completion(prompt)` sends one request through
    the router. Sync tests wrap any of them in `run(...)`. Process level (sync): `pid(name)`,
    `kill(name)` (SIGKILL the engine's process group), `respawn(name)` (same ports, new process).
    """

    config: ClusterConfig
    out_dir: Path
    api_key: str
    token: str
    _loop: _LoopThread = field(repr=False)
    _sup: Any = field(repr=False)
    _fleet: Any = field(repr=False)
    _adapter: Any = field(repr=False)
    _world: Any = field(repr=False)
    _session: Any = field(repr=False)

    @property
    def topology(self) -> Any:
        """The cell's topology as it runs (a router whose port was taken at start moved to another)."""
        return self._world.topo

    @property
    def router_url(self) -> str:
        return str(self.topology.router_url)

    @property
    def engine_urls(self) -> dict[str, str]:
        return {e.name: e.url(self.topology.transport) for e in self.topology.engines}

    @property
    def http_urls(self) -> dict[str, str]:
        return {e.name: e.http_url for e in self.topology.engines}

    @property
    def control_urls(self) -> dict[str, str]:
        return {e.name: e.control_url for e in self.topology.engines}

    @property
    def log_dir(self) -> Path:
        return self.out_dir / "logs"

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = 60.0) -> T:
        """Run a coroutine to completion from sync code (on the cluster's own loop)."""
        return self._loop.run(coro, timeout_s)

    def control(self, name: str, timeout_s: float = 10.0) -> Any:
        from fake_engines.control_client import EngineControlClient

        return EngineControlClient(self.topology.engine(name).control_url, self.token, timeout_s)

    async def _router(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await self._adapter._call(session, method, self.router_url + path, body)

    async def workers(self) -> list[dict[str, Any]]:
        """The router's workers (CONTRACTS §2 W objects)."""
        status, body = await self._router("GET", "/workers")
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"GET /workers answered {status}: {body}")
        return list(body.get("workers") or [])

    async def worker(self, name: str) -> dict[str, Any] | None:
        for w in await self.workers():
            if self.topology.name_of_url(str(w.get("url", ""))) == name:
                return w
        return None

    async def add_worker(self, name: str) -> tuple[int, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await self._adapter.add_worker(session, self.topology, name)

    async def patch_worker(self, name: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await self._adapter.patch_worker(session, self.topology, name, body)

    async def remove_worker(self, name: str) -> tuple[int, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await self._adapter.remove_worker(session, self.topology, name)

    async def wait_status(self, name: str, status: str = "ready", timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll the worker API until the engine's worker has `status`; TimeoutError says what was seen."""
        from pdchaos.waiting import poll_until

        seen: Any = None

        async def in_status() -> dict[str, Any] | None:
            nonlocal seen
            w = await self.worker(name)
            seen = None if w is None else w.get("status")
            return w if w is not None and seen == status else None

        found = await poll_until(in_status, timeout_s)
        if found is None:
            raise TimeoutError(f"worker {name} not {status} within {timeout_s:g} s (last seen: {seen})")
        return found

    async def completion(self, prompt: str, max_tokens: int = 4, timeout_s: float = 10.0,
                         **extra: Any) -> tuple[int, Any]:
        """POST /v1/completions through the router: (HTTP status, decoded body)."""
        import aiohttp

        body = {"model": "pdchaos-fake", "prompt": prompt, "max_tokens": max_tokens, **extra}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s,
            s.post(self.router_url + "/v1/completions", json=body) as resp,
        ):
            try:
                data = await resp.json(content_type=None)
            except ValueError:
                data = await resp.text()
            return resp.status, data

    def pid(self, name: str) -> int:
        proc = self._sup.get(name)
        if proc is None:
            raise KeyError(f"no process {name!r}")
        return int(proc.pid)

    def kill(self, name: str) -> None:
        """SIGKILL the engine's (or `router`'s) whole process group and reap it."""
        import signal

        proc = self._sup.get(name)
        if proc is None:
            raise KeyError(f"no process {name!r}")
        proc.signal(signal.SIGKILL)
        self._loop.run(proc.wait(5.0), 10.0)

    def respawn(self, name: str) -> int:
        """Start a killed engine again on the same ports (new process, new engine id); returns its pid."""
        proc = self._loop.run(self._fleet.start(name, first_start=False), self.config.ready_timeout_s + 5)
        return int(proc.pid)


def _build_cluster(cfg: ClusterConfig, out: Path, loop: _LoopThread) -> PDCluster:
    """The runner's own bring-up: a session that ends once every worker is Ready, over the real world."""
    from harness.routers import ReferenceRouter
    from harness.scenario import EngineSettings, RouterSettings, Scenario
    from harness.session import ScenarioSession
    from harness.topology import allocate
    from harness.worlds.real.world import RealWorld

    topo = allocate(cfg.topology, cfg.connector, cfg.transport)
    scenario = Scenario(
        name="pd_cluster", description="a live topology for a test", topologies=(topo.name,),
        connectors=(cfg.connector,), transports=(cfg.transport,),
        router=cfg.router or RouterSettings(health_interval_s=0.2, health_timeout_s=0.5),
        engines=cfg.engines or EngineSettings(transfer_timeout_s=2.0, kv_abort_timeout_s=30.0),
        ready_timeout_s=cfg.ready_timeout_s,
    )
    api_key = "pdchaos-" + uuid.uuid4().hex[:12]
    adapter = ReferenceRouter(api_key=api_key)
    session = ScenarioSession(scenario, topo, router=adapter.name, history_path=out / "history.jsonl",
                              bring_up_only=True)
    world = RealWorld(session.plan, adapter, out, engine_ready_timeout_s=cfg.ready_timeout_s)
    return PDCluster(cfg, out, api_key, world.token, loop, world.supervisor, world.fleet, adapter,
                     world, session)


async def _start_cluster(cluster: PDCluster) -> None:
    world, session = cluster._world, cluster._session
    await world.__aenter__()
    try:
        await world.run(session)
        if session.reason != "ready":
            raise RuntimeError(f"pd_cluster did not come up: {session.reason}")
    except BaseException:
        await _stop_cluster(cluster)
        raise


async def _stop_cluster(cluster: PDCluster) -> None:
    try:
        router = cluster._sup.get("router")
        if router is not None:
            await cluster._sup.stop(router, grace_s=1.0)
    finally:
        await cluster._world.__aexit__(None, None, None)
        if cluster._session.history is not None:
            cluster._session.history.close()


@contextlib.contextmanager
def running_cluster(cfg: ClusterConfig, out: Path) -> Iterator[PDCluster]:
    """A cluster that is up (every worker Ready) inside the block and gone after it, whatever happened."""
    loop = _LoopThread()
    cluster = _build_cluster(cfg, out, loop)
    started = False
    try:
        loop.run(_start_cluster(cluster), cfg.ready_timeout_s * 3 + 10)
        started = True
        yield cluster
    finally:
        try:
            if started:
                loop.run(_stop_cluster(cluster), 30.0)
        finally:
            # Whatever happened above (a start that timed out, a caller that broke the loop): no survivors.
            cluster._sup.kill_all()
            loop.close()


__all__ = ["ClusterConfig", "PDCluster", "running_cluster"]
