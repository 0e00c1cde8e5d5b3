"""The scenario session on a virtual clock with scripted events only (no process, no socket): the commands it
emits, in order, at the right times; the history it writes; the verdicts of the run itself."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from helpers.scripted_world import Answer, drive

from fake_engines.core.records import make_record
from harness.scenario import (
    After,
    At,
    Crash,
    EngineFault,
    EngineSettings,
    Expect,
    Heal,
    HealLink,
    LinkFlap,
    Partition,
    Respawn,
    Restart,
    RouterSettings,
    Scenario,
    Step,
    WorkerStatus,
    Workload,
)
from harness.session import Phase, ScenarioSession
from harness.session import commands as c
from harness.session import events as e
from harness.session.arrivals import open_loop_arrivals
from harness.session.requests import expected_text
from harness.topology import build_topology

TOPO = build_topology("1p1d", "mooncake", "http", list(range(20000, 20011)))
FAST = Workload(mode="closed", concurrency=2, duration_s=3.0, deadline_s=2.0, think_time_s=0.05)


def _scenario(*steps: Step, workload: Workload = FAST, **kw: Any) -> Scenario:
    return Scenario(name="s", description="", topologies=("1p1d",), router=RouterSettings(),
                    engines=EngineSettings(), workload=workload, timeline=steps,
                    expect=kw.pop("expect", (Expect("nothing_lost"),)), **kw)


class World:
    """Answers like a healthy cell: engines up in 0.5 s, the router in 0.3 s, every worker Ready 0.5 s after
    the router, requests answered correctly in 0.1 s, actions applied and verified at once."""

    def __init__(self, ready: bool = True, has_events: bool = True, workers_api: bool = True) -> None:
        self.ready = ready
        self.has_events = has_events
        self.workers_api = workers_api
        self.router_up_at: float | None = None
        self.registered: tuple[str, ...] = ()
        self.override: dict[type, Callable[[Any, float], Answer]] = {}

    def __call__(self, cmd: c.Command, now: float) -> Answer:
        if type(cmd) in self.override:
            return self.override[type(cmd)](cmd, now)
        if isinstance(cmd, c.LaunchEngine):
            return [(0.5, e.EngineUp(cmd.name, {"engine_id": f"{cmd.name}-1", "generation": 1}))]
        if isinstance(cmd, c.LaunchRouter):
            self.router_up_at = now + 0.3
            self.registered = cmd.registered
            return [(0.0, e.WorldNote("router launch", {"argv": ["r"]})), (0.3, e.RouterUp(self.has_events))]
        if isinstance(cmd, c.PollWorkers):
            if not self.workers_api:
                return [(0.01, e.WorkersSeen(None))]
            up = self.ready and self.router_up_at is not None and now >= self.router_up_at + 0.5
            workers = tuple({"id": n, "url": f"u/{n}", "role": n.split("-")[0],
                             "status": "ready" if up else "pending"} for n in self.registered)
            return [(0.01, e.WorkersSeen(workers, {f"u/{n}": n for n in self.registered}))]
        if isinstance(cmd, c.PollRouterEvents):
            return [(0.01, e.RouterEventsSeen(({"type": "probe", "ts": 1.0, "ok": True},), cmd.since + 1))]
        if isinstance(cmd, c.CheckRoutable):
            return [(0.05, e.RoutableSeen(True))]
        if isinstance(cmd, c.SendRequest):
            return [(0.1, e.RequestDone(cmd.plan.seq, 200, True, expected_text(cmd.plan), latency_s=0.1))]
        if isinstance(cmd, c.ApplyAction):
            a = cmd.action
            return [(0.0, e.FaultApplied(cmd.fault, type(a).__name__.lower(), a.target, {})),
                    (0.2, e.FaultVerified(cmd.fault, True, {"seen": True})),
                    (0.2, e.ActionDone(cmd.fault))]
        if isinstance(cmd, c.SetLinkEnabled):
            return [(0.01, e.LinkToggled(cmd.fault, cmd.engine, cmd.link, cmd.enabled))]
        if isinstance(cmd, c.Teardown):
            return [(0.2, e.TornDown())]
        if isinstance(cmd, c.CollectHandoffs):
            pulled = make_record(ts=2.0, engine="decode-0", engine_id="B", generation=1, role="decode",
                                 kind="decode", request_id="r1", tag=None, connector="mooncake",
                                 prompt_digest="ab", outcome="pulled", duration_s=0.01, output_digest="cd")
            return [(0.05, e.HandoffsCollected((pulled,)))]
        return []


def _session(s: Scenario, **kw: Any) -> ScenarioSession:
    return ScenarioSession(s, TOPO, router="reference", seed=kw.pop("seed", 0), run_id="r1", **kw)


def _records(session: ScenarioSession, kind: str) -> list[dict[str, Any]]:
    assert session.history is not None
    return [r for r in session.history.records if r["type"] == kind]


def _verdicts(session: ScenarioSession) -> dict[str, str]:
    return {v.name: v.status for v in session.result().verdicts}


def test_the_2491_timeline_commands_in_order_at_the_right_times() -> None:
    s = _scenario(Step("restart", Restart("prefill-0", down_s=0.6), At(1.5)))
    session = _session(s)
    trace = drive(session, World())
    kinds = [type(cmd).__name__ for _, cmd in trace.commands]
    # Set-up: both engines at once, the router once both serve, then the observers.
    assert kinds[:5] == ["LaunchEngine", "LaunchEngine", "LaunchRouter", "PollWorkers", "PollRouterEvents"]
    assert [t for t, _ in trace.of(c.LaunchEngine)] == [100.0, 100.0]
    assert trace.of(c.LaunchRouter)[0][0] == pytest.approx(100.5)
    launch = trace.of(c.LaunchRouter)[0][1]
    assert launch.registered == ("prefill-0", "decode-0") and launch.settings == s.router
    # Timeline zero: the first read that shows every worker Ready (router up at 100.8, Ready from 101.3).
    t0 = session.t0
    assert t0 is not None and 101.3 <= t0 < 101.3 + 0.2
    sends = trace.of(c.SendRequest)
    assert [t for t, _ in sends[:2]] == [t0, t0]  # two closed-loop clients start together
    # The step fires exactly at its time, once.
    actions = trace.of(c.ApplyAction)
    assert [(round(t - t0, 6), cmd.fault) for t, cmd in actions] == [(1.5, "restart")]
    # No request is sent after the workload's end; teardown and collection come last, once.
    assert all(t < t0 + FAST.duration_s for t, _ in sends)
    assert kinds[-2:] == ["Teardown", "CollectHandoffs"] and kinds.count("Teardown") == 1
    assert session.done and session.reason == "done"
    assert _verdicts(session) == {"run_complete": "pass", "nothing_lost": "pass", "timeline": "pass",
                                  "faults": "pass"}


def test_history_of_the_run() -> None:
    session = _session(_scenario(Step("restart", Restart("prefill-0"), At(1.0))))
    drive(session, World())
    types = [r["type"] for r in session.history.records]  # type: ignore[union-attr]
    assert types[0] == "run_started" and types[-1] == "run_ended"
    started = session.history.records[0]  # type: ignore[union-attr]
    assert started["t"] == 0 and started["wall_start"] == 1_000_000.0
    assert started["settings"]["engines_layout"]["prefill-0"]["url"] == TOPO.url_of("prefill-0")
    assert [r["engine"] for r in _records(session, "engine_state")] == ["prefill-0", "decode-0"]
    assert [r["message"] for r in _records(session, "note")][:2] == [
        "router launch", "timeline zero: all workers ready"]
    # Faults: applied, verified, then (a restart is one-shot) healed.
    assert [(r["type"], r["fault"]) for r in session.history.records  # type: ignore[union-attr]
            if r["type"].startswith("fault_")] == [
        ("fault_applied", "restart"), ("fault_verified", "restart"), ("fault_healed", "restart")]
    invoked = _records(session, "request_invoked")
    completed = _records(session, "request_completed")
    assert len(invoked) == len(completed) > 10
    assert all(r["text_ok"] is True and r["ok"] for r in completed)
    assert invoked[0]["tag"] == "[pdchaos:r1:1]"
    assert len(_records(session, "router_event")) > 5 and len(_records(session, "handoff")) == 1
    assert {r["status"] for r in _records(session, "router_status")} == {"pending", "ready"}


def test_same_seed_same_history_other_seed_other_prompts() -> None:
    def run(seed: int) -> list[dict[str, Any]]:
        session = _session(_scenario(Step("restart", Restart("prefill-0"), At(1.0))), seed=seed)
        drive(session, World())
        return session.history.records  # type: ignore[union-attr]

    a, b, other = run(3), run(3), run(4)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    prompts = [r["prompt_chars"] for r in a if r["type"] == "request_invoked"]
    assert prompts != [r["prompt_chars"] for r in other if r["type"] == "request_invoked"]


def test_open_loop_arrivals_follow_the_seeded_schedule() -> None:
    w = Workload(mode="open", rate_rps=50, duration_s=2.0, deadline_s=2.0)
    session = _session(_scenario(workload=w), seed=9)
    trace = drive(session, World())
    assert session.t0 is not None
    sent = [round(t - session.t0, 9) for t, _ in trace.of(c.SendRequest)]
    assert sent == [round(x, 9) for x in open_loop_arrivals(w, 9)]
    assert 60 < len(sent) < 140 and sent == sorted(sent)
    assert open_loop_arrivals(w, 9) != open_loop_arrivals(w, 10)


def test_closed_loop_waits_for_answers_and_think_time() -> None:
    w = Workload(mode="closed", concurrency=1, duration_s=1.0, deadline_s=2.0, think_time_s=0.2)
    session = _session(_scenario(workload=w))
    trace = drive(session, World())
    times = [t for t, _ in trace.of(c.SendRequest)]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert gaps and all(g == pytest.approx(0.3) for g in gaps)  # 0.1 s answer + 0.2 s think time


def test_steps_wait_on_status_and_on_each_other() -> None:
    steps = (Step("crash", Crash("prefill-0"), At(0.5)),
             Step("back", Respawn("prefill-0"), After("crash", 1.0)),
             Step("seen", Heal("prefill-0"), WorkerStatus("prefill-0", "ready")))
    session = _session(_scenario(*steps))
    trace = drive(session, World())
    t0 = session.t0
    assert t0 is not None
    times = {cmd.fault: round(t - t0, 6) for t, cmd in trace.of(c.ApplyAction)}
    assert times["crash"] == 0.5 and times["back"] == 1.5
    assert times["seen"] >= 1.7  # the respawn's own action had to end first (0.2 s)
    assert _verdicts(session)["timeline"] == "pass"


def test_a_step_past_its_deadline_is_missed_and_the_run_is_unknown() -> None:
    steps = (Step("never", Heal("prefill-0"), WorkerStatus("prefill-0", "failed"), deadline_s=1.0),)
    session = _session(_scenario(*steps))
    trace = drive(session, World())
    assert trace.of(c.ApplyAction) == []
    assert _verdicts(session)["timeline"] == "unknown"
    assert any("missed" in r["message"] for r in _records(session, "note"))
    # Not "never held": it may hold later (the failed status comes after the deadline in real runs).
    reason = next(v.reason for v in session.result().verdicts if v.name == "timeline")
    assert reason.startswith("steps missed (condition not met by the step's deadline or the run's end")


def test_workers_never_ready_fails_the_router() -> None:
    session = _session(_scenario(ready_timeout_s=2.0))
    trace = drive(session, World(ready=False))
    assert trace.of(c.SendRequest) == [] and session.t0 is None
    v = {x.name: x for x in session.result().verdicts}
    assert v["workers_ready"].status == "fail" and "prefill-0" in v["workers_ready"].reason
    assert session.reason.startswith("error: WorkersNotReady")
    assert [type(cmd).__name__ for _, cmd in trace.commands][-2:] == ["Teardown", "CollectHandoffs"]


def test_an_engine_that_never_starts_ends_the_run_with_the_reason() -> None:
    world = World()
    world.override[c.LaunchEngine] = lambda cmd, now: [
        (0.2, e.EngineFailed(cmd.name, "ProcessStartError: x"))]
    session = _session(_scenario())
    trace = drive(session, world)
    assert trace.of(c.LaunchRouter) == []
    assert session.reason == "error: ProcessStartError: x"
    assert _verdicts(session)["run_complete"] == "unknown"


def test_a_router_without_worker_api_is_ready_when_a_request_goes_through() -> None:
    session = _session(_scenario())
    trace = drive(session, World(workers_api=False, has_events=False))
    assert len(trace.of(c.CheckRoutable)) == 1 and session.t0 is not None
    assert trace.of(c.PollRouterEvents) == []
    assert any("no readable /workers" in r["message"] for r in _records(session, "note"))


def test_an_action_that_raises_makes_the_faults_verdict_unknown() -> None:
    world = World()
    world.override[c.ApplyAction] = lambda cmd, now: [(0.1, e.ActionDone(cmd.fault, error="RuntimeError: x"))]
    session = _session(_scenario(Step("boom", Restart("prefill-0"), At(0.5))))
    drive(session, world)
    assert _verdicts(session)["faults"] == "unknown"
    verified = _records(session, "fault_verified")
    assert verified[0]["ok"] is False and verified[0]["evidence"] == {"error": "RuntimeError: x"}


def test_an_action_that_never_answers_is_given_up() -> None:
    world = World()
    world.override[c.ApplyAction] = lambda cmd, now: []
    session = _session(_scenario(Step("stuck", Restart("prefill-0"), At(0.5))))
    drive(session, world, until=1000)
    assert _verdicts(session)["faults"] == "unknown"
    assert "no answer" in _records(session, "fault_verified")[0]["evidence"]["error"]


def test_ledger_heals_by_the_rules() -> None:
    steps = (
        Step("slow", EngineFault("prefill-0", "latency", {"ms": 5}), At(0.2)),
        Step("restart", Restart("prefill-0"), At(0.5)),
        Step("crash", Crash("decode-0"), At(0.8)),
        Step("nosid", EngineFault("decode-0", "no_engine_id"), At(0.9)),
        Step("heal_nosid", Heal("decode-0", "no_engine_id"), At(1.2)),
        Step("respawn", Respawn("decode-0"), At(1.5)),
    )
    world = World()
    base = world.__call__

    def respond(cmd: c.Command, now: float) -> Answer:
        if isinstance(cmd, c.ApplyAction) and isinstance(cmd.action, EngineFault):
            return [(0.0, e.FaultApplied(cmd.fault, cmd.action.kind, cmd.action.target, {})),
                    (0.1, e.ActionDone(cmd.fault))]
        if isinstance(cmd, c.ApplyAction) and isinstance(cmd.action, Heal):
            return [(0.1, e.ActionDone(cmd.fault, verified=True, evidence={"remaining": {}}))]
        return base(cmd, now)

    session = _session(_scenario(*steps))
    drive(session, respond)
    healed = [r["fault"] for r in _records(session, "fault_healed")]
    # The restart ends itself and the latency fault; the heal ends one kind; the respawn ends the crash.
    assert healed == ["restart", "slow", "nosid", "crash", "respawn"]
    heal_note = next(r for r in _records(session, "note") if r["message"].startswith("heal decode-0"))
    assert heal_note["evidence"]["healed"] == ["nosid"] and heal_note["fault"] == "heal_nosid"


def test_a_flapping_link_toggles_on_time_then_heals_itself() -> None:
    flap = LinkFlap("prefill-0", down_s=0.4, up_s=0.3, cycles=2)
    world = World()
    base = world.__call__

    def respond(cmd: c.Command, now: float) -> Answer:
        if isinstance(cmd, c.ApplyAction):
            applied = e.FaultApplied(cmd.fault, "link_flap", "prefill-0", {"link": "serve"}, link="serve")
            return [(0.0, applied), (0.1, e.FaultVerified(cmd.fault, True)), (0.1, e.ActionDone(cmd.fault))]
        return base(cmd, now)

    session = _session(_scenario(Step("flap", flap, At(0.5)), Step("cut", Partition("prefill-0"), At(2.5))))
    trace = drive(session, respond)
    done_at = trace.of(c.ApplyAction)[0][0] + 0.1
    toggles = [(round(t - done_at, 6), cmd.enabled) for t, cmd in trace.of(c.SetLinkEnabled)]
    assert toggles == [(0.4, True), (0.7, False), (1.1, True)]
    notes = [r["message"] for r in _records(session, "note") if r["message"].startswith("flap")]
    assert notes == ["flap prefill-0.serve up", "flap prefill-0.serve down", "flap prefill-0.serve up"]
    healed = _records(session, "fault_healed")
    # The flap ends with its last cycle; the partition (a link fault still active) with the run.
    assert [(r["fault"], r["reason"], r["link"]) for r in healed] == [
        ("flap", "flapping ended", "serve"), ("cut", "end of run", "serve")]


def test_a_flap_toggle_still_on_its_way_when_the_link_is_healed_leaves_the_link_up() -> None:
    """Found by `pdchaos search` (no bug switch): a restart held the timeline back, the heal of a flapping
    link came before its last "down", and that "down", sent just before the heal, cut the link for good."""
    flap = LinkFlap("prefill-0", down_s=0.4, up_s=0.3, cycles=2)
    world = World()
    base = world.__call__

    def respond(cmd: c.Command, now: float) -> Answer:
        if isinstance(cmd, c.ApplyAction) and isinstance(cmd.action, LinkFlap):
            applied = e.FaultApplied(cmd.fault, "link_flap", "prefill-0", {"link": "serve"}, link="serve")
            return [(0.0, applied), (0.1, e.FaultVerified(cmd.fault, True)), (0.1, e.ActionDone(cmd.fault))]
        if isinstance(cmd, c.SetLinkEnabled):  # a slow toggle: the heal overtakes the "down" one
            return [(0.3, e.LinkToggled(cmd.fault, cmd.engine, cmd.link, cmd.enabled))]
        return base(cmd, now)

    # Timeline zero plus: the flap is done at 0.6, "up" is sent at 1.0, "down" at 1.3 (answered at 1.6); the
    # heal, sent at 1.2, is done at 1.4, while the "down" is on its way.
    session = _session(_scenario(Step("flap", flap, At(0.5)), Step("mend", HealLink("prefill-0"), At(1.2))))
    trace = drive(session, respond)
    toggles = [cmd.enabled for _, cmd in trace.of(c.SetLinkEnabled)]
    assert toggles == [True, False, True]
    assert any(r["message"] == "flap prefill-0.serve down after its heal: up again"
               for r in _records(session, "note"))


def test_interrupt_tears_down_at_once() -> None:
    session = _session(_scenario())
    world = World()
    cmds = session.start(0.0)
    assert all(isinstance(x, c.LaunchEngine) for x in cmds)
    for x in cmds:
        for _delay, ev in world(x, 0.0):
            session.handle(ev, 0.5)
    out = session.interrupt(0.6)
    assert [type(x) for x in out] == [c.Teardown]
    assert session.handle(e.TornDown(), 0.7) == [c.CollectHandoffs()]
    session.handle(e.HandoffsCollected(), 0.8)
    assert session.done and session.reason == "interrupted"
    assert _records(session, "run_ended")[0]["reason"] == "interrupted"


def test_next_wakeup_is_never_in_the_past_and_always_set() -> None:
    session = _session(_scenario(Step("r", Restart("prefill-0"), At(1.0))))
    seen: list[tuple[float, float]] = []
    world = World()

    def respond(cmd: c.Command, now: float) -> Answer:
        seen.append((now, session.next_wakeup(now) or -1))
        return world(cmd, now)

    drive(session, respond)
    assert all(wake > now for now, wake in seen)


def test_bring_up_only_ends_at_ready() -> None:
    session = _session(_scenario(), bring_up_only=True)
    trace = drive(session, World())
    assert session.phase is Phase.DONE and session.reason == "ready"
    assert trace.of(c.SendRequest) == [] and trace.of(c.Teardown) == []


def test_a_loading_engine_delays_the_ready_wait_not_the_router() -> None:
    engines = EngineSettings(per_engine={"decode-0": {"load_time_s": 3.0}})
    world = World()
    base = world.__call__

    def respond(cmd: c.Command, now: float) -> Answer:
        if isinstance(cmd, c.LaunchEngine) and cmd.name == "decode-0":
            return [(3.5, e.EngineUp("decode-0", {"engine_id": "d"}))]
        return base(cmd, now)

    session = _session(replace(_scenario(), engines=engines))
    trace = drive(session, respond)
    launch_t = trace.of(c.LaunchRouter)[0][0]
    assert launch_t == pytest.approx(100.5)  # after the prefill only: the router meets the loading decode
    assert session.t0 is not None and session.t0 >= 103.5


class CrashingRouter(World):
    """The router process ends 1.5 s in (`by_harness`: with its fork server): the world says so with the next
    poll."""

    def __init__(self, by_harness: bool = False) -> None:
        super().__init__()
        self.by_harness = by_harness
        self.said = False

    def __call__(self, cmd: c.Command, now: float) -> Answer:
        answer = super().__call__(cmd, now)
        if isinstance(cmd, c.PollWorkers) and now > 1.5 and not self.said:
            self.said = True
            why = "" if self.by_harness else "Killed"
            return [(0.0, e.RouterExited(-9, why, by_harness=self.by_harness)), *answer]
        return answer


def test_a_router_that_exits_during_the_run_fails_it_with_the_reason() -> None:
    """The checkers would only see lost requests; the history and the verdict say the router crashed."""
    session = _session(_scenario())
    drive(session, CrashingRouter())
    router = next(v for v in session.result().verdicts if v.name == "router")
    assert router.status == "fail" and router.reason == "the router exited (signal 9) during the run: Killed"
    assert any(r["message"].startswith("the router exited (signal 9)") for r in _records(session, "note"))


def test_a_router_the_harness_lost_with_its_fork_server_makes_the_run_unknown_not_failed() -> None:
    session = _session(_scenario())
    drive(session, CrashingRouter(by_harness=True))
    router = next(v for v in session.result().verdicts if v.name == "router")
    assert router.status == "unknown" and "the fork server it was started from died" in router.reason


def test_why_the_worker_list_could_not_be_read_is_in_the_note() -> None:
    world = World(workers_api=False)
    world.override[c.PollWorkers] = lambda cmd, now: [(0.01, e.WorkersSeen(None, problem="answered 401"))]
    session = _session(_scenario())
    drive(session, world)
    notes = [r["message"] for r in _records(session, "note")]
    assert "router has no readable /workers (GET /workers answered 401): status-based checks cannot judge" \
        in notes
