"""The scenario session: the whole run logic of one cell, as a sans-IO object.

It never sleeps, never touches a socket and never reads a clock: it is told the time and what happened, and
answers with commands for its world (h11's connection object and Jepsen's pure generator are the models).

    cmds = session.start(now)                  # start engines...
    cmds = session.handle(event, now)          # an engine is up, a request ended, a fault was verified...
    cmds = session.poll(now)                   # time passed: requests due, steps due, deadlines
    session.next_wakeup(now)                   # when `poll` must be called at the latest
    session.done, session.result()

The phases of a run: set-up (engines, then the router told about them), readiness (every registered worker
Ready, within the scenario's `ready_timeout_s`; timeline zero is that moment), the run (load from a seeded
schedule, timeline steps in order, one action at a time, flapping links), a final read of the router's
events, teardown, handoff collection, then the verdicts. Every phase has a deadline, so a run always ends.
Every history record of the run is written here (through `history`), stamped with the session's time.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, assert_never

from harness.checkers import run_checks
from harness.history_writer import HistoryRecorder, ManualClock
from harness.result import time_unit
from harness.scenario import Action, LinkFlap, Observed, Scenario, Step, Timeline, links_in
from harness.scenario.links import LinkRef, flap_schedule
from harness.scenario.presets import ACTION_TIMES
from harness.session import commands as c
from harness.session import events as e
from harness.session.arrivals import open_loop_arrivals
from harness.session.ledger import FaultLedger
from harness.session.requests import RequestPlan, expected_text, plan_request
from harness.session.workers import WorkerWatch
from harness.topology import Topology
from harness.verdict import Verdict

# A step whose condition never holds is given up this long after the planned end of the run.
TIMELINE_GRACE_S = 10.0
# Router events are read this much less often than its workers (Scenario.observe_interval_s).
EVENTS_POLL_RATIO = 5 / 3
ROUTABLE_RETRY_S = 0.1
# Backstops for answers a world owes (each command has its own deadline inside the world; these only make
# sure a broken world cannot hold the run).
ENGINES_UP_S = 60.0
ROUTER_UP_S = 60.0
ACTION_S = 120.0
FINAL_EVENTS_S = 3.0
TEARDOWN_S = 60.0
COLLECT_S = 30.0
# Requests still running this long after the load's last deadline are given up.
LOAD_SLACK_S = 5.0
# Waiting only on answers: look again this often all the same.
IDLE_WAKE_S = 1.0


def _action_budget(action: Action, engine_start_s: float = ENGINES_UP_S) -> float:
    """How long an action may take before the session gives up on the world's answer: its own outage time
    (a restart's down time, a slow start's refusal...) plus a margin for the world's checks, and never less
    than an engine start on these engines (a restart of a real engine waits for it to serve again)."""
    own = sum(float(getattr(action, name, 0.0) or 0.0) for name in ACTION_TIMES)
    return max(ACTION_S, engine_start_s + ENGINES_UP_S) + own


class Phase(Enum):
    NEW = "new"
    ENGINES = "engines"
    ROUTER = "router"
    READY = "ready"
    RUN = "run"
    FINAL_EVENTS = "final_events"
    TEARDOWN = "teardown"
    COLLECT = "collect"
    DONE = "done"


@dataclass(frozen=True)
class CellPlan:
    """What a world needs to set a cell up: the topology, the links the timeline puts faults on, which engines
    start now and which the router is told about."""

    scenario: Scenario
    topology: Topology
    links: tuple[LinkRef, ...]
    start_now: tuple[str, ...]
    registered: tuple[str, ...]
    seed: int
    run_id: str


@dataclass
class SessionResult:
    verdicts: list[Verdict]
    reason: str
    notes: list[str] = field(default_factory=list)


def scenario_settings(s: Scenario, topo: Topology | None = None) -> dict[str, Any]:
    """What the run was told, for `run_started.settings` (checkers look numbers up by name)."""
    r, en, w = s.router, s.engines, s.workload
    out: dict[str, Any] = {
        "transfer_timeout_s": en.transfer_timeout_s,
        "health_interval_s": r.health_interval_s,
        "health_timeout_s": r.health_timeout_s,
        "failure_threshold": r.failure_threshold,
        "success_threshold": r.success_threshold,
        "request_timeout_s": r.request_timeout_s,
        "inject_bugs": [*r.inject_bugs, *en.inject_bugs],
        "bugs": list(s.bugs),
        "router": dataclasses.asdict(r),
        "engines": {k: v for k, v in dataclasses.asdict(en).items() if k != "per_engine"},
        "per_engine": {k: dict(v) for k, v in en.per_engine.items()},
        "workload": dataclasses.asdict(w),
        "timeline": [
            {"name": st.name, "action": type(st.action).__name__, "target": st.action.target}
            for st in s.timeline
        ],
        "expect": [{"checker": x.checker, "params": dict(x.params)} for x in s.expect],
        "preset": s.preset,
        # How often the harness reads the router's worker list: how late a change may show in it.
        "observe_interval_s": s.observe_interval_s,
    }
    if s.unregistered_engines:
        # The router starts without these: they join through its worker API, if ever.
        out["unregistered_engines"] = list(s.unregistered_engines)
    if topo is not None:
        out["engines_layout"] = {
            sp.name: {"role": sp.role, "url": sp.url(topo.transport), "control": sp.control_url}
            for sp in topo.engines
        }
        out["router_url"] = topo.router_url
    return out


@dataclass
class _Flap:
    fault: str
    ref: LinkRef
    toggles: list[tuple[float, bool]]  # absolute session times, pending
    in_flight: bool = False


class ScenarioSession:
    """One scenario in one cell. `history_path=None` keeps the history in memory only."""

    def __init__(
        self,
        scenario: Scenario,
        topology: Topology,
        *,
        router: str,
        seed: int = 0,
        run_id: str = "run",
        history_path: str | Path | None = None,
        bring_up_only: bool = False,
        world: str = "real",
        engines: str = "fake",
        engine_start_s: float = ENGINES_UP_S,
        text_known: bool = True,
        replay: str = "",
    ) -> None:
        self.scenario = scenario
        # The command that runs this cell again, kept in the history (a report rebuilt from it names it).
        self.replay = replay
        # Which engines serve (harness.worlds.real.backends); only the fakes' output text is known in advance.
        self.engines = engines
        self.text_known = text_known
        self.engine_start_s = engine_start_s
        self.topology = topology
        self.router_name = router
        self.seed = seed
        self.run_id = run_id
        self.bring_up_only = bring_up_only
        self.world = world
        self._history_path = history_path
        deferred = set(scenario.deferred_engines)
        start_now = tuple(n for n in topology.names() if n not in deferred)
        registered = tuple(n for n in topology.names() if n not in set(scenario.unregistered_engines))
        self.plan = CellPlan(scenario, topology, tuple(links_in(scenario.timeline, topology.connector)),
                             start_now, registered, seed, run_id)
        self.clock = ManualClock()
        self.history: HistoryRecorder | None = None
        self.phase = Phase.NEW
        self.reason = "done"
        self.extra_verdicts: list[Verdict] = []
        self.notes: list[str] = []
        self.ledger: FaultLedger | None = None
        self.workers: WorkerWatch | None = None
        # set-up
        self._waiting: set[str] = set()  # engines the router must not be launched before
        self._loading: set[str] = set()  # engines that may still be loading when the router starts
        self._phase_deadline: float | None = None
        self._has_events = False
        # observation
        self._workers_poll_s = scenario.observe_interval_s
        self._events_poll_s = scenario.observe_interval_s * EVENTS_POLL_RATIO
        self._workers_poll_at: float | None = None
        self._workers_in_flight = False
        self._events_poll_at: float | None = None
        self._events_in_flight = False
        self._events_cursor = 0
        self._final_read_done = False
        self._routable_at: float | None = None
        self._routable_in_flight = False
        # the run
        self.t0: float | None = None
        self.observed = Observed()
        self.timeline = Timeline(tuple(scenario.timeline))
        self._planned_end = 0.0
        self._applied: list[str] = []
        self._queued_steps: list[Step] = []
        self._action: tuple[str, Action, float] | None = None  # (fault, action, started)
        self._flaps: dict[str, _Flap] = {}
        self._rng = random.Random(seed)
        self._seq = 0
        self._arrivals: list[float] = []  # absolute times, open loop (a heap)
        self._client_next: list[float] = []  # absolute times, closed loop (a heap)
        self._clients_running = 0
        self._plans: dict[int, tuple[RequestPlan, int | None]] = {}  # seq -> (plan, closed-loop client)
        self.invoked = 0
        self.completed = 0
        self.ok = 0
        self._load_end = 0.0
        self._handoffs_seen = 0
        self._calls_seen = 0

    # ------------------------------------------------------------------ the interface

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def start(self, now: float, wall_now: float | None = None) -> list[c.Command]:
        """Begin the run at `now` (`wall_now`: the wall-clock time at `now`, for records stamped with it)."""
        if self.phase is not Phase.NEW:
            raise RuntimeError("session already started")
        self.clock.set(now)
        wall = now if wall_now is None else wall_now
        # A real run's history is flushed line by line (a killed run keeps it); a simulated one is written
        # buffered (nothing reads it while it runs, and a crash replays from the seed). Both keep their
        # records for the checkers: reading millions back costs more than holding them.
        sim = self.world == "sim"
        self.history = HistoryRecorder(self._history_path, self.clock, start=now, wall_clock=lambda: wall,
                                       flush_each=not sim)
        self.ledger = FaultLedger(self.history)
        self.workers = WorkerWatch(self.history)
        s, topo = self.scenario, self.topology
        self.history.run_started(
            s.name, topo.name, topo.connector, topo.transport, self.router_name, self.seed,
            self._settings_record(), run_id=self.run_id, bugs=list(s.bugs), world=self.world,
            time_unit=time_unit(self.world), description=s.description, replay=self.replay,
        )
        self.phase = Phase.ENGINES
        self._phase_deadline = now + self.engine_start_s + max(
            (s.engines.load_time(n) for n in self.plan.start_now), default=0.0)
        self._waiting = {n for n in self.plan.start_now if s.engines.load_time(n) <= 0}
        self._loading = {n for n in self.plan.start_now if s.engines.load_time(n) > 0}
        # Engines that load start in the background: the router meets them while they load.
        cmds: list[c.Command] = [c.LaunchEngine(n) for n in self.plan.start_now]
        if not self._waiting:
            cmds += self._launch_router(now)
        return cmds

    def handle(self, event: e.Event, now: float) -> list[c.Command]:
        self._tick(now)
        if self.phase in (Phase.NEW, Phase.DONE):
            return []
        return self._on(event, now) + self._advance(now)

    def poll(self, now: float) -> list[c.Command]:
        self._tick(now)
        if self.phase in (Phase.NEW, Phase.DONE):
            return []
        return self._advance(now)

    def next_wakeup(self, now: float) -> float | None:
        """The latest time at which `poll` must be called (None once done)."""
        if self.phase in (Phase.NEW, Phase.DONE):
            return None
        times = [self._phase_deadline]
        if self.phase in (Phase.READY, Phase.RUN):
            if not self._workers_in_flight:
                times.append(self._workers_poll_at)
            if not self._events_in_flight:
                times.append(self._events_poll_at)
            if not self._routable_in_flight:
                times.append(self._routable_at)
        if self.phase is Phase.RUN and self.t0 is not None:
            if self._arrivals:
                times.append(self._arrivals[0])
            if self._client_next:
                times.append(self._client_next[0])
            if self._action is None and not self._queued_steps:
                due = self.timeline.next_due(now - self.t0, self.observed)
                if due is not None:
                    times.append(self.t0 + due)
                elif not self.timeline.done:
                    times.append(self.t0 + self._give_up_at())
            for flap in self._flaps.values():
                if flap.toggles and not flap.in_flight:
                    times.append(flap.toggles[0][0])
            times.append(self.t0 + self._planned_end)
            times.append(self._load_end + self.scenario.workload.deadline_s + LOAD_SLACK_S)
        if self._action is not None:
            times.append(self._action[2] + _action_budget(self._action[1], self.engine_start_s))
        # Anything due by now was handled by the last call: only later times wake the session.
        later = [t for t in times if t is not None and t > now]
        return min(later) if later else now + IDLE_WAKE_S

    def interrupt(self, now: float, reason: str = "interrupted") -> list[c.Command]:
        """The run is cut short (Ctrl-C, SIGTERM): tear down at once."""
        self._tick(now)
        self.reason = reason
        if self.phase in (Phase.NEW, Phase.DONE):
            return []
        return self._teardown(now)

    def abandon(self, reason: str) -> None:
        """The world stopped answering for good (it broke, or the run was cancelled past its teardown): end
        the history as it stands."""
        if self.phase not in (Phase.NEW, Phase.DONE):
            self.reason = reason
            self._h.run_ended(reason)
            self._h.close()
        self.phase = Phase.DONE

    def result(self) -> SessionResult:
        """The verdicts: the scenario's checkers on the history, plus the run's own (timeline, faults...)."""
        if self.history is None:
            return SessionResult([Verdict.unknown_("run_complete", "the run never started")], self.reason)
        verdicts = run_checks(self.history.history(), self.scenario.expect) + self.extra_verdicts
        return SessionResult(verdicts, self.reason, list(self.notes))

    # ------------------------------------------------------------------ events

    def _tick(self, now: float) -> None:
        if now > self.clock():
            self.clock.set(now)

    @property
    def _h(self) -> HistoryRecorder:
        assert self.history is not None
        return self.history

    def _on(self, ev: e.Event, now: float) -> list[c.Command]:
        h = self._h
        if isinstance(ev, e.EngineUp):
            self._engine_state(ev.name, ev.state)
            self._waiting.discard(ev.name)
            was_loading = ev.name in self._loading
            self._loading.discard(ev.name)
            if self.phase is Phase.ENGINES and not self._waiting:
                return self._launch_router(now)
            if self.phase is Phase.READY and was_loading and not self._loading:
                # The ready wait starts once every engine serves.
                self._phase_deadline = now + self.scenario.ready_timeout_s
            return []
        if isinstance(ev, e.EngineFailed):
            if self.phase in (Phase.ENGINES, Phase.ROUTER, Phase.READY):
                return self._fail(now, f"error: {ev.error}")
            h.note(f"engine {ev.name} failed to start: {ev.error}")
            return []
        if isinstance(ev, e.RouterUp):
            return self._router_up(now, ev)
        if isinstance(ev, e.RouterFailed):
            return self._fail(now, f"error: {ev.error}")
        if isinstance(ev, e.WorkersSeen):
            assert self.workers is not None
            self._workers_in_flight = False
            self.workers.seen(ev.workers, ev.engines, ev.problem)
            self.observed.worker_status = self.workers.status
            self._workers_poll_at = now + self._workers_poll_s
            if self.workers.supported is False and self.phase is Phase.READY and self._routable_at is None:
                self._routable_at = now
            return []
        if isinstance(ev, e.RouterEventsSeen):
            self._events_in_flight = False
            if ev.events is None:
                self._has_events = False
                self._events_poll_at = None
            else:
                if ev.metrics is not None:
                    h.router_metrics(ev.metrics)
                for rev in ev.events:
                    h.router_event(rev)
                self._events_cursor = max(self._events_cursor, ev.next)
                self._events_poll_at = now + self._events_poll_s
            if self.phase is Phase.FINAL_EVENTS:
                return self._final_events(now)
            return []
        if isinstance(ev, e.RoutableSeen):
            self._routable_in_flight = False
            if ev.ok and self.phase is Phase.READY and not self._loading:
                return self._timeline_zero(now)
            self._routable_at = now + ROUTABLE_RETRY_S
            return []
        if isinstance(ev, e.RequestDone):
            return self._request_done(now, ev)
        if isinstance(ev, e.FaultApplied):
            assert self.ledger is not None
            self.ledger.applied(ev.fault, ev.kind, ev.target, ev.params, ev.changed, ev.link)
            return []
        if isinstance(ev, e.FaultVerified):
            assert self.ledger is not None
            self.ledger.verified(ev.fault, ev.ok, ev.evidence, ev.engine_finding)
            return []
        if isinstance(ev, e.EngineReport):
            self._engine_state(ev.name, ev.state)
            return []
        if isinstance(ev, e.WorldNote):
            h.note(ev.message, **dict(ev.fields))
            return []
        if isinstance(ev, e.RouterExited):
            how = f"signal {-ev.returncode}" if ev.returncode is not None and ev.returncode < 0 else \
                f"code {ev.returncode}"
            what = (f"the router exited ({how}) during the run" + (f" (its log: {ev.log})" if ev.log else "")
                    + (f": {ev.why}" if ev.why else ""))
            if ev.by_harness:
                what += ": the fork server it was started from died (the harness's loss)"
            h.note(what, returncode=ev.returncode)
            self.extra_verdicts.append(Verdict.unknown_("router", what) if ev.by_harness
                                       else Verdict.fail("router", what))
            return []
        if isinstance(ev, e.ActionDone):
            return self._action_done(now, ev)
        if isinstance(ev, e.LinkToggled):
            return self._link_toggled(now, ev)
        if isinstance(ev, e.TornDown):
            if self.phase is Phase.TEARDOWN:
                assert self.ledger is not None
                self.ledger.end_of_run(ev.resumed)
                self.phase = Phase.COLLECT
                self._phase_deadline = now + COLLECT_S
                return [c.CollectHandoffs()]
            return []
        if isinstance(ev, e.HandoffsSeen):
            self._take_engine_records(ev.records)
            return []
        if isinstance(ev, e.HandoffsCollected):
            if self.phase is Phase.COLLECT:
                self._collected(ev)
            return []
        if isinstance(ev, e.CommandFailed):
            return self._command_failed(now, ev)
        raise TypeError(f"unknown event {ev!r}")

    def _engine_state(self, name: str, state: Mapping[str, Any] | None) -> None:
        if not state:
            return
        spec = self.topology.engine(name)
        self._h.engine_state(
            name, state.get("engine_id"), state.get("generation"), state.get("side_channel_port"),
            role=spec.role, url=spec.url(self.topology.transport), pid=state.get("pid"),
            serving=state.get("serving"), dead=state.get("dead"), faults=state.get("faults"),
        )

    def _command_failed(self, now: float, ev: e.CommandFailed) -> list[c.Command]:
        """The answer the failed command owes, said for it (a command that owes none: nothing)."""
        cmd = ev.command
        self._h.note(f"world error on {type(cmd).__name__}: {ev.error}")
        match cmd:
            case c.PollWorkers():
                return self._on(e.WorkersSeen(None), now)
            case c.PollRouterEvents():
                self._events_in_flight = False
                self._events_poll_at = now + self._events_poll_s
                return self._final_events(now) if self.phase is Phase.FINAL_EVENTS else []
            case c.CheckRoutable():
                return self._on(e.RoutableSeen(False), now)
            case c.SendRequest():
                return self._on(e.RequestDone(cmd.plan.seq, error=f"harness error: {ev.error}"), now)
            case c.ApplyAction():
                return self._on(e.ActionDone(cmd.fault, error=ev.error), now)
            case c.SetLinkEnabled():
                return self._on(e.LinkToggled(cmd.fault, cmd.engine, cmd.link, cmd.enabled), now)
            case c.Teardown():
                return self._on(e.TornDown(), now)
            case c.CollectHandoffs():
                return self._on(e.HandoffsCollected(error=ev.error), now)
            case c.LaunchEngine():
                return self._on(e.EngineFailed(cmd.name, ev.error), now)
            case c.LaunchRouter():
                return self._on(e.RouterFailed(ev.error), now)
            case c.CancelRequests():
                return []
            case _:
                assert_never(cmd)

    # ------------------------------------------------------------------ set-up and readiness

    def _settings_record(self) -> dict[str, Any]:
        rec = scenario_settings(self.scenario, self.topology)
        if self.engines != "fake":  # the fakes' runs keep their histories as they were
            rec["engines"] = self.engines
        return rec

    def _launch_router(self, now: float) -> list[c.Command]:
        self.phase = Phase.ROUTER
        self._phase_deadline = now + ROUTER_UP_S
        return [c.LaunchRouter(self.plan.registered, self.scenario.router)]

    def _router_up(self, now: float, ev: e.RouterUp) -> list[c.Command]:
        if self.phase is not Phase.ROUTER:
            return []
        self.phase = Phase.READY
        self._has_events = ev.has_events
        # The ready wait starts once every engine serves (loading ones included).
        loading = max((self.scenario.engines.load_time(n) for n in self._loading), default=0.0)
        wait = self.engine_start_s + loading if self._loading else self.scenario.ready_timeout_s
        self._phase_deadline = now + wait
        self._workers_in_flight = True
        cmds: list[c.Command] = [c.PollWorkers()]
        if ev.has_events:
            self._events_in_flight = True
            cmds.append(c.PollRouterEvents(self._events_cursor))
        return cmds

    def _expected_ready(self) -> list[str]:
        return [n for n in self.plan.registered if n in self.plan.start_now]

    def _ready_check(self, now: float) -> list[c.Command]:
        assert self.workers is not None and self._phase_deadline is not None
        if self._loading:
            if now >= self._phase_deadline:
                return self._fail(now, f"error: TimeoutError: engines {sorted(self._loading)} never served")
            return []
        if self.workers.supported and self.workers.all_ready(self._expected_ready()):
            return self._timeline_zero(now)
        if now >= self._phase_deadline:
            names = self._expected_ready()
            seen = {n: self.workers.status.get(n, "absent") for n in names}
            msg = f"workers not all Ready within {self.scenario.ready_timeout_s:g} s: {seen}"
            # Every engine was up: judging the router is fair.
            self.extra_verdicts.append(Verdict.fail("workers_ready", msg))
            return self._fail(now, f"error: WorkersNotReady: {msg}")
        return []

    def _timeline_zero(self, now: float) -> list[c.Command]:
        if self.bring_up_only:
            self.phase = Phase.DONE
            self.reason = "ready"
            return []
        self.phase = Phase.RUN
        self.t0 = now
        self._phase_deadline = None
        self._h.note("timeline zero: all workers ready", timeline_zero=self._h.now())
        w = self.scenario.workload
        self._planned_end = max(w.duration_s, self.scenario.min_duration_s, self.timeline.last_fixed_time())
        self._load_end = now + w.duration_s
        if w.mode == "closed":
            self._clients_running = w.concurrency
            self._client_next = [now] * w.concurrency
        else:
            self._arrivals = [now + t for t in open_loop_arrivals(w, self.seed)]
        return []

    def _give_up_at(self) -> float:
        return self._planned_end + TIMELINE_GRACE_S

    # ------------------------------------------------------------------ the run

    def _advance(self, now: float) -> list[c.Command]:
        cmds: list[c.Command] = []
        if self.phase in (Phase.READY, Phase.RUN):
            cmds += self._observe(now)
        if self.phase is Phase.READY:
            cmds += self._ready_check(now)
        if self.phase is Phase.RUN:
            cmds += self._load(now)
            cmds += self._steps(now)
            cmds += self._toggles(now)
            cmds += self._run_end(now)
        elif self.phase in (Phase.ENGINES, Phase.ROUTER):
            if self._phase_deadline is not None and now >= self._phase_deadline:
                what = "engines did not serve" if self.phase is Phase.ENGINES else "router did not serve"
                cmds += self._fail(now, f"error: TimeoutError: {what} within the harness's deadline")
        elif self.phase in (Phase.FINAL_EVENTS, Phase.TEARDOWN, Phase.COLLECT):
            cmds += self._closing_deadline(now)
        return cmds

    def _observe(self, now: float) -> list[c.Command]:
        cmds: list[c.Command] = []
        if not self._workers_in_flight and self._workers_poll_at is not None and now >= self._workers_poll_at:
            self._workers_in_flight = True
            cmds.append(c.PollWorkers())
        if (self._has_events and not self._events_in_flight and self._events_poll_at is not None
                and now >= self._events_poll_at):
            self._events_in_flight = True
            cmds.append(c.PollRouterEvents(self._events_cursor))
        if (self.phase is Phase.READY and not self._routable_in_flight and self._routable_at is not None
                and now >= self._routable_at):
            self._routable_in_flight = True
            self._routable_at = None
            cmds.append(c.CheckRoutable())
        return cmds

    def _send(self, client: int | None) -> c.Command:
        self._seq += 1
        plan = plan_request(self._seq, self.run_id, self._rng, self.scenario.workload)
        self._plans[plan.seq] = (plan, client)
        self.invoked += 1
        extra = {} if plan.mistake is None else {"mistake": plan.mistake}
        self._h.request_invoked(plan.seq, plan.tag, stream=plan.stream, endpoint=plan.endpoint,
                                deadline_s=plan.deadline_s, prompt_chars=len(plan.prompt), **extra)
        return c.SendRequest(plan)

    def _load(self, now: float) -> list[c.Command]:
        cmds: list[c.Command] = []
        while self._arrivals and self._arrivals[0] <= now:
            heapq.heappop(self._arrivals)
            cmds.append(self._send(None))
        while self._client_next and self._client_next[0] <= now:
            heapq.heappop(self._client_next)
            if now < self._load_end:
                cmds.append(self._send(0))
            else:
                self._clients_running -= 1
        return cmds

    @property
    def load_finished(self) -> bool:
        return not self._arrivals and not self._client_next and self._clients_running <= 0 and not self._plans

    def _request_done(self, now: float, ev: e.RequestDone) -> list[c.Command]:
        entry = self._plans.pop(ev.seq, None)
        if entry is None:
            return []
        plan, client = entry
        text_ok: bool | None = None
        if ev.ok and ev.text is not None and self.text_known:
            text_ok = ev.text == expected_text(plan)
        self.completed += 1
        self.ok += int(ev.ok)
        self.observed.requests_completed = self.completed
        self._h.request_completed(
            plan.seq, plan.tag, status=ev.status, ok=ev.ok, latency_s=round(ev.latency_s, 6),
            ttft_s=None if ev.ttft_s is None else round(ev.ttft_s, 6), error=ev.error, text_ok=text_ok,
            timed_out=ev.timed_out, **({"body_problem": ev.body_problem} if ev.body_problem else {}),
        )
        if client is not None:
            think = self.scenario.workload.think_time_s
            if self.phase is Phase.RUN and now + think < self._load_end:
                heapq.heappush(self._client_next, now + max(0.0, think))
            else:
                self._clients_running -= 1
        return []

    def _steps(self, now: float) -> list[c.Command]:
        assert self.t0 is not None
        if self._action is not None:
            budget = _action_budget(self._action[1], self.engine_start_s)
            if now >= self._action[2] + budget:
                late = e.ActionDone(self._action[0], error=f"TimeoutError: no answer within {budget:g} s")
                return self._on(late, now)
            return []
        tl = now - self.t0
        if not self._queued_steps and not self.timeline.done:
            fire, miss = self.timeline.due(tl, self.observed)
            for step in miss:
                self._h.note(f"step {step.name} missed: its condition did not hold by t={step.deadline_s}",
                             step=step.name)
            self._queued_steps.extend(fire)
            if not self.timeline.done and not fire and tl > self._give_up_at():
                rest = self.timeline.give_up()
                self._h.note(f"steps never due, given up at t={tl:.1f}: {rest}")
        if self._queued_steps:
            step = self._queued_steps.pop(0)
            self.observed.applied_at[step.name] = tl
            self._applied.append(step.name)
            self._action = (step.name, step.action, now)
            return [c.ApplyAction(step.name, step.action)]
        return []

    def _action_done(self, now: float, ev: e.ActionDone) -> list[c.Command]:
        if self._action is None or self._action[0] != ev.fault:
            return []
        fault, action, _ = self._action
        self._action = None
        assert self.ledger is not None
        if ev.error is not None:
            self.ledger.raised(fault, ev.error)
            return []
        self.ledger.action_done(fault, action, ev.verified, ev.evidence)
        self._load_after_heal(now)
        if isinstance(action, LinkFlap) and self.ledger.is_active(fault):
            offsets = flap_schedule(action.down_s, action.up_s, action.cycles)[1:]
            self._flaps[fault] = _Flap(fault, LinkRef(action.target, action.link),
                                       [(now + off, enabled) for off, enabled in offsets])
        return []

    def _load_after_heal(self, now: float) -> None:
        """`Workload.after_heal_s`: with no fault active any more, keep the load going that long from now."""
        tail = self.scenario.workload.after_heal_s
        if tail is None or self.t0 is None or self.ledger is None or self.ledger.active:
            return
        self._load_end = max(self._load_end, now + tail)
        self._planned_end = max(self._planned_end, now - self.t0 + tail)
        # Clients that saw the load end before the heal came start again.
        for _ in range(self.scenario.workload.concurrency - self._clients_running):
            heapq.heappush(self._client_next, now)
            self._clients_running += 1

    def _toggles(self, now: float) -> list[c.Command]:
        cmds: list[c.Command] = []
        assert self.ledger is not None
        for flap in list(self._flaps.values()):
            if not self.ledger.is_active(flap.fault):  # healed early (HealLink)
                del self._flaps[flap.fault]
                continue
            if flap.toggles and not flap.in_flight and flap.toggles[0][0] <= now:
                flap.in_flight = True
                cmds.append(c.SetLinkEnabled(flap.fault, flap.ref.engine, flap.ref.link, flap.toggles[0][1]))
        return cmds

    def _link_toggled(self, now: float, ev: e.LinkToggled) -> list[c.Command]:
        flap = self._flaps.get(ev.fault)
        assert self.ledger is not None
        if flap is None or not self.ledger.is_active(ev.fault):
            if not ev.enabled and not any(a.target == ev.engine and a.link == ev.link
                                          for a in self.ledger.active):
                # The link was healed while this "down" was on its way: the heal ends the flap, so the link
                # must end up, not cut for the rest of the run by the flap's last word.
                self._h.note(f"flap {ev.engine}.{ev.link} down after its heal: up again", fault=ev.fault)
                return [c.SetLinkEnabled(ev.fault, ev.engine, ev.link, True)]
            return []
        flap.in_flight = False
        if flap.toggles:
            flap.toggles.pop(0)
        self._h.note(f"flap {flap.ref.label} {'up' if ev.enabled else 'down'}", fault=ev.fault,
                     enabled=ev.enabled)
        if not flap.toggles:
            del self._flaps[ev.fault]
            self.ledger.flap_ended(ev.fault)
        return []

    def _run_end(self, now: float) -> list[c.Command]:
        assert self.t0 is not None
        tl = now - self.t0
        steps_over = self.timeline.done and self._action is None and not self._queued_steps
        if steps_over and tl >= self._planned_end and self.load_finished:
            return self._run_complete(now)
        w = self.scenario.workload
        if steps_over and tl >= self._planned_end and now > self._load_end + w.deadline_s + LOAD_SLACK_S:
            # Every request has a client deadline: one still running this late means the world lost it.
            self.notes.append(f"{len(self._plans)} requests still running past their deadline")
            return [c.CancelRequests(), *self._fail(
                now, f"error: TimeoutError: {len(self._plans)} requests did not end by their deadline")]
        return []

    def _run_complete(self, now: float) -> list[c.Command]:
        assert self.ledger is not None and self.workers is not None
        if self.timeline.missed:
            self.extra_verdicts.append(Verdict.unknown_(
                "timeline", f"steps missed (condition not met by the step's deadline or the run's end, or an "
                f"earlier step did not fire): "
                f"{self.timeline.missed}",
                evidence=list(self.timeline.missed)))
        else:
            self.extra_verdicts.append(Verdict.ok("timeline", numbers={"applied": len(self._applied)}))
        self._h.note("load finished", invoked=self.invoked, completed=self.completed, ok=self.ok)
        failures = self.ledger.failures
        if failures:
            self.extra_verdicts.append(Verdict.unknown_(
                "faults", "a fault could not be applied or verified: " + "; ".join(failures[:5]),
                evidence=failures[:25]))
        else:
            self.extra_verdicts.append(Verdict.ok("faults", numbers={"steps": len(self.scenario.timeline)}))
        findings = self.ledger.engine_findings
        if findings:
            # The fault is in place by what the harness saw; the engine's own answer broke its contract.
            what = f"{len(findings)} engine answer(s) its contract does not allow: {findings[0]}"
            self.extra_verdicts.append(Verdict.fail("engine_conduct", what, evidence=findings[:25]))
        if self.workers.supported is False:
            why = f" (GET /workers {self.workers.problem})" if self.workers.problem else ""
            self._h.note(f"router has no readable /workers{why}: status-based checks cannot judge")
        return self._final_events(now)

    # ------------------------------------------------------------------ ending

    def _fail(self, now: float, reason: str) -> list[c.Command]:
        self.reason = reason
        return self._final_events(now)

    def _final_events(self, now: float) -> list[c.Command]:
        """One last read of the router's events, sent once the run is over, then teardown."""
        if not self._has_events or self._final_read_done:
            return self._teardown(now)
        if self.phase is not Phase.FINAL_EVENTS:
            self.phase = Phase.FINAL_EVENTS
            self._phase_deadline = now + FINAL_EVENTS_S
        if self._events_in_flight:
            return []  # a read sent before the end: its answer comes first, then the final one
        self._events_in_flight = True
        self._final_read_done = True
        return [c.PollRouterEvents(self._events_cursor, final=True)]

    def _teardown(self, now: float) -> list[c.Command]:
        if self.phase in (Phase.TEARDOWN, Phase.COLLECT, Phase.DONE):
            return []
        self.phase = Phase.TEARDOWN
        self._phase_deadline = now + TEARDOWN_S
        cmds: list[c.Command] = [c.Teardown()]
        if self._plans:
            cmds.insert(0, c.CancelRequests())
        return cmds

    def _closing_deadline(self, now: float) -> list[c.Command]:
        if self._phase_deadline is None or now < self._phase_deadline:
            return []
        if self.phase is Phase.FINAL_EVENTS:
            self._events_in_flight = False
            return self._teardown(now)
        if self.phase is Phase.TEARDOWN:
            self._h.note(f"teardown did not answer within {TEARDOWN_S:g} s")
            return self._on(e.TornDown(), now)
        self._collected(e.HandoffsCollected(error=f"no answer within {COLLECT_S:g} s"))
        return []

    def _take_engine_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """The engines' records streams: handoff records and engine call records (CONTRACTS.md §1)."""
        for rec in records:
            if self._h.engine_record(rec)["type"] == "engine_call":
                self._calls_seen += 1
            else:
                self._handoffs_seen += 1

    def _collected(self, ev: e.HandoffsCollected) -> None:
        h = self._h
        self._take_engine_records(ev.records)
        # The checkers built on handoff records read this mark (History.handoffs_collected).
        if ev.error is None:
            h.note(f"collected {self._handoffs_seen} handoff records and {self._calls_seen} engine calls",
                   handoffs_collected=True)
        else:
            h.note(f"handoff records unreadable: {ev.error}", handoffs_collected=False)
        h.run_ended(self.reason)
        h.close()
        self.phase = Phase.DONE
