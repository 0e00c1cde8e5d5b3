"""The simulated world: a cell in simpy's virtual time, the same session driving it as in real time.

Engines are the fake engines' core (`engine.SimEngine`), the router the reference router's core
(`router.SimRouter`, with its `--inject-bug` switches), links the toxic stages of the embedded Toxiproxy
(`network.SimNetwork`). Every command of the session is a simpy process; the events it reports wake the
session's driver, which hands them over in order. Nothing here reads a clock or an unseeded random source:
engine ids, transfer ids and request ids come from a generator seeded by the run's seed, the wall clock is
a fixed epoch plus virtual time, so the same scenario, cell and seed give the same history, byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, assert_never

import simpy
import yarl

from harness.router_metrics import snapshot
from harness.scenario.actions import (
    AddWorker,
    Crash,
    Die,
    EngineAction,
    EngineFault,
    GracefulStop,
    Heal,
    PatchWorker,
    PauseRouter,
    RemoveWorker,
    Respawn,
    Restart,
    SlowStart,
    StartEngine,
    Wedge,
    WorkerApiAction,
)
from harness.scenario.links import (
    HealLink,
    LinkBandwidth,
    LinkFault,
    LinkFlap,
    LinkLatency,
    LinkRef,
    LinkReset,
    NetworkAction,
    Partition,
    fault_kind,
    fault_params,
    toxics_for,
)
from harness.session import CellPlan, ScenarioSession
from harness.session import commands as c
from harness.session import events as e
from harness.topology import Topology
from harness.worlds.base import RESPAWN_WAIT_S, Emit, World, graceful_stop_verified, refused_call
from harness.worlds.sim.engine import SimEngine
from harness.worlds.sim.network import HOP_S, CallResult, Deadline, SimNetwork
from harness.worlds.sim.router import SimRouter

# Virtual wall clock at t = 0 (2026-01-01T00:00:00Z): records stamped with it replay exactly.
WALL_EPOCH = 1_767_225_600.0
# Mooncake side channels bind a random port per start; here they come from this range, in order.
SIDE_PORT_BASE = 40_000
ROUTER_START_S = 0.05
CANCELLED = "cancelled"
# A cancelled run (Ctrl-C) gets this long, in wall time, to tear down in virtual time.
CANCEL_WAIT_S = 30.0
# Events at one simulated instant after which the model is taken to have stopped moving its clock (a busy
# 64p64d instant has thousands).
STALL_STEPS = 2_000_000
# Wall seconds a simulated cell may take. The heaviest measured (64p64d at 1000 requests/s for ten simulated
# minutes) takes under 5 minutes; a model whose clock creeps on by ever smaller steps is stalled too, and
# the stall count at one instant does not see it.
WALL_LIMIT_S = 3600.0
# Steps between two looks at the wall clock (a look costs a system call; a step, microseconds).
_WALL_LOOK_STEPS = 1 << 16
# A random 128-bit number as a version-4 UUID: the variant and version fields cleared, then set (RFC 4122).
_V4_KEEP = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 128) - 1)
_V4_BITS = (0x8000 << 48) | (4 << 76)


class SimStalled(RuntimeError):
    """The simulation stopped advancing its clock, or ran past its wall-clock limit: a bug in a model,
    reported as the run's error."""


def run_until(env: simpy.Environment, until: simpy.Event, stall_steps: int = STALL_STEPS,
              wall_limit_s: float = WALL_LIMIT_S, wall_clock: Callable[[], float] = time.monotonic) -> None:
    """`env.run(until=...)`, except that more than `stall_steps` events at one instant, or more than
    `wall_limit_s` of wall time, raise SimStalled."""
    step = env.step  # the hottest loop of a simulation: bound once
    last, same = env.now, 0
    give_up = wall_clock() + wall_limit_s
    look = _WALL_LOOK_STEPS
    while not until.triggered:
        try:
            step()
        except simpy.core.EmptySchedule:
            return
        look -= 1
        if not look:
            look = _WALL_LOOK_STEPS
            if wall_clock() > give_up:
                raise SimStalled(f"the simulation ran past its wall-clock limit of {wall_limit_s:g} s at "
                                 f"t={env.now:.6f} simulated s")
        now = env.now
        if now != last:
            last, same = now, 0
            continue
        same += 1
        if same > stall_steps:
            raise SimStalled(f"the simulation stopped moving its clock at t={now:.6f} s "
                             f"({stall_steps} events at that instant)")
