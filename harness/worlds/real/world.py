"""The real world: a cell as OS processes on loopback, talked to over HTTP, with Toxiproxy on faulted links.

Engines are fake-engine processes (`engines`), the router under test is any adapter of `harness.routers`
(the reference router, a real gateway, a command template), the client is aiohttp (`client`), engine and
worker API faults are applied by `engine_actions`, network faults by `links`. No process outlives the cell:
every child is in its own process group, tied to the harness's life, and killed on every exit path.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, assert_never

import aiohttp

from harness.contract.settings import CONTRACT_NOTE
from harness.router_metrics import snapshot
from harness.routers import RouterAdapter
from harness.scenario.actions import PauseRouter
from harness.scenario.links import LinkRef, NetworkAction
from harness.session import CellPlan
from harness.session import commands as c
from harness.session import events as e
from harness.topology import Topology
from harness.worlds.base import CommandWorld, Emit
from harness.worlds.real.backends import EngineChoice, make_fleet, parse_engines
from harness.worlds.real.client import RouterClient
from harness.worlds.real.engine_actions import EngineActions
from harness.worlds.real.engines import EngineFleet
from harness.worlds.real.links import NetworkLinks
from harness.worlds.real.probes import process_state
from harness.worlds.real.processes import (
    ManagedProcess,
    ProcessStartError,
    ProcessSupervisor,
    exit_evidence,
    log_cap_notes,
    lost_its_port,
)
from pdchaos.ports import free_ports
from pdchaos.waiting import poll_until

ROUTER_READY_TIMEOUT_S = 20.0
ROUTER_STOP_GRACE_S = 1.0
# Starts of the router in all when its port is taken by another process before it binds it.
ROUTER_START_ATTEMPTS = 3
COMPANION_STOP_S = 2.0


class RealWorld(CommandWorld):
    kind = "real"

    def __init__(self, plan: CellPlan, router: RouterAdapter, out_dir: Path,
                 engine_ready_timeout_s: float = 20.0, engines: EngineChoice | str = "fake") -> None:
        self.plan = plan
        self.topo: Topology = plan.topology
        self.router = router
        self.out = out_dir
        self.token = uuid.uuid4().hex
        self.supervisor = ProcessSupervisor(out_dir / "logs")
        self.net = NetworkLinks(list(plan.links), plan.topology, seed=plan.seed)
        self.fleet: EngineFleet = make_fleet(parse_engines(engines), plan.topology, plan.scenario.engines,
                                             self.supervisor, out_dir, self.token, engine_ready_timeout_s)
        self.http: aiohttp.ClientSession | None = None
        self.client: RouterClient | None = None
        self.actions: EngineActions | None = None
        self._opening_notes: list[e.Event] = []
        self._router_proc: ManagedProcess | None = None
        self._router_exit_said = False
        self._companion: asyncio.Task[None] | None = None

    @property
    def router_topology(self) -> Topology:
        """How the router knows the engines (through the proxies of faulted links), on its current port."""
        topo = self.net.router_topology
        if topo.router_port == self.topo.router_port:
            return topo
        return replace(topo, router_port=self.topo.router_port)

    # ------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> RealWorld:
        await self.supervisor.__aenter__()
        try:
            self.http = aiohttp.ClientSession()
            topo = await self.fleet.prepare(self.plan.links)
            if topo is not self.topo:  # engines elsewhere (a cluster): their links are faulted there
                self.topo = topo
                self.net = self.fleet.network(list(self.plan.links), self.plan.seed)
            self._opening_notes = await self.net.open()
            self.fleet.settings = self.net.engine_settings(self.plan.scenario.engines)
            self.client = RouterClient(self.http, self.topo.router_url)
            self.actions = EngineActions(self.fleet, self.router, self.http, self.router_topology)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self._stop_companion()
            if self.actions is not None:
                self.actions.cancel_waiters()
                self.actions.resume_all()
            with contextlib.suppress(Exception):
                await self.net.close()
            with contextlib.suppress(Exception):
                await self.fleet.close()
            if self.http is not None:
                await self.http.close()
        finally:
            await self.supervisor.__aexit__(exc_type, exc, tb)

    # ------------------------------------------------------------------ commands

    async def execute(self, command: c.Command, emit: Emit) -> None:
        match command:
            case c.LaunchEngine():
                await self._launch_engine(command, emit)
            case c.LaunchRouter():
                await self._launch_router(command, emit)
            case c.PollWorkers():
                await self._poll_workers(emit)
            case c.PollRouterEvents():
                await self._poll_router_events(command, emit)
            case c.CheckRoutable():
                await self._check_routable(emit)
            case c.SendRequest():
                await self._send_request(command, emit)
            case c.CancelRequests():
                self._cancel_requests()
            case c.ApplyAction():
                await self._apply_action(command, emit)
            case c.SetLinkEnabled():
                await self._set_link_enabled(command, emit)
            case c.Teardown():
                await self._teardown(emit)
            case c.CollectHandoffs():
                self._collect_handoffs(emit)
            case _:
                assert_never(command)

    def log_notes(self) -> list[str]:
        """What the log cap took from this cell's process logs (the result's notes)."""
        return log_cap_notes(self.supervisor.processes)

    def opening_events(self) -> list[e.Event]:
        notes, self._opening_notes = self._opening_notes, []
        return notes

    async def _launch_engine(self, cmd: c.LaunchEngine, emit: Emit) -> None:
        try:
            proc = await self.fleet.start(cmd.name, cmd.first_start)
        except Exception as exc:
            emit(e.EngineFailed(cmd.name, f"{type(exc).__name__}: {exc}"))
            return
        state = proc.ready_info if proc.ready_info and "engine_id" in proc.ready_info else None
        emit(e.EngineUp(cmd.name, state or await self.fleet.state(cmd.name)))

    async def _launch_router(self, cmd: c.LaunchRouter, emit: Emit) -> None:
        for attempt in range(1, ROUTER_START_ATTEMPTS + 1):
            try:
                await self.net.install(self.fleet, emit)
                rtopo = self.router_topology
                launch = self.router.launch(rtopo, cmd.settings, list(cmd.registered),
                                            str(self.out / "router-events.jsonl"))
                emit(e.WorldNote("router launch", {"argv": launch.argv}))
                contract = self.router.contract(cmd.settings)
                if contract is not None:
                    emit(e.WorldNote(CONTRACT_NOTE, {"router_contract": contract}))
                self._router_proc = await self.supervisor.spawn(
                    "router", launch.argv, env=launch.env or None, ready_prefix=launch.ready_prefix,
                    ready_timeout_s=ROUTER_READY_TIMEOUT_S,
                )
                await self._wait_router(self._router_proc)
                break
            except Exception as exc:
                if (isinstance(exc, ProcessStartError) and attempt < ROUTER_START_ATTEMPTS
                        and lost_its_port(exc.log_path)):
                    self._move_router(emit, attempt)
                    continue
                emit(e.RouterFailed(f"{type(exc).__name__}: {exc}"))
                return
        assert self.http is not None
        beside = self.router.companion(self.http, rtopo, emit)
        if beside is not None:
            self._companion = asyncio.create_task(_guarded(beside, emit), name="router-companion")
        emit(e.RouterUp(has_events=self.router.has_events))

    def _move_router(self, emit: Emit, attempt: int) -> None:
        """The router's port was taken before it bound it (a race with any other process on the host, not
        the system under test's fault): start it again on another free port, and talk to it there."""
        old, new = self.topo.router_port, free_ports(1)[0]
        self.topo = replace(self.topo, router_port=new)
        assert self.http is not None and self.actions is not None
        self.client = RouterClient(self.http, self.topo.router_url)
        self.actions.router_topo = self.router_topology
        emit(e.WorldNote("router port taken before the router bound it: starting it on another port",
                         {"port": old, "new_port": new, "attempt": attempt}))

    async def _stop_companion(self) -> None:
        task, self._companion = self._companion, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=COMPANION_STOP_S)

    async def _wait_router(self, proc: ManagedProcess) -> None:
        assert self.http is not None
        await wait_router_serving(self.router, proc, self.http, self.topo, ROUTER_READY_TIMEOUT_S)

    def _router_gone(self, emit: Emit) -> None:
        """Said once: the router process ended while the run polls it (a crash of the system under test; the
        checkers would only see lost requests)."""
        proc = self._router_proc
        if proc is None or proc.alive or self._router_exit_said:
            return
        self._router_exit_said = True
        # A signal's victim says nothing in its log: then the log's last lines would only mislead.
        code = proc.returncode
        why = exit_evidence(proc.log_path) if code is not None and code >= 0 else ""
        emit(e.RouterExited(code, why, str(proc.log_path), by_harness=proc.lost_with_fork_server))

    async def _poll_workers(self, emit: Emit) -> None:
        assert self.http is not None
        self._router_gone(emit)
        workers = await self.router.workers(self.http, self.router_topology)
        engines: dict[str, str] = {}
        for w in workers or []:
            url = str(w.get("url", ""))
            name = self.router_topology.name_of_url(url)
            if name is not None:
                engines[url] = name
        emit(e.WorkersSeen(None if workers is None else tuple(workers), engines,
                           self.router.workers_problem if workers is None else ""))

    async def _poll_router_events(self, cmd: c.PollRouterEvents, emit: Emit) -> None:
        assert self.http is not None
        self._router_gone(emit)
        metrics = None
        if cmd.final:
            # The counters first: every event they count is in the read that follows.
            began = time.time()
            counters = await self.router.counters(self.http, self.router_topology)
            if counters is not None:
                metrics = snapshot((began, time.time()), counters)
        got = await self.router.events(self.http, self.router_topology, cmd.since)
        if got is None:
            emit(e.RouterEventsSeen(None, cmd.since))
            return
        events, nxt = got
        emit(e.RouterEventsSeen(tuple(events), nxt, metrics))

    async def _check_routable(self, emit: Emit) -> None:
        """For routers without a worker API: one completion goes through."""
        assert self.http is not None
        ok = False
        try:
            async with self.http.post(
                f"{self.topo.router_url}/v1/completions",
                json={"model": "pdchaos-fake", "prompt": "[pdchaos:warmup:0] ready", "max_tokens": 1},
                timeout=aiohttp.ClientTimeout(total=2.0),
            ) as resp:
                await resp.read()
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        emit(e.RoutableSeen(ok))

    async def _send_request(self, cmd: c.SendRequest, emit: Emit) -> None:
        assert self.client is not None
        emit(await self.client.send(cmd.plan))

    def _cancel_requests(self) -> None:
        if self.client is not None:
            self.client.cancel_all()

    async def _apply_action(self, cmd: c.ApplyAction, emit: Emit) -> None:
        assert self.actions is not None
        action = cmd.action
        try:
            if isinstance(action, NetworkAction):
                await self.net.apply(cmd.fault, action, emit)
            elif isinstance(action, PauseRouter):
                await self._pause_router(cmd.fault, action, emit)
            else:
                await self.actions.apply(cmd.fault, action, emit)
        except Exception as exc:  # one broken action must not end the run: it is evidence
            emit(e.ActionDone(cmd.fault, error=f"{type(exc).__name__}: {exc}"))

    async def _pause_router(self, fid: str, a: PauseRouter, emit: Emit) -> None:
        """SIGSTOP the router's process group for `pause_s`, then SIGCONT; verified from the process state
        the kernel shows (stopped, then running again), never from the router's own answers."""
        proc = self._router_proc
        if proc is None or not proc.alive:
            emit(e.ActionDone(fid, error="the harness did not start the router, or it is gone: it cannot "
                                         "pause it"))
            return
        emit(e.FaultApplied(fid, "pause_router", a.target, {"pause_s": a.pause_s}, {"pid": proc.pid}))
        t0 = time.monotonic()
        sent = proc.signal(signal.SIGSTOP)
        try:
            stopped = bool(await poll_until(lambda: process_state(proc.pid) == "T", 1.0))
            state = process_state(proc.pid)
            emit(e.FaultVerified(fid, sent and stopped, {"state": state, "signal": "SIGSTOP"}))
            await asyncio.sleep(max(0.0, a.pause_s - (time.monotonic() - t0)))
        finally:
            proc.signal(signal.SIGCONT)
        resumed = bool(await poll_until(lambda: process_state(proc.pid) not in ("T", None), 1.0))
        emit(e.ActionDone(fid, verified=resumed, evidence={"state": process_state(proc.pid),
                                                           "signal": "SIGCONT"}))

    async def _set_link_enabled(self, cmd: c.SetLinkEnabled, emit: Emit) -> None:
        await self.net.set_enabled(LinkRef(cmd.engine, cmd.link), cmd.enabled)
        emit(e.LinkToggled(cmd.fault, cmd.engine, cmd.link, cmd.enabled))

    async def _teardown(self, emit: Emit) -> None:
        await self._stop_companion()  # nothing re-registers workers while the cell is taken down
        resumed: list[str] = []
        if self.actions is not None:
            resumed = self.actions.resume_all()
        # The router first: engines going away must not be the last thing it records.
        self._router_exit_said = True  # stopped here, not crashed
        if self._router_proc is not None:
            await self.supervisor.stop(self._router_proc, grace_s=ROUTER_STOP_GRACE_S)
        # Engines next, so their records are final when they are read.
        await self.fleet.stop_all()
        await self.supervisor.aclose(grace_s=1.0)
        emit(e.TornDown(tuple(resumed)))

    def _collect_handoffs(self, emit: Emit) -> None:
        """Every engine's provenance records, as the engine backend keeps them."""
        try:
            records = self.fleet.records()
        except OSError as exc:
            emit(e.HandoffsCollected((), error=str(exc)))
            return
        emit(e.HandoffsCollected(tuple(records)))


async def _guarded(loop: Coroutine[Any, Any, None], emit: Emit) -> None:
    """The router's companion; its failure is evidence in the history, never a silent stop or a crash."""
    try:
        await loop
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        emit(e.WorldNote("router companion failed", {"error": f"{type(exc).__name__}: {exc}"}))


async def wait_router_serving(router: RouterAdapter, proc: ManagedProcess, http: aiohttp.ClientSession,
                              topo: Topology, timeout_s: float) -> None:
    """The adapter's readiness check (a gateway's workers are registered there), cut short when the router
    process exits first; RuntimeError with the log's last lines then."""
    ready = asyncio.create_task(router.wait_ready(http, topo, timeout_s))
    exited = asyncio.create_task(proc.wait(timeout_s + 1.0))
    try:
        done, _ = await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (ready, exited):
            if not t.done():
                t.cancel()
    if ready in done:
        ready.result()
        return
    why = exit_evidence(proc.log_path)
    raise ProcessStartError(f"router exited with code {proc.returncode} before serving: {why}", proc.name,
                            proc.log_path, proc.returncode)
