"""Timeline actions on real engine processes and on the router's worker API: apply, then verify with evidence.

Each action reports `FaultApplied` when it is in place, `EngineReport` when the engine's identity may have
moved, `FaultVerified` with what was seen (process state, connection refused, a new engine id, a surface that
no longer answers). Which faults an action ends is the session's ledger's business, not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Mapping
from typing import Any, assert_never

import aiohttp

from fake_engines.control_client import ControlError
from harness.routers import RouterAdapter
from harness.scenario.actions import (
    AddWorker,
    Crash,
    Die,
    EngineAction,
    EngineFault,
    GracefulStop,
    Heal,
    PatchWorker,
    RemoveWorker,
    Respawn,
    Restart,
    SlowStart,
    StartEngine,
    Wedge,
    WorkerApiAction,
)
from harness.session.events import ActionDone, EngineReport, Event, FaultApplied, FaultVerified, WorldNote
from harness.topology import Topology
from harness.worlds.base import RESPAWN_WAIT_S, graceful_stop_verified, refused_call
from harness.worlds.real.engines import EngineFleet
from harness.worlds.real.probes import http_probe, port_closed, port_open, process_state, sees_refused
from harness.worlds.real.processes import ManagedProcess
from pdchaos.waiting import poll_until

# How long a graceful stop's end waits for its verification to be said first.
VERIFY_WAIT_S = 30.0
# A worker API call a router answers 202 runs as a job later (smg): how long its effect may take to show.
ACCEPTED = 202
WORKER_JOB_S = 5.0

Emit = Callable[[Event], None]


class EngineActions:
    """Applies engine and worker API actions in one real-time cell."""

    def __init__(self, fleet: EngineFleet, router: RouterAdapter, session: aiohttp.ClientSession,
                 router_topo: Topology) -> None:
        self.fleet = fleet
        self.topo = fleet.topo
        self.router = router
        self.session = session
        # How the router knows the engines (proxied links give other ports): worker API actions use this.
        self.router_topo = router_topo
        self.stopped: set[str] = set()  # engines under SIGSTOP
        self._waiters: set[asyncio.Task[None]] = set()  # graceful stops still draining

    async def apply(self, fid: str, a: EngineAction | WorkerApiAction, emit: Emit) -> None:
        """Carry out one action; `ActionDone` last. An exception propagates (the caller reports it)."""
        evidence: dict[str, Any] = {}
        verified = True
        match a:
            case Restart(mode="control") if self.fleet.has_control():
                await self._restart_control(fid, a, emit)
            case Restart():
                # Without a control API (a real engine) every restart is a process restart with a new id.
                await self._restart_process(fid, a, emit)
            case SlowStart():
                await self._slow_start(fid, a, emit)
            case Crash():
                await self._crash(fid, a, emit)
            case GracefulStop():
                await self._graceful_stop(fid, a, emit)
            case Respawn():
                await self._respawn(fid, a.target, emit)
            case StartEngine():
                await self._start_engine(fid, a.target, emit)
            case Die():
                await self._die(fid, a, emit)
            case Wedge(mode="control"):
                await self._wedge_control(fid, a, emit)
            case Wedge():
                await self._sigstop(fid, a, emit)
            case EngineFault():
                await self._engine_fault(fid, a, emit)
            case Heal():
                verified, evidence = await self._heal(a, emit)
            case PatchWorker():
                await self._patch(fid, a, emit)
            case AddWorker():
                await self._add_worker(fid, a, emit)
            case RemoveWorker():
                await self._remove_worker(fid, a, emit)
            case _:
                assert_never(a)
        emit(ActionDone(fid, verified=verified, evidence=evidence))

    async def _state(self, name: str, emit: Emit, given: Any = None) -> dict[str, Any] | None:
        """The engine's state (from a control answer when it carries one), reported as `EngineReport`."""
        st = given.get("state") if isinstance(given, dict) else None
        if not (isinstance(st, dict) and "engine_id" in st):
            st = await self.fleet.state(name)
        if st is not None:
            emit(EngineReport(name, st))
        return st

    def _serving_port(self, name: str) -> int:
        return self.topo.engine(name).serving_port(self.topo.transport)

    def _host(self, name: str) -> str:
        """Where the engine's ports are (loopback, or a cluster node's address)."""
        return self.topo.engine(name).host

    # -- process-level faults

    async def _restart_control(self, fid: str, a: Restart, emit: Emit) -> None:
        name = a.target
        before = await self.fleet.state(name)
        params = {"down_s": a.down_s, "mode": "control", "engine_id": a.engine_id}
        old = {"engine_id": {"old": (before or {}).get("engine_id")}}
        emit(FaultApplied(fid, "restart", name, params, old))
        down_seen: asyncio.Task[bool] | None = None
        if a.down_s >= 0.2:
            down_seen = asyncio.create_task(
                sees_refused(self._serving_port(name), a.down_s, self._host(name)))
        resp = await self.fleet.control(name, timeout_s=10.0).restart(a.down_s, a.engine_id)
        after = await self._state(name, emit, resp)
        refused = await down_seen if down_seen is not None else None
        evidence = _identity_evidence(before, after)
        evidence["refused_while_down"] = refused
        # Bounded, not one look: behind a cluster's Service the port opens a moment after the engine's.
        evidence["serving_port_open"] = bool(await poll_until(
            lambda: port_open(self._serving_port(name), self._host(name)), 1.0))
        ok = bool(evidence["new_engine_id"]) and evidence["serving_port_open"] and refused is not False
        emit(FaultVerified(fid, ok, evidence))
        self.stopped.discard(name)

    async def _restart_process(self, fid: str, a: Restart, emit: Emit) -> None:
        name = a.target
        before = await self.fleet.state(name)
        proc = self.fleet.procs.get(name)
        emit(FaultApplied(fid, "restart", name, {"down_s": a.down_s, "mode": "process"},
                          {"engine_id": {"old": (before or {}).get("engine_id")},
                           "pid": {"old": proc and proc.pid}}))
        if proc is not None:
            proc.signal(signal.SIGKILL)
            await proc.wait(5.0)
        refused = await port_closed(self._serving_port(name), self._host(name))
        if a.down_s > 0:
            await asyncio.sleep(a.down_s)
        new = await self.fleet.start(name, first_start=False)
        after = await self._state(name, emit, {"state": new.ready_info})
        evidence = _identity_evidence(before, after)
        evidence.update(exited=proc is None or proc.returncode is not None, refused_while_down=refused,
                        new_pid=new.pid)
        emit(FaultVerified(fid, bool(evidence["new_engine_id"]) and refused, evidence))
        self.stopped.discard(name)

    async def _slow_start(self, fid: str, a: SlowStart, emit: Emit) -> None:
        name = a.target
        port = self._serving_port(name)
        before = await self.fleet.state(name)
        emit(FaultApplied(fid, "slow_start", name, {"refuse_s": a.refuse_s}))
        watcher = asyncio.create_task(sees_refused(port, a.refuse_s, self._host(name)))
        resp = await self.fleet.control(name, timeout_s=10.0).slow_start(a.refuse_s)
        refused = await watcher
        # The control call may answer before the listeners open: wait (bounded) for the port.
        open_again = bool(await poll_until(lambda: port_open(port, self._host(name)), a.refuse_s + 5.0))
        after = await self._state(name, emit, resp)
        evidence = _identity_evidence(before, after)
        evidence.update(refused_while_down=refused, serving_port_open=open_again)
        emit(FaultVerified(fid, refused and open_again, evidence))
        self.stopped.discard(name)

    async def _crash(self, fid: str, a: Crash, emit: Emit) -> None:
        name = a.target
        proc = self.fleet.procs.get(name)
        emit(FaultApplied(fid, "crash", name, {"mode": a.mode}, {"pid": {"old": proc and proc.pid}}))
        if a.mode == "control":
            with contextlib.suppress(ControlError, aiohttp.ClientError, TimeoutError):
                await self.fleet.control(name, timeout_s=2.0).crash()
        elif proc is not None:
            proc.signal(signal.SIGKILL)
        code = await proc.wait(5.0) if proc is not None else None
        refused = bool(await poll_until(lambda: port_closed(self._serving_port(name), self._host(name)), 2.0))
        emit(FaultVerified(fid, code is not None and refused, {"returncode": code, "refused": refused}))

    async def _graceful_stop(self, fid: str, a: GracefulStop, emit: Emit) -> None:
        """SIGTERM; verified once the engine refuses new work (health 503) or is gone. The drain goes on
        behind the timeline, as behind an orchestrator's: its end (exit by itself, or SIGKILL after `grace_s`)
        is noted when it comes."""
        name = a.target
        proc = self.fleet.procs.get(name)
        emit(FaultApplied(fid, "graceful_stop", name, {"grace_s": a.grace_s},
                          {"pid": {"old": proc and proc.pid}}))
        if proc is None:
            emit(FaultVerified(fid, False, {"error": "no process"}))
            return
        start = asyncio.get_running_loop().time()
        delivered = proc.signal(signal.SIGTERM)
        # The SIGKILL after `grace_s` counts from the signal, as an orchestrator's does, whatever the
        # verification below takes (a stopped process answers no probe); the end is noted after it.
        verified = asyncio.Event()
        task = asyncio.create_task(self._stop_ended(fid, name, proc, a.grace_s, start, verified, emit))
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)
        health = "unknown"
        try:
            for _ in range(10):  # the signal is handled within a few ms; look for 1 s at most
                health = await self.fleet.serving_probe(name, 0.5)
                if health in ("ok:503", "refused"):
                    break
                await asyncio.sleep(0.1)
            emit(graceful_stop_verified(fid, delivered, health, proc.pid))
        finally:
            verified.set()

    async def _stop_ended(self, fid: str, name: str, proc: ManagedProcess, grace_s: float, start: float,
                          verified: asyncio.Event, emit: Emit) -> None:
        loop = asyncio.get_running_loop()
        code = await proc.wait(max(0.0, start + grace_s - loop.time()))
        killed = code is None
        if killed:
            proc.signal(signal.SIGKILL)
            code = await proc.wait(5.0)
        ended = loop.time()
        # The verification is bounded by its probes (10 x 0.6 s at most); the note never waits longer.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(verified.wait(), VERIFY_WAIT_S)
        emit(WorldNote(f"graceful stop of {name} ended", {
            "fault": fid, "engine": name, "returncode": code, "exited_after_s": round(ended - start, 3),
            "killed_after_grace": killed}))

    def cancel_waiters(self) -> None:
        """End of the cell: stop watching graceful stops (the supervisor ends every process)."""
        for task in list(self._waiters):
            task.cancel()

    async def _die(self, fid: str, a: Die, emit: Emit) -> None:
        name = a.target
        resp = await self.fleet.control(name).die(a.exit_after_s)
        emit(FaultApplied(fid, "die", name, {"exit_after_s": a.exit_after_s}, _changed(resp)))
        health = await http_probe(f"{self.topo.engine(name).http_url}/health", 1.0)
        emit(FaultVerified(fid, health in ("ok:503", "refused"), {"health": health}))

    async def _respawn(self, fid: str, name: str, emit: Emit) -> None:
        proc = self.fleet.procs.get(name)
        # A dying engine (Die) may still be exiting: it holds the ports until it is gone.
        if proc is not None and proc.alive and await proc.wait(RESPAWN_WAIT_S) is None:
            proc.signal(signal.SIGKILL)
            await proc.wait(5.0)
        emit(FaultApplied(fid, "respawn", name, {}))
        new = await self.fleet.start(name, first_start=False)
        after = await self._state(name, emit, {"state": new.ready_info})
        emit(FaultVerified(fid, after is not None and bool(after.get("serving", True)),
                           {"engine_id": (after or {}).get("engine_id"), "pid": new.pid}))
        self.stopped.discard(name)

    async def _start_engine(self, fid: str, name: str, emit: Emit) -> None:
        emit(FaultApplied(fid, "start_engine", name, {}))
        new = await self.fleet.start(name, first_start=True)
        st = await self._state(name, emit, {"state": new.ready_info})
        emit(FaultVerified(fid, st is not None, {"engine_id": (st or {}).get("engine_id")}))

    # -- wedges and protocol faults

    async def _wedge_control(self, fid: str, a: Wedge, emit: Emit) -> None:
        name = a.target
        resp = await self.fleet.control(name).fault("wedge", surface=a.surface)
        emit(FaultApplied(fid, "wedge", name, {"surface": a.surface, "mode": "control"}, _changed(resp)))
        st = await self._state(name, emit, resp)
        listed = "wedge" in ((st or {}).get("faults") or {})
        evidence: dict[str, Any] = {"listed": listed}
        ok = listed
        if a.surface in ("all", "health"):
            probe = await http_probe(f"{self.topo.engine(name).http_url}/health", 0.5)
            evidence["health_probe"] = probe
            ok = ok and probe == "timeout"
        emit(FaultVerified(fid, ok, evidence))

    async def _sigstop(self, fid: str, a: Wedge, emit: Emit) -> None:
        name = a.target
        proc = self.fleet.procs[name]
        sent = proc.signal(signal.SIGSTOP)
        emit(FaultApplied(fid, "wedge", name, {"surface": "all", "mode": "sigstop"}, {"pid": proc.pid}))
        self.stopped.add(name)
        stopped = bool(await poll_until(lambda: self.fleet.is_paused(name), 1.0))
        probe = await self.fleet.serving_probe(name, 0.5)
        emit(FaultVerified(fid, sent and stopped and probe == "timeout",
                           {"state": process_state(proc.pid), "health_probe": probe}))

    async def _engine_fault(self, fid: str, a: EngineFault, emit: Emit) -> None:
        name = a.target
        resp = await self.fleet.control(name).fault(a.kind, **dict(a.params))
        emit(FaultApplied(fid, a.kind, name, dict(a.params), _changed(resp)))
        st = await self._state(name, emit, resp)
        faults = (st or {}).get("faults") or {}
        evidence: dict[str, Any] = {"listed": a.kind in faults, "faults": faults}
        if a.kind == "no_engine_id":
            evidence["engine_id_reported"] = (st or {}).get("engine_id")
        emit(FaultVerified(fid, a.kind in faults, evidence))

    async def _heal(self, a: Heal, emit: Emit) -> tuple[bool, dict[str, Any]]:
        """Clear the target's faults (SIGCONT too); (whether it is clean, what was seen)."""
        name = a.target
        evidence: dict[str, Any] = {}
        if name in self.stopped and a.kind in (None, "wedge"):
            proc = self.fleet.procs[name]
            proc.signal(signal.SIGCONT)
            self.stopped.discard(name)
            evidence["sigcont"] = bool(await poll_until(lambda: not self.fleet.is_paused(name), 1.0))
        await self.fleet.clear_faults(name, a.kind)
        st = await self._state(name, emit)
        remaining = (st or {}).get("faults") or {}
        evidence["remaining"] = remaining
        ok = st is not None and (a.kind not in remaining if a.kind else not remaining)
        return ok, evidence

    # -- router worker API actions

    async def _patch(self, fid: str, a: PatchWorker, emit: Emit) -> None:
        name = a.target
        before = await self._worker(name)
        status, body = await self.router.patch_worker(self.session, self.router_topo, name, a.body)
        if a.refused is not None:
            emit(FaultApplied(fid, "patch_worker", name, dict(a.body), refused_call(status, body, a)))
            after = await self._worker(name)
            emit(FaultVerified(fid, True, {"status": status, "before": before, "after": after}))
            return
        emit(FaultApplied(fid, "patch_worker", name, dict(a.body), {"status": status}))

        def took(w: dict[str, Any] | None) -> bool:
            return w is not None and shows_update(w, a.body)

        after, waited = await self._job_done(status, name, took)
        kept = {
            k: (before or {}).get(k) == (after or {}).get(k)
            for k in ("connector", "role", "bootstrap_port", "kv_engine_id", "url")
        }
        applied = took(after)
        evidence = {"status": status, "kept": kept, "applied": applied, "after": after, "answer": body,
                    **waited}
        emit(FaultVerified(fid, 200 <= status < 300 and applied, evidence))

    async def _add_worker(self, fid: str, a: AddWorker, emit: Emit) -> None:
        if a.refused is not None:
            before, count = await self._worker(a.target), await self._worker_count()
            status, body = await self.router.add_worker(self.session, self.router_topo, a.target, a.mistake)
            answer = refused_call(status, body, a)
            emit(FaultApplied(fid, "add_worker", a.target, dict(a.mistake or {}), answer))
            # A router that took the call as a job (202) would show the worker only later.
            after, waited = await self._job_done(status, a.target, lambda w: w is not None)
            evidence = {"status": status, "before": before, "after": after, "workers_before": count,
                        "workers_after": await self._worker_count(), **waited}
            emit(FaultVerified(fid, True, evidence))
            return
        status, body = await self.router.add_worker(self.session, self.router_topo, a.target)
        emit(FaultApplied(fid, "add_worker", a.target, {}, {"status": status}))
        w, waited = await self._job_done(status, a.target, lambda w: w is not None)
        evidence = {"status": status, "worker": w or body, **waited}
        emit(FaultVerified(fid, 200 <= status < 300 and w is not None, evidence))

    async def _remove_worker(self, fid: str, a: RemoveWorker, emit: Emit) -> None:
        status, body = await self.router.remove_worker(self.session, self.router_topo, a.target)
        emit(FaultApplied(fid, "remove_worker", a.target, {}, {"status": status}))
        w, waited = await self._job_done(status, a.target, _removed)
        done = status != ACCEPTED or _removed(w)
        emit(FaultVerified(fid, 200 <= status < 300 and done, {"status": status, "answer": body, **waited}))

    async def _job_done(
        self, status: int, name: str, took: Callable[[dict[str, Any] | None], bool]
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The engine's worker once the router's update took effect: at once for an answer that says it is
        done; for 202 (a job the router runs later, as smg does) once the worker list shows it, within
        WORKER_JOB_S. Also what was waited, for the evidence."""
        if status != ACCEPTED:
            return await self._worker(name), {}
        start = asyncio.get_running_loop().time()
        seen: list[dict[str, Any] | None] = [None]

        async def check() -> bool:
            seen[0] = await self._worker(name)
            return took(seen[0])

        done = await poll_until(check, WORKER_JOB_S, interval_s=0.05)
        waited = round(asyncio.get_running_loop().time() - start, 3)
        return seen[0], {"job": "done" if done else f"not done within {WORKER_JOB_S:g} s", "job_s": waited}

    async def _worker_count(self) -> int | None:
        """How many workers the router lists (None: the list could not be read)."""
        listed = await self.router.workers(self.session, self.router_topo)
        return None if listed is None else len(listed)

    async def _worker(self, name: str) -> dict[str, Any] | None:
        for w in await self.router.workers(self.session, self.router_topo) or []:
            if self.router_topo.name_of_url(str(w.get("url", ""))) == name:
                return w
        return None

    def resume_all(self) -> list[str]:
        """End of run: resume stopped processes so teardown and final reads work; their names."""
        resumed = []
        for name in sorted(self.stopped):
            proc = self.fleet.procs.get(name)
            if proc is not None:
                proc.signal(signal.SIGCONT)
            resumed.append(name)
        self.stopped.clear()
        return resumed


def _removed(worker: dict[str, Any] | None) -> bool:
    """Gone from the worker list, or draining out of it."""
    return worker is None or worker.get("status") == "draining"


def _changed(resp: Any) -> dict[str, Any]:
    changed = resp.get("changed") if isinstance(resp, dict) else None
    return changed if isinstance(changed, dict) else {}


def _identity_evidence(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    old = (before or {}).get("engine_id")
    new = (after or {}).get("engine_id")
    return {
        "old_engine_id": old,
        "engine_id": new,
        "new_engine_id": bool(new) and new != old,
        "generation": (after or {}).get("generation"),
        "side_channel_port": (after or {}).get("side_channel_port"),
    }


def shows_update(worker: dict[str, Any], update: Mapping[str, Any]) -> bool:
    """Whether a worker as the router lists it carries `update`. A mapping field (labels) counts once it holds
    every pair asked for: routers merge labels with the ones they read from the engine (smg does)."""
    for key, want in update.items():
        have = worker.get(key)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            if any(have.get(k) != v for k, v in want.items()):
                return False
        elif have != want:
            return False
    return True