PROBE_WINDOW_S = 0.3


@functools.lru_cache(maxsize=4096)
def _parse_url(url: str) -> tuple[yarl.URL, int | None] | None:
    """A URL as aiohttp's yarl reads it, with its port (None: it refuses the URL); parsed once, as every leg
    of every request looks its engine up by URL and a cell has a handful of them."""
    try:
        parsed = yarl.URL(url)
        return parsed, parsed.port
    except ValueError:
        return None


class SimCell:
    """One cell's simulated systems, shared by the engines, the router and the world's commands."""

    def __init__(self, env: simpy.Environment, plan: CellPlan) -> None:
        self.env = env
        self.plan = plan
        self.topology: Topology = plan.topology
        self.seed = plan.seed
        self.net = SimNetwork(env, plan.links, plan.seed)
        self._rng = random.Random(f"pdchaos-sim:{plan.seed}:{plan.scenario.name}:{plan.topology.name}")
        # Records made and not yet handed to the session (it gets them as they come: a long run keeps none).
        self.pending_records: list[dict[str, Any]] = []
        self._next_side_port = SIDE_PORT_BASE
        self.engines: dict[str, SimEngine] = {}
        self._by_port: dict[int, str] = {}
        self._by_side_port: dict[int, str] = {}  # every side port handed out, to whom (a restart moves it)
        for n, spec in enumerate(self.topology.engines):
            settings = plan.scenario.engines.for_engine(spec.name)
            self.engines[spec.name] = SimEngine(self, spec, settings, self.new_uuid, first_pid=1000 + 100 * n)
            for port in (spec.http_port, spec.grpc_port, spec.bootstrap_port, spec.nixl_port):
                self._by_port[port] = spec.name
        self.router: SimRouter | None = None

    def wall(self, now: float) -> float:
        return WALL_EPOCH + now

    def new_uuid(self) -> uuid.UUID:
        # The bits `UUID(..., version=4)` would set, set here: its own path costs a third more per id.
        return uuid.UUID(int=(self._rng.getrandbits(128) & _V4_KEEP) | _V4_BITS)

    def new_side_port(self, engine: str) -> int:
        port = self._next_side_port
        self._next_side_port += 1
        self._by_side_port[port] = engine
        return port

    def add_engine_record(self, record: dict[str, Any]) -> None:
        self.pending_records.append(record)

    def engine_at_url(self, url: str) -> SimEngine | None:
        """The engine a caller reaches at `url`, parsed as the real engines' HTTP client parses it (yarl,
        under aiohttp): a URL it refuses (a bracketed IPv4 host) or one naming another host reaches none."""
        read = _parse_url(url)
        if read is None:
            return None
        parsed, port = read
        engine = None if port is None else self.engine_at_port(port)
        return engine if engine is not None and parsed.host == engine.spec.host else None

    def engine_at_port(self, port: int) -> SimEngine | None:
        name = self._by_port.get(port)
        if name is not None:
            return self.engines[name]
        name = self._by_side_port.get(port)
        if name is not None and self.engines[name].side_port == port:
            return self.engines[name]
        return None


