"""Fault injection: the engine fleet (processes on fixed loopback ports) and the timeline actions on it.

Every action is recorded (`fault_applied`), checked after it is applied (`fault_verified` with evidence:
process state, connection refused, a new engine id, a surface that no longer answers) and, when it ends,
`fault_healed`. Fault ids are the timeline step names. One-shot faults (restart, slow start) are healed once
the engine serves again; crash and die are healed by a `Respawn`; wedges and protocol faults by a `Heal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fake_engines.control_client import ControlError, EngineControlClient
from harness.history import HistoryRecorder
from harness.procs import ManagedProcess, ProcessSupervisor
from harness.routers import RouterAdapter
from harness.scenario import (
    Action,
    AddWorker,
    Crash,
    Die,
    EngineFault,
    EngineSettings,
    Heal,
    PatchWorker,
    RemoveWorker,
    Respawn,
    Restart,
    SlowStart,
    StartEngine,
    Wedge,
)
from harness.topology import EngineSpec, Topology
from pdchaos.ports import port_is_open

ENGINE_READY_PREFIX = "PDCHAOS_ENGINE_READY"


def _engine_executable() -> list[str]:
    # The harness's own interpreter, not whatever `pdchaos-engine` PATH finds: the child must run this
    # checkout's code in this environment (a venv need not be activated).
    return [sys.executable, "-m", "fake_engines"]


def engine_argv(
    spec: EngineSpec,
    connector: str,
    settings: dict[str, Any],
    records: Path,
    token: str | None,
    seed: int | None,
) -> list[str]:
    """The `pdchaos-engine` command line for one engine (both HTTP and gRPC served; the router uses one)."""
    argv = [
        *_engine_executable(),
        "--name", spec.name, "--role", spec.role, "--connector", connector, "--host", spec.host,
        "--http-port", str(spec.http_port), "--grpc-port", str(spec.grpc_port),
        "--control-port", str(spec.control_port), "--records", str(records),
        "--transfer-timeout-s", f"{settings['transfer_timeout_s']:g}",
        "--kv-abort-timeout-s", f"{settings['kv_abort_timeout_s']:g}",
        "--handshake-timeout-s", f"{settings['handshake_timeout_s']:g}",
        "--load-failure-policy", str(settings["load_failure_policy"]),
    ]
    if connector == "mooncake" and spec.role == "prefill":
        argv += ["--bootstrap-port", str(spec.bootstrap_port)]
    if connector == "nixl":
        argv += ["--nixl-port", str(spec.nixl_port)]
    if settings.get("load_time_s"):
        argv += ["--load-time-s", f"{settings['load_time_s']:g}"]
    if settings.get("ttft_ms"):
        argv += ["--ttft-ms", f"{settings['ttft_ms']:g}"]
    if settings.get("itl_ms"):
        argv += ["--itl-ms", f"{settings['itl_ms']:g}"]
    if settings.get("advertise_side_channel_port"):
        # A proxied side channel (harness.netlinks): decodes are told the proxy's port.
        argv += ["--advertise-side-channel-port", str(settings["advertise_side_channel_port"])]
    if token:
        argv += ["--control-token", token]
    if seed is not None:
        argv += ["--seed", str(seed)]
    return argv


@dataclass
class EngineFleet:
    """The topology's engines as processes; restarts and respawns keep every serving port."""

    topo: Topology
    settings: EngineSettings
    supervisor: ProcessSupervisor
    out_dir: Path
    history: HistoryRecorder
    token: str | None = None
    seed: int | None = None
    ready_timeout_s: float = 20.0
    procs: dict[str, ManagedProcess] = field(default_factory=dict)

    def records_file(self, name: str) -> Path:
        return self.out_dir / "engines" / f"{name}.records.jsonl"

    def argv(self, name: str, first_start: bool = True) -> list[str]:
        per = self.settings.for_engine(name)
        if not first_start:
            # A respawned engine does not replay its initial loading delay unless asked by a SlowStart.
            per = {**per, "load_time_s": 0.0}
        return engine_argv(
            self.topo.engine(name), self.topo.connector, per, self.records_file(name), self.token, self.seed
        )

    def control(self, name: str, timeout_s: float = 5.0) -> EngineControlClient:
        return EngineControlClient(self.topo.engine(name).control_url, self.token, timeout_s)

    async def start(self, name: str, first_start: bool = True) -> ManagedProcess:
        self.records_file(name).parent.mkdir(parents=True, exist_ok=True)
        load = float(self.settings.for_engine(name).get("load_time_s") or 0.0) if first_start else 0.0
        proc = await self.supervisor.spawn(
            name,
            self.argv(name, first_start),
            ready_prefix=ENGINE_READY_PREFIX,
            ready_timeout_s=self.ready_timeout_s + load,
        )
        self.procs[name] = proc
        await self.record_state(name, proc.ready_info)
        return proc

    async def state(self, name: str) -> dict[str, Any] | None:
        try:
            st = await self.control(name, timeout_s=1.0).state()
        except (ControlError, aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return st if isinstance(st, dict) else None

    async def record_state(self, name: str, state: dict[str, Any] | None = None) -> dict[str, Any] | None:
        st = state if state and "engine_id" in state else await self.state(name)
        if st is None:
            return None
        spec = self.topo.engine(name)
        self.history.engine_state(
            name,
            st.get("engine_id"),
            st.get("generation"),
            st.get("side_channel_port"),
            role=spec.role,
            url=spec.url(self.topo.transport),
            pid=st.get("pid"),
            serving=st.get("serving"),
            dead=st.get("dead"),
            faults=st.get("faults"),
        )
        return st


# ---------------------------------------------------------------- verification helpers


async def _http_probe(url: str, timeout_s: float) -> str:
    """'ok:<status>', 'refused', 'timeout' or 'error:<what>' for one GET."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession() as s, s.get(url, timeout=timeout) as r:
            await r.read()
            return f"ok:{r.status}"
    except aiohttp.ClientConnectorError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except aiohttp.ClientError as e:
        return f"error:{type(e).__name__}"


async def _port_open(port: int) -> bool:
    return await asyncio.to_thread(port_is_open, port)


def process_state(pid: int) -> str | None:
    """Linux process state letter (R, S, T for stopped, Z...) or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the state follows the last ')'.
    rest = data.rsplit(")", 1)[-1].split()
    return rest[0] if rest else None


async def _wait_until(pred: Callable[[], Awaitable[bool]], timeout_s: float, step_s: float = 0.05) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if await pred():
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(step_s)


# ---------------------------------------------------------------- the injector


@dataclass
class ActiveFault:
    fault: str
    kind: str
    target: str


class FaultInjector:
    """Applies timeline actions to the fleet and the router, recording and verifying each."""

    def __init__(
        self,
        fleet: EngineFleet,
        history: HistoryRecorder,
        router: RouterAdapter,
        session: aiohttp.ClientSession,
    ) -> None:
        self.fleet = fleet
        self.topo = fleet.topo
        # How the router knows the engines (proxied links give other ports): worker API actions use this.
        self.router_topo: Topology = fleet.topo
        self.history = history
        self.router = router
        self.session = session
        self.active: list[ActiveFault] = []
        self.stopped: set[str] = set()  # engines under SIGSTOP
        self.failures: list[str] = []  # actions that could not be applied or verified
        # Network actions (harness.netlinks) go to the scenario's proxied links when it has any.
        self.network: Any = None

    # -- bookkeeping

    def _applied(
        self, fault: str, kind: str, target: str, params: dict[str, Any], changed: Any = None
    ) -> None:
        self.history.fault_applied(fault, kind, target, params, changed if isinstance(changed, dict) else {})

    def _verified(self, fault: str, ok: bool, evidence: Any) -> None:
        self.history.fault_verified(fault, ok, evidence)
        if not ok:
            self.failures.append(f"{fault}: not verified ({evidence})")

    def _healed(self, fault: str, kind: str, target: str) -> None:
        self.history.fault_healed(fault, kind, target)
        self.active = [a for a in self.active if a.fault != fault]

    def _heal_matching(self, target: str, kinds: set[str] | None) -> list[str]:
        healed = []
        for a in list(self.active):
            if a.target == target and (kinds is None or a.kind in kinds):
                self._healed(a.fault, a.kind, a.target)
                healed.append(a.fault)
        return healed

    def _cleared_by_restart(self, target: str) -> None:
        """A restarted engine starts with no protocol faults (the fakes clear them): record those heals."""
        for a in list(self.active):
            if a.target == target and a.kind not in ("crash", "die"):
                self._healed(a.fault, a.kind, a.target)
        self.stopped.discard(target)

    # -- entry point

    async def apply(self, fault_id: str, action: Action) -> None:
        """Apply one action; an exception inside is recorded as an unverified fault, never raised."""
        try:
            await self._dispatch(fault_id, action)
        except Exception as e:  # one broken action must not end the run: it is evidence
            msg = f"{type(e).__name__}: {e}"
            self.history.note(f"action {fault_id} raised {msg}", fault=fault_id)
            self.history.fault_verified(fault_id, False, {"error": msg})
            self.failures.append(f"{fault_id}: {msg}")

    async def _dispatch(self, fid: str, a: Action) -> None:
        if self.network is not None and self.network.handles(a):
            await self.network.apply(fid, a, self)
        elif isinstance(a, Restart):
            await (self._restart_control(fid, a) if a.mode == "control" else self._restart_process(fid, a))
        elif isinstance(a, SlowStart):
            await self._slow_start(fid, a)
        elif isinstance(a, Crash):
            await self._crash(fid, a)
        elif isinstance(a, Respawn):
            await self._respawn(fid, a.target)
        elif isinstance(a, StartEngine):
            await self._start_engine(fid, a.target)
        elif isinstance(a, Die):
            await self._die(fid, a)
        elif isinstance(a, Wedge):
            await (self._wedge_control(fid, a) if a.mode == "control" else self._sigstop(fid, a))
        elif isinstance(a, EngineFault):
            await self._engine_fault(fid, a)
        elif isinstance(a, Heal):
            await self._heal(fid, a)
        elif isinstance(a, PatchWorker):
            await self._patch(fid, a)
        elif isinstance(a, AddWorker):
            await self._add_worker(fid, a)
        elif isinstance(a, RemoveWorker):
            await self._remove_worker(fid, a)
        else:
            raise TypeError(f"unknown action {a!r}")

    # -- process-level faults

    async def _restart_control(self, fid: str, a: Restart) -> None:
        name = a.target
        spec = self.topo.engine(name)
        before = await self.fleet.state(name)
        self._applied(fid, "restart", name, {"down_s": a.down_s, "mode": "control", "engine_id": a.engine_id},
                      {"engine_id": {"old": (before or {}).get("engine_id")}})
        down_seen: asyncio.Task[bool] | None = None
        if a.down_s >= 0.2:
            port = spec.serving_port(self.topo.transport)
            down_seen = asyncio.create_task(self._sees_refused(port, a.down_s))
        resp = await self.fleet.control(name, timeout_s=10.0).restart(a.down_s, a.engine_id)
        after = await self.fleet.record_state(name, resp.get("state") if isinstance(resp, dict) else None)
        refused = await down_seen if down_seen is not None else None
        evidence = self._identity_evidence(before, after)
        evidence["refused_while_down"] = refused
        evidence["serving_port_open"] = await _port_open(spec.serving_port(self.topo.transport))
        ok = bool(evidence["new_engine_id"]) and evidence["serving_port_open"] and refused is not False
        self._verified(fid, ok, evidence)
        self._healed(fid, "restart", name)
        self._cleared_by_restart(name)

    async def _restart_process(self, fid: str, a: Restart) -> None:
        name = a.target
        spec = self.topo.engine(name)
        before = await self.fleet.state(name)
        proc = self.fleet.procs.get(name)
        self._applied(fid, "restart", name, {"down_s": a.down_s, "mode": "process"},
                      {"engine_id": {"old": (before or {}).get("engine_id")},
                       "pid": {"old": proc and proc.pid}})
        if proc is not None:
            proc.signal(signal.SIGKILL)
            await proc.wait(5.0)
        port = spec.serving_port(self.topo.transport)
        refused = not await _port_open(port)
        if a.down_s > 0:
            await asyncio.sleep(a.down_s)
        await self.fleet.start(name, first_start=False)
        after = await self.fleet.state(name)
        evidence = self._identity_evidence(before, after)
        evidence.update(exited=proc is None or proc.returncode is not None, refused_while_down=refused,
                        new_pid=self.fleet.procs[name].pid)
        self._verified(fid, bool(evidence["new_engine_id"]) and refused, evidence)
        self._healed(fid, "restart", name)
        self._cleared_by_restart(name)

    async def _slow_start(self, fid: str, a: SlowStart) -> None:
        name = a.target
        spec = self.topo.engine(name)
        before = await self.fleet.state(name)
        self._applied(fid, "slow_start", name, {"refuse_s": a.refuse_s})
        watcher = asyncio.create_task(self._sees_refused(spec.serving_port(self.topo.transport), a.refuse_s))
        resp = await self.fleet.control(name, timeout_s=10.0).slow_start(a.refuse_s)
        refused = await watcher
        # The control call may answer before the listeners open: wait (bounded) for the port.
        open_again = await _wait_until(
            lambda: _port_open(spec.serving_port(self.topo.transport)), a.refuse_s + 5.0
        )
        after = await self.fleet.record_state(name, resp.get("state") if isinstance(resp, dict) else None)
        evidence = self._identity_evidence(before, after)
        evidence.update(refused_while_down=refused, serving_port_open=open_again)
        self._verified(fid, refused and open_again, evidence)
        self._healed(fid, "slow_start", name)
        self._cleared_by_restart(name)

    async def _crash(self, fid: str, a: Crash) -> None:
        name = a.target
        proc = self.fleet.procs.get(name)
        self._applied(fid, "crash", name, {"mode": a.mode}, {"pid": {"old": proc and proc.pid}})
        if a.mode == "control":
            with contextlib.suppress(ControlError, aiohttp.ClientError, TimeoutError):
                await self.fleet.control(name, timeout_s=2.0).crash()
        elif proc is not None:
            proc.signal(signal.SIGKILL)
        code = await proc.wait(5.0) if proc is not None else None
        spec = self.topo.engine(name)
        refused = await _wait_until(lambda: _neg(_port_open(spec.serving_port(self.topo.transport))), 2.0)
        self._verified(fid, code is not None and refused, {"returncode": code, "refused": refused})
        self.active.append(ActiveFault(fid, "crash", name))

    async def _die(self, fid: str, a: Die) -> None:
        name = a.target
        spec = self.topo.engine(name)
        resp = await self.fleet.control(name).die(a.exit_after_s)
        self._applied(fid, "die", name, {"exit_after_s": a.exit_after_s},
                      resp.get("changed") if isinstance(resp, dict) else None)
        health = await _http_probe(f"{spec.http_url}/health", 1.0)
        self._verified(fid, health in ("ok:503", "refused"), {"health": health})
        self.active.append(ActiveFault(fid, "die", name))

    async def _respawn(self, fid: str, name: str) -> None:
        proc = self.fleet.procs.get(name)
        # A dying engine (Die) may still be exiting: it holds the ports until it is gone.
        if proc is not None and proc.alive and await proc.wait(10.0) is None:
            proc.signal(signal.SIGKILL)
            await proc.wait(5.0)
        self._applied(fid, "respawn", name, {})
        await self.fleet.start(name, first_start=False)
        after = await self.fleet.state(name)
        self._verified(fid, after is not None and bool(after.get("serving", True)),
                       {"engine_id": (after or {}).get("engine_id"), "pid": self.fleet.procs[name].pid})
        # A fresh process has no faults of any kind: crash/die end here, and so does anything else it had.
        self._heal_matching(name, None)
        self.stopped.discard(name)
        self._healed(fid, "respawn", name)

    async def _start_engine(self, fid: str, name: str) -> None:
        self._applied(fid, "start_engine", name, {})
        await self.fleet.start(name, first_start=True)
        st = await self.fleet.state(name)
        self._verified(fid, st is not None, {"engine_id": (st or {}).get("engine_id")})
        self._healed(fid, "start_engine", name)

    # -- wedges and protocol faults

    async def _wedge_control(self, fid: str, a: Wedge) -> None:
        name = a.target
        spec = self.topo.engine(name)
        resp = await self.fleet.control(name).fault("wedge", surface=a.surface)
        self._applied(fid, "wedge", name, {"surface": a.surface, "mode": "control"},
                      resp.get("changed") if isinstance(resp, dict) else None)
        st = await self.fleet.record_state(name, resp.get("state") if isinstance(resp, dict) else None)
        listed = "wedge" in ((st or {}).get("faults") or {})
        evidence: dict[str, Any] = {"listed": listed}
        ok = listed
        if a.surface in ("all", "health"):
            probe = await _http_probe(f"{spec.http_url}/health", 0.5)
            evidence["health_probe"] = probe
            ok = ok and probe == "timeout"
        self._verified(fid, ok, evidence)
        self.active.append(ActiveFault(fid, "wedge", name))

    async def _sigstop(self, fid: str, a: Wedge) -> None:
        name = a.target
        spec = self.topo.engine(name)
        proc = self.fleet.procs[name]
        sent = proc.signal(signal.SIGSTOP)
        self._applied(fid, "wedge", name, {"surface": "all", "mode": "sigstop"}, {"pid": proc.pid})
        self.stopped.add(name)
        stopped = await _wait_until(lambda: _async(process_state(proc.pid) == "T"), 1.0)
        probe = await _http_probe(f"{spec.http_url}/health", 0.5)
        self._verified(fid, sent and stopped and probe == "timeout",
                       {"state": process_state(proc.pid), "health_probe": probe})
        self.active.append(ActiveFault(fid, "wedge", name))

    async def _engine_fault(self, fid: str, a: EngineFault) -> None:
        name = a.target
        resp = await self.fleet.control(name).fault(a.kind, **dict(a.params))
        changed = resp.get("changed") if isinstance(resp, dict) else None
        self._applied(fid, a.kind, name, dict(a.params), changed)
        st = await self.fleet.record_state(name, resp.get("state") if isinstance(resp, dict) else None)
        faults = (st or {}).get("faults") or {}
        evidence: dict[str, Any] = {"listed": a.kind in faults, "faults": faults}
        if a.kind == "no_engine_id":
            evidence["engine_id_reported"] = (st or {}).get("engine_id")
        self._verified(fid, a.kind in faults, evidence)
        self.active.append(ActiveFault(fid, a.kind, name))

    async def _heal(self, fid: str, a: Heal) -> None:
        name = a.target
        evidence: dict[str, Any] = {}
        if name in self.stopped and a.kind in (None, "wedge"):
            proc = self.fleet.procs[name]
            proc.signal(signal.SIGCONT)
            self.stopped.discard(name)
            evidence["sigcont"] = await _wait_until(lambda: _async(process_state(proc.pid) != "T"), 1.0)
        client = self.fleet.control(name)
        if a.kind is None:
            with contextlib.suppress(ControlError, aiohttp.ClientError, TimeoutError):
                await client.clear()
        else:
            with contextlib.suppress(ControlError):
                await client.clear_fault(a.kind)
        st = await self.fleet.record_state(name)
        remaining = (st or {}).get("faults") or {}
        healed = self._heal_matching(name, None if a.kind is None else {a.kind})
        evidence.update(healed=healed, remaining=remaining)
        ok = st is not None and (a.kind not in remaining if a.kind else not remaining)
        self.history.note(f"heal {name} {a.kind or 'all'}: {healed}", fault=fid, evidence=evidence)
        if not ok:
            self.failures.append(f"{fid}: heal not verified ({evidence})")

    # -- router worker API actions (one-shot: applied, verified, healed at once)

    async def _patch(self, fid: str, a: PatchWorker) -> None:
        name = a.target
        before = await self._worker(name)
        status, body = await self.router.patch_worker(self.session, self.router_topo, name, a.body)
        self._applied(fid, "patch_worker", name, dict(a.body), {"status": status})
        after = await self._worker(name)
        kept = {
            k: (before or {}).get(k) == (after or {}).get(k)
            for k in ("connector", "role", "bootstrap_port", "kv_engine_id", "url")
        }
        applied = all((after or {}).get(k) == v for k, v in a.body.items())
        self._verified(fid, 200 <= status < 300 and applied,
                       {"status": status, "kept": kept, "applied": applied, "after": after, "answer": body})
        self._healed(fid, "patch_worker", name)

    async def _add_worker(self, fid: str, a: AddWorker) -> None:
        status, body = await self.router.add_worker(self.session, self.router_topo, a.target)
        self._applied(fid, "add_worker", a.target, {}, {"status": status})
        w = await self._worker(a.target)
        self._verified(fid, 200 <= status < 300 and w is not None, {"status": status, "worker": w or body})
        self._healed(fid, "add_worker", a.target)

    async def _remove_worker(self, fid: str, a: RemoveWorker) -> None:
        status, body = await self.router.remove_worker(self.session, self.router_topo, a.target)
        self._applied(fid, "remove_worker", a.target, {}, {"status": status})
        self._verified(fid, 200 <= status < 300, {"status": status, "answer": body})
        self._healed(fid, "remove_worker", a.target)

    async def _worker(self, name: str) -> dict[str, Any] | None:
        for w in await self.router.workers(self.session, self.router_topo) or []:
            if self.router_topo.name_of_url(str(w.get("url", ""))) == name:
                return w
        return None

    # -- shared checks

    @staticmethod
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

    @staticmethod
    async def _sees_refused(port: int, window_s: float) -> bool:
        """True if a connection to `port` is refused at some point within `window_s` (the engine was down)."""
        end = time.monotonic() + max(window_s, 0.2)
        while time.monotonic() < end:
            if not await _port_open(port):
                return True
            await asyncio.sleep(0.03)
        return False

    async def heal_all(self) -> None:
        """End of run: resume stopped processes so teardown and final reads work (recorded as heals)."""
        for name in list(self.stopped):
            proc = self.fleet.procs.get(name)
            if proc is not None:
                proc.signal(signal.SIGCONT)
            self.stopped.discard(name)
            self._heal_matching(name, {"wedge"})


async def _async(value: bool) -> bool:
    return value


async def _neg(aw: Awaitable[bool]) -> bool:
    return not await aw