class SimWorld(World):
    kind = "sim"

    def __init__(self, plan: CellPlan, out_dir: Path | None = None) -> None:
        self.plan = plan
        self.out = out_dir
        self.env = simpy.Environment()
        self.cell = SimCell(self.env, plan)
        self._clients: dict[simpy.Process, None] = {}  # ordered: replays must not depend on addresses
        self._cancelled = False

    def clock(self) -> float:
        return float(self.env.now)

    def wall(self) -> float:
        return self.cell.wall(self.env.now)

    async def run(self, session: ScenarioSession) -> None:
        """Run the session on a worker thread, so the event loop stays free for progress and signals; a
        cancelled run tears down in virtual time before the cancellation goes on."""
        done = asyncio.get_running_loop().run_in_executor(None, self.run_session, session)
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            self._cancelled = True
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(done, CANCEL_WAIT_S)
            raise

    def run_session(self, session: ScenarioSession) -> None:
        """Drive the session to its end in virtual time (synchronously: nothing here waits on the OS). A model
        that stops moving the clock (events at one instant, forever) is an error, never a hang."""
        run_until(self.env, self.env.process(self._drive(session)))

    # ------------------------------------------------------------------ the driver

    def _drive(self, session: ScenarioSession) -> Generator[Any, Any, None]:
        env = self.env
        inbox: deque[e.Event] = deque()
        wake = [env.event()]
        # The session is woken by an event it is told of or by its next wakeup time. A timer cannot be
        # withdrawn from simpy's queue, so one is set only when the wakeup moves earlier than every timer
        # already set; a timer that finds its time no longer wanted does nothing.
        alarms: list[float] = []  # times of the timers set and not yet fired (a heap)

        def rouse() -> None:
            if not wake[0].triggered:
                wake[0].succeed()

        def emit(event: e.Event) -> None:
            inbox.append(event)
            rouse()

        wanted: list[float | None] = [None]  # when the waiting driver wants to be woken at the latest

        def set_alarm(at: float) -> None:
            if not alarms or alarms[0] > at:
                heapq.heappush(alarms, at)
                env.timeout(at - env.now).callbacks.append(fired)

        def fired(_: simpy.Event) -> None:
            heapq.heappop(alarms)
            at = wanted[0]
            if at is None:
                return
            if at <= env.now:
                rouse()
            else:
                set_alarm(at)

        def dispatch(cmds: list[c.Command]) -> None:
            for cmd in cmds:
                env.process(self._run_command(cmd, emit))

        dispatch(session.start(env.now, self.cell.wall(env.now)))
        interrupted = False
        cell = self.cell
        while not session.done:
            if cell.pending_records:
                seen, cell.pending_records = tuple(cell.pending_records), []
                dispatch(session.handle(e.HandoffsSeen(seen), env.now))
            if self._cancelled and not interrupted:
                interrupted = True
                dispatch(session.interrupt(env.now))
            if inbox:
                dispatch(session.handle(inbox.popleft(), env.now))
                continue
            nxt = session.next_wakeup(env.now)
            at = env.now + 1.0 if nxt is None else max(env.now, nxt)
            wanted[0] = at
            if wake[0].triggered:
                wake[0] = env.event()
            set_alarm(at)
            yield wake[0]
            wanted[0] = None
            if not inbox:
                dispatch(session.poll(env.now))

    def _run_command(self, cmd: c.Command, emit: Emit) -> Generator[Any, Any, None]:
        try:
            yield from self._execute(cmd, emit)
        except simpy.Interrupt:
            return
        except Exception as exc:  # a bug in the model is evidence, never a hang
            emit(e.CommandFailed(cmd, f"{type(exc).__name__}: {exc}"))

    def _execute(self, cmd: c.Command, emit: Emit) -> Generator[Any, Any, None]:
        """One command, as a simpy process's steps."""
        match cmd:
            case c.LaunchEngine():
                return self._launch_engine(cmd, emit)
            case c.LaunchRouter():
                return self._launch_router(cmd, emit)
            case c.PollWorkers():
                return self._poll_workers(emit)
            case c.PollRouterEvents():
                return self._poll_router_events(cmd, emit)
            case c.CheckRoutable():
                return self._check_routable(emit)
            case c.SendRequest():
                return self._send_request(cmd, emit)
            case c.CancelRequests():
                return self._cancel_requests()
            case c.ApplyAction():
                return self._apply_action(cmd, emit)
            case c.SetLinkEnabled():
                return self._set_link_enabled(cmd, emit)
            case c.Teardown():
                return self._teardown(emit)
            case c.CollectHandoffs():
                return self._collect_handoffs(emit)
            case _:
                assert_never(cmd)

    # ------------------------------------------------------------------ set-up and observation

    def _launch_engine(self, cmd: c.LaunchEngine, emit: Emit) -> Generator[Any, Any, None]:
        engine = self.cell.engines[cmd.name]
        load = self.plan.scenario.engines.load_time(cmd.name) if cmd.first_start else 0.0
        yield from engine.start(refuse_s=load)
        emit(e.EngineUp(cmd.name, engine.control_state()))

    def _launch_router(self, cmd: c.LaunchRouter, emit: Emit) -> Generator[Any, Any, None]:
        router = SimRouter(self.cell, cmd.settings, cmd.registered, self.cell.new_uuid)
        self.cell.router = router
        emit(
            e.WorldNote(
                "router launch",
                {"router": "reference (simulated)", "inject_bugs": list(cmd.settings.inject_bugs)},
            )
        )
        yield self.env.timeout(ROUTER_START_S)
        router.start()
        emit(e.RouterUp(has_events=True))

    def _router(self) -> SimRouter:
        assert self.cell.router is not None, "the router is not launched"
        return self.cell.router

    def _poll_workers(self, emit: Emit) -> Generator[Any, Any, None]:
        yield self.env.timeout(2 * HOP_S)
        workers = self._router().workers()
        engines = {}
        for w in workers:
            engine = self.cell.engine_at_url(str(w["url"]))
            if engine is not None:
                engines[str(w["url"])] = engine.name
        emit(e.WorkersSeen(tuple(workers), engines))

    def _poll_router_events(self, cmd: c.PollRouterEvents, emit: Emit) -> Generator[Any, Any, None]:
        yield self.env.timeout(2 * HOP_S)
        router = self._router()
        metrics = None
        if cmd.final:
            wall = self.cell.wall(self.env.now)
            metrics = snapshot((wall, wall), router.counters.counters())
        events = router.events
        emit(e.RouterEventsSeen(tuple(events[cmd.since :]), len(events), metrics))

    def _check_routable(self, emit: Emit) -> Generator[Any, Any, None]:
        emit(e.RoutableSeen(True))
        yield self.env.timeout(0)

    def _send_request(self, cmd: c.SendRequest, emit: Emit) -> Generator[Any, Any, None]:
        proc = self.env.active_process
        if proc is not None:
            self._clients[proc] = None
        plan = cmd.plan
        start = self.env.now
        try:
            answer = yield from self._router().handle(plan, start + plan.deadline_s)
            emit(
                e.RequestDone(
                    plan.seq,
                    status=answer.status,
                    ok=answer.ok,
                    text=answer.text,
                    error=answer.error,
                    latency_s=answer.latency_s,
                    ttft_s=answer.ttft_s,
                    body_problem=answer.body_problem,
                )
            )
        except simpy.Interrupt as why:
            if why.cause != CANCELLED:
                # A stop meant for a handler the request had just left: its connection was reset.
                emit(
                    e.RequestDone(
                        plan.seq,
                        status=0,
                        ok=False,
                        latency_s=self.env.now - start,
                        error=f"connection reset ({why.cause})",
                    )
                )
        except Deadline:
            emit(
                e.RequestDone(
                    plan.seq,
                    status=0,
                    ok=False,
                    latency_s=self.env.now - start,
                    timed_out=True,
                    error=f"no complete answer within the {plan.deadline_s:g} s deadline",
                )
            )
        finally:
            if proc is not None:
                self._clients.pop(proc, None)

    def _cancel_requests(self) -> Generator[Any, Any, None]:
        for proc in list(self._clients):
            if proc.is_alive:
                proc.interrupt(CANCELLED)
        yield self.env.timeout(0)

    def _teardown(self, emit: Emit) -> Generator[Any, Any, None]:
        resumed = sorted(n for n, eng in self.cell.engines.items() if eng.frozen)
        for name in resumed:
            self.cell.engines[name].thaw()
        if self.cell.router is not None:
            self.cell.router.stop()
        for engine in self.cell.engines.values():
            engine.kill()
        yield self.env.timeout(0)
        emit(e.TornDown(tuple(resumed)))

    def _collect_handoffs(self, emit: Emit) -> Generator[Any, Any, None]:
        yield self.env.timeout(0)
        records, self.cell.pending_records = tuple(self.cell.pending_records), []
        emit(e.HandoffsCollected(records))

    def _set_link_enabled(self, cmd: c.SetLinkEnabled, emit: Emit) -> Generator[Any, Any, None]:
        ref = LinkRef(cmd.engine, cmd.link)
        if self.cell.net.link(ref) is not None:
            self.cell.net.set_enabled(ref, cmd.enabled)
        yield self.env.timeout(0)
        emit(e.LinkToggled(cmd.fault, cmd.engine, cmd.link, cmd.enabled))

    # ------------------------------------------------------------------ actions

    def _apply_action(self, cmd: c.ApplyAction, emit: Emit) -> Generator[Any, Any, None]:
        actions = SimActions(self, emit)
        action = cmd.action
        try:
            if isinstance(action, NetworkAction):
                yield from actions.network(cmd.fault, action)
            elif isinstance(action, PauseRouter):
                yield from actions.pause_router(cmd.fault, action)
            else:
                yield from actions.apply(cmd.fault, action)
        except (KeyError, ValueError) as exc:
            emit(e.ActionDone(cmd.fault, error=f"{type(exc).__name__}: {exc}"))


class SimActions:
    """Timeline actions on the simulated cell, each verified against the model (the world's evidence): one
    method per action, as the real world's `EngineActions` and `NetworkLinks` have."""

    def __init__(self, world: SimWorld, emit: Emit) -> None:
        self.world = world
        self.env = world.env
        self.cell = world.cell
        self.emit = emit

    def _state(self, engine: SimEngine) -> dict[str, Any]:
        st = engine.control_state()
        self.emit(e.EngineReport(engine.name, st))
        return st

    def _health(self, engine: SimEngine) -> Generator[Any, Any, str]:
        """What a direct `GET /health` sees within the probe window: ok:<status>, refused or timeout."""
        res: CallResult = yield from self.cell.net.call(None, engine, engine.health, 64, PROBE_WINDOW_S)
        if res.ok:
            return "ok:200" if res.value else "ok:503"
        return "timeout" if res.error == "timeout" else "refused"

    def apply(self, fid: str, a: EngineAction | WorkerApiAction) -> Generator[Any, Any, None]:
        """Carry out one engine or worker API action; `ActionDone` last. A KeyError or ValueError is the
        caller's to report."""
        eng = self.cell.engines[a.target]
        evidence: dict[str, Any] = {}
        verified = True
        match a:
            case Restart(mode="control"):
                yield from self._restart_control(fid, eng, a)
            case Restart():
                yield from self._restart_process(fid, eng, a)
            case SlowStart():
                yield from self._slow_start(fid, eng, a)
            case Crash():
                yield from self._crash(fid, eng, a)
            case GracefulStop():
                yield from self._graceful_stop(fid, eng, a)
            case Die():
                yield from self._die(fid, eng, a)
            case Respawn():
                yield from self._respawn(fid, eng)
            case StartEngine():
                yield from self._start_engine(fid, eng)
            case Wedge(mode="sigstop"):
                yield from self._sigstop(fid, eng)
            case Wedge():
                yield from self._wedge_control(fid, eng, a)
            case EngineFault():
                self._engine_fault(fid, eng, a)
            case Heal():
                verified, evidence = yield from self._heal(eng, a)
            case PatchWorker():
                yield from self._patch_worker(fid, a)
            case AddWorker():
                yield from self._add_worker(fid, a)
            case RemoveWorker():
                yield from self._remove_worker(fid, a)
            case _:
                assert_never(a)
        self.emit(e.ActionDone(fid, verified=verified, evidence=evidence))

    # -- process-level faults

    def _restart_control(self, fid: str, eng: SimEngine, a: Restart) -> Generator[Any, Any, None]:
        params = {"down_s": a.down_s, "mode": "control", "engine_id": a.engine_id}
        yield from self._restarted(fid, eng, "restart", params, a.down_s,
                                   lambda: eng.restart(a.down_s, a.engine_id))

    def _restart_process(self, fid: str, eng: SimEngine, a: Restart) -> Generator[Any, Any, None]:
        def again() -> Generator[Any, Any, None]:
            eng.kill()
            yield self.env.timeout(a.down_s)
            yield from eng.respawn()

        params = {"down_s": a.down_s, "mode": "process"}
        yield from self._restarted(fid, eng, "restart", params, a.down_s, again, new_process=True)

    def _slow_start(self, fid: str, eng: SimEngine, a: SlowStart) -> Generator[Any, Any, None]:
        params = {"refuse_s": a.refuse_s}
        yield from self._restarted(fid, eng, "slow_start", params, a.refuse_s,
                                   lambda: eng.restart(a.refuse_s, None))

    def _restarted(self, fid: str, eng: SimEngine, kind: str, params: dict[str, Any], down_s: float,
                   again: Callable[[], Generator[Any, Any, None]],
                   new_process: bool = False) -> Generator[Any, Any, None]:
        """A restart of any kind: `again` takes the engine down and brings it back (a new engine id); what
        the real world's probes see of it comes from the model."""
        before = eng.control_state()
        changed = {"engine_id": {"old": before["engine_id"]}}
        if new_process:
            changed["pid"] = {"old": eng.pid}
        self.emit(e.FaultApplied(fid, kind, eng.name, params, changed))
        yield from again()
        after = self._state(eng)
        ev = _identity_evidence(before, after)
        # The real world watches for refused connects only when the outage outlasts its probe.
        refused = True if down_s >= 0.2 or new_process else None
        ev.update(refused_while_down=refused, serving_port_open=eng.listening)
        self.emit(e.FaultVerified(fid, bool(ev["new_engine_id"]) and eng.listening, ev))

    def _crash(self, fid: str, eng: SimEngine, a: Crash) -> Generator[Any, Any, None]:
        self.emit(e.FaultApplied(fid, "crash", eng.name, {"mode": a.mode}, {"pid": {"old": eng.pid}}))
        eng.kill()
        yield self.env.timeout(HOP_S)
        self.emit(
            e.FaultVerified(fid, True, {"returncode": -9 if a.mode == "signal" else 137, "refused": True})
        )

    def _graceful_stop(self, fid: str, eng: SimEngine, a: GracefulStop) -> Generator[Any, Any, None]:
        pid = {"pid": {"old": eng.pid}}
        alive = eng.exists  # the SIGTERM reaches a process only if there is one
        self.emit(e.FaultApplied(fid, "graceful_stop", eng.name, {"grace_s": a.grace_s}, pid))
        sigterm = self.env.now
        # The drain goes on behind the timeline, as in real time, from the signal on (the SIGKILL after
        # `grace_s` counts from it, not from the health probe below); its end is noted when it comes,
        # after the verification.
        verified_event = self.env.event()
        self.env.process(self._stop_ended(fid, eng, a.grace_s, sigterm, verified_event))
        health = yield from self._health(eng)
        self.emit(graceful_stop_verified(fid, alive, health, eng.pid))
        verified_event.succeed()

    def _stop_ended(self, fid: str, eng: SimEngine, grace_s: float, sigterm: float,
                    verified: simpy.Event) -> Generator[Any, Any, None]:
        pid = eng.pid
        killed = yield from eng.graceful_stop(grace_s, since=sigterm)
        if killed is None and eng.exists and eng.pid == pid:
            return  # the drain was called off and the process lives on: nothing ended
        ended = self.env.now
        code = eng.exit_code(pid)  # None: the process went another way first, said as it ended
        if not verified.triggered:
            yield verified
        self.emit(e.WorldNote(f"graceful stop of {eng.name} ended", {
            "fault": fid, "engine": eng.name, "returncode": -9 if code is None else code,
            "exited_after_s": round(ended - sigterm, 3), "killed_after_grace": bool(killed)}))

    def _die(self, fid: str, eng: SimEngine, a: Die) -> Generator[Any, Any, None]:
        changed = eng.die(a.exit_after_s)
        self.emit(e.FaultApplied(fid, "die", eng.name, {"exit_after_s": a.exit_after_s}, changed))
        health = yield from self._health(eng)
        self.emit(e.FaultVerified(fid, health in ("ok:503", "refused"), {"health": health}))

    def _respawn(self, fid: str, eng: SimEngine) -> Generator[Any, Any, None]:
        # As the real world: a process still there (dying, draining) may end by itself first; it holds
        # its ports until it is gone.
        if eng.exists and not (yield from eng.wait_gone(RESPAWN_WAIT_S)):
            eng.kill()
        self.emit(e.FaultApplied(fid, "respawn", eng.name, {}))
        yield from eng.respawn()
        after = self._state(eng)
        self.emit(e.FaultVerified(fid, eng.listening, {"engine_id": after["engine_id"], "pid": eng.pid}))

    def _start_engine(self, fid: str, eng: SimEngine) -> Generator[Any, Any, None]:
        self.emit(e.FaultApplied(fid, "start_engine", eng.name, {}))
        yield from eng.start(refuse_s=self.cell.plan.scenario.engines.load_time(eng.name))
        after = self._state(eng)
        self.emit(e.FaultVerified(fid, eng.listening, {"engine_id": after["engine_id"]}))

    # -- wedges and protocol faults

    def _sigstop(self, fid: str, eng: SimEngine) -> Generator[Any, Any, None]:
        eng.freeze()
        self.emit(
            e.FaultApplied(fid, "wedge", eng.name, {"surface": "all", "mode": "sigstop"}, {"pid": eng.pid})
        )
        probe = yield from self._health(eng)
        self.emit(e.FaultVerified(fid, probe == "timeout", {"state": "T", "health_probe": probe}))

    def _wedge_control(self, fid: str, eng: SimEngine, a: Wedge) -> Generator[Any, Any, None]:
        shown = {"surface": a.surface, "mode": "control"}
        st = self._fault_set(fid, eng, "wedge", {"surface": a.surface}, shown)
        listed = "wedge" in (st.get("faults") or {})
        ev: dict[str, Any] = {"listed": listed}
        ok = listed
        if a.surface in ("all", "health"):
            probe = yield from self._health(eng)
            ev["health_probe"] = probe
            ok = ok and probe == "timeout"
        self.emit(e.FaultVerified(fid, ok, ev))

    def _engine_fault(self, fid: str, eng: SimEngine, a: EngineFault) -> None:
        params = dict(a.params)
        st = self._fault_set(fid, eng, a.kind, params, params)
        listed = a.kind in (st.get("faults") or {})
        ev: dict[str, Any] = {"listed": listed, "faults": st.get("faults")}
        if a.kind == "no_engine_id":
            ev["engine_id_reported"] = st.get("engine_id")
        self.emit(e.FaultVerified(fid, listed, ev))

    def _fault_set(self, fid: str, eng: SimEngine, kind: str, params: dict[str, Any],
                   shown: dict[str, Any]) -> dict[str, Any]:
        """Set one fault through the engine's fault state, say it applied; the engine's state after."""
        changed = eng.set_fault({"fault": kind, **params})
        self.emit(e.FaultApplied(fid, kind, eng.name, shown, changed))
        return self._state(eng)

    def _heal(self, eng: SimEngine, a: Heal) -> Generator[Any, Any, tuple[bool, dict[str, Any]]]:
        """Clear the target's faults (a SIGSTOP too); (whether it is clean, what was seen)."""
        evidence: dict[str, Any] = {}
        if eng.frozen and a.kind in (None, "wedge"):
            eng.thaw()
            evidence["sigcont"] = True
        eng.clear_faults(a.kind)
        st = self._state(eng)
        remaining = st.get("faults") or {}
        evidence["remaining"] = remaining
        yield self.env.timeout(0)
        return (a.kind not in remaining if a.kind else not remaining), evidence

    # -- the router's process

    def pause_router(self, fid: str, a: PauseRouter) -> Generator[Any, Any, None]:
        """SIGSTOP the router for `pause_s`, then SIGCONT: the model stops it (`SimRouter.pause`)."""
        router = self.world._router()
        self.emit(e.FaultApplied(fid, "pause_router", a.target, {"pause_s": a.pause_s}, {}))
        router.pause(a.pause_s)
        self.emit(e.FaultVerified(fid, True, {"state": "T", "signal": "SIGSTOP"}))
        yield self.env.timeout(a.pause_s)
        self.emit(e.ActionDone(fid, verified=True, evidence={"resumed": True, "signal": "SIGCONT"}))

    # -- router worker API actions

    def _patch_worker(self, fid: str, a: PatchWorker) -> Generator[Any, Any, None]:
        router = self.world._router()
        yield self.env.timeout(2 * HOP_S)
        before = self._worker_for(router, a.target)
        status, body = router.patch_worker(a.target, dict(a.body))
        if a.refused is not None:
            now = self._worker_for(router, a.target)
            answer = refused_call(status, body, a)
            self.emit(e.FaultApplied(fid, "patch_worker", a.target, dict(a.body), answer))
            self.emit(e.FaultVerified(fid, True, {"status": status, "before": before, "after": now}))
            return
        self.emit(e.FaultApplied(fid, "patch_worker", a.target, dict(a.body), {"status": status}))
        after = body if 200 <= status < 300 else None
        kept = {
            k: (before or {}).get(k) == (after or {}).get(k)
            for k in ("connector", "role", "bootstrap_port", "kv_engine_id", "url")
        }
        applied = all((after or {}).get(k) == v for k, v in a.body.items())
        self.emit(
            e.FaultVerified(
                fid,
                200 <= status < 300 and applied,
                {"status": status, "kept": kept, "applied": applied, "after": after},
            )
        )

    def _add_worker(self, fid: str, a: AddWorker) -> Generator[Any, Any, None]:
        router = self.world._router()
        yield self.env.timeout(2 * HOP_S)
        if a.refused is not None:
            before, count = self._worker_for(router, a.target), len(router.workers())
            status, body = router.add_worker(a.target, a.mistake)
            self.emit(e.FaultApplied(fid, "add_worker", a.target, dict(a.mistake or {}),
                                     refused_call(status, body, a)))
            evidence = {"status": status, "before": before, "after": self._worker_for(router, a.target),
                        "workers_before": count, "workers_after": len(router.workers())}
            self.emit(e.FaultVerified(fid, True, evidence))
            return
        status, body = router.add_worker(a.target)
        self.emit(e.FaultApplied(fid, "add_worker", a.target, {}, {"status": status}))
        self.emit(e.FaultVerified(fid, 200 <= status < 300, {"status": status, "worker": body}))

    def _remove_worker(self, fid: str, a: RemoveWorker) -> Generator[Any, Any, None]:
        router = self.world._router()
        yield self.env.timeout(2 * HOP_S)
        status, body = router.remove_worker(a.target)
        self.emit(e.FaultApplied(fid, "remove_worker", a.target, {}, {"status": status}))
        self.emit(e.FaultVerified(fid, 200 <= status < 300, {"status": status, "answer": body}))

    def _worker_for(self, router: SimRouter, engine: str) -> dict[str, Any] | None:
        """The router's worker for `engine` as its worker list shows it (None: it has none)."""
        return next((w for w in router.workers() if self._engine_of(w) == engine), None)

    def _engine_of(self, worker: dict[str, Any]) -> str | None:
        engine = self.cell.engine_at_url(str(worker["url"]))
        return None if engine is None else engine.name

    # -- network actions

    def network(self, fid: str, a: NetworkAction) -> Generator[Any, Any, None]:
        """Put one network fault in place (or heal), verify it, `ActionDone` last."""
        match a:
            case HealLink():
                yield from self._heal_link(fid, a)
            case Partition() | LinkLatency() | LinkReset() | LinkBandwidth() | LinkFlap():
                yield from self._link_fault(fid, a)
            case _:
                assert_never(a)

    def _heal_link(self, fid: str, a: HealLink) -> Generator[Any, Any, None]:
        net = self.cell.net
        refs = [r for r in net.links if r.engine == a.target and (a.link is None or r.link == a.link)]
        if not refs:
            raise ValueError(f"heal {a.target}.{a.link or '*'}: no faulted link")
        evidence = {}
        for ref in refs:
            net.clean(ref)
            state = net.links[ref]
            evidence[ref.label] = {"toxics": [t.name for t in state.toxics], "enabled": state.enabled}
        yield self.env.timeout(0)
        self.emit(e.ActionDone(fid, verified=True, evidence=evidence))

    def _link_fault(self, fid: str, a: LinkFault) -> Generator[Any, Any, None]:
        net = self.cell.net
        ref = LinkRef(a.target, a.link)
        state = net.link(ref)
        if state is None:
            raise ValueError(f"link {ref.label} has no fault point (this cell's connector has no such link)")
        toxics = toxics_for(a, fid)
        params: dict[str, Any] = {**fault_params(a), "proxy": f"sim:{ref.label}"}
        if not toxics:
            net.set_enabled(ref, False)
        else:
            params["toxics"] = [t.body() for t in toxics]
            net.add_toxics(ref, toxics)
        self.emit(
            e.FaultApplied(fid, fault_kind(a), ref.engine, {**params, "link": ref.link}, {}, link=ref.link)
        )
        listed = sorted(t.name for t in state.toxics)
        ok = all(t.name in listed for t in toxics)
        if not toxics:
            ok = not state.enabled
            probe = "refused"
        elif isinstance(a, Partition):
            probe = "silent"
        else:
            probe = "answered"
        if isinstance(a, LinkFlap):
            probe = "refused"
        yield self.env.timeout(0)
        self.emit(
            e.FaultVerified(
                fid,
                ok,
                {
                    "proxy": params["proxy"],
                    "enabled": state.enabled,
                    "toxics": listed,
                    "probe": probe,
                    "ok": ok,
                },
            )
        )
        self.emit(e.ActionDone(fid))


def _identity_evidence(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    old, new = before.get("engine_id"), after.get("engine_id")
    return {
        "old_engine_id": old,
        "engine_id": new,
        "new_engine_id": bool(new) and new != old,
        "generation": after.get("generation"),
        "side_channel_port": after.get("side_channel_port"),
    }
