"""A scenario: the cells it applies to, what the router and engines are told, the workload, the fault
timeline and the checkers that judge the run. Data only: every world interprets the same objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from fake_engines.core.bugs import ENGINE_BUGS
from harness.scenario.actions import (
    Action,
    PauseRouter,
    Respawn,
    Restart,
    SlowStart,
    StartEngine,
    action_problems,
)
from harness.scenario.bugs import INJECTABLE_BUGS
from harness.scenario.conditions import (
    WORKER_STATUSES,
    After,
    AllOf,
    At,
    Condition,
    RequestsCompleted,
    WorkerStatus,
)
from harness.scenario.links import is_network_action
from harness.scenario.presets import PRESETS
from harness.scenario.reach import reach_problems
from harness.scenario.settings import EngineSettings, RouterSettings, Workload
from harness.scenario.timeline import Step
from harness.scenario.typecheck import fields_problems, type_problems
from harness.scenario.values import (
    action_value_problems,
    engine_problems,
    expect_problems,
    router_problems,
    workload_problems,
)
from harness.topology import CONNECTORS, TRANSPORTS, parse_topology
from reference_router.core.bugs import ROUTER_BUGS

WORLDS: tuple[str, ...] = ("real", "sim")


class ScenarioError(ValueError):
    """A scenario (or scenario file) that cannot be run as written."""


@dataclass(frozen=True)
class Expect:
    """One checker to run on the history, with its parameters (names from `harness.checkers`)."""

    checker: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    """One scenario: the cells it runs in, what the router, engines and clients are told, the faults on its
    timeline and the checkers that judge each run. It is data: both worlds run the same object."""

    # Unique among the scenarios loaded; letters, digits and `_`.
    name: str
    # What happens and what a correct router does about it (shown in reports and `pdchaos list`).
    description: str
    # What it guards: gateway issue numbers, zoo entries, bug names.
    bugs: tuple[str, ...] = ()
    # The shapes it runs in, NpMd: N prefills, M decodes.
    topologies: tuple[str, ...] = ("1p1d",)
    # The KV connectors it runs with: mooncake, nixl.
    connectors: tuple[str, ...] = ("mooncake",)
    # How the router talks to the engines: http, grpc.
    transports: tuple[str, ...] = TRANSPORTS
    # What the router is told.
    router: RouterSettings = field(default_factory=RouterSettings)
    # What every engine is told.
    engines: EngineSettings = field(default_factory=EngineSettings)
    # The client traffic.
    workload: Workload = field(default_factory=Workload)
    # The faults, in order.
    timeline: tuple[Step, ...] = ()
    # The checkers that judge each run (none: the default set).
    expect: tuple[Expect, ...] = ()
    # Engines started by a timeline step instead of at set-up (not registered with the router at start).
    deferred_engines: tuple[str, ...] = ()
    # Engines the router is not told about at start (the timeline adds them through the worker API).
    unregistered_engines: tuple[str, ...] = ()
    # Run past the workload's end (e.g. to watch a recovery); the run ends at max(workload, timeline, this).
    min_duration_s: float = 0.0
    # Seconds allowed for every worker to be Ready before the timeline starts.
    ready_timeout_s: float = 15.0
    # `default` puts it in the default suite.
    tags: tuple[str, ...] = ()
    # The cells the default suite runs (a subset, to keep the suite short; empty: all of them). Naming the
    # scenario runs every cell.
    suite_topologies: tuple[str, ...] = ()
    # Likewise for the connectors.
    suite_connectors: tuple[str, ...] = ()
    # Router bugs (`--inject-bug` names) this scenario must fail under: the proof that it guards them.
    catches: tuple[str, ...] = ()
    # The worlds it runs in, and for each world the scenario cannot run in (or whose verdicts differ from the
    # other's), why.
    worlds: tuple[str, ...] = WORLDS
    world_notes: Mapping[str, str] = field(default_factory=dict)
    # The worlds whose default suite runs it (a contract workout judged in simulation keeps the real-time
    # suite short). Named, it runs in every world of `worlds`.
    suite_worlds: tuple[str, ...] = WORLDS
    # The settings preset its times are in (`harness.scenario.presets`; set by apply_preset), what a preset
    # should give it differently, and how often the harness reads the router meanwhile.
    preset: str = "scaled"
    preset_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    observe_interval_s: float = 0.15
    # The file it was loaded from (set by the loader; "" for a scenario built in code).
    source: str = ""

    def applies_to(self, topology: str, connector: str, transport: str | None = None) -> bool:
        ok = topology in self.topologies and connector in self.connectors
        return ok and (transport is None or transport in self.transports)

    def suite_cut(self) -> Scenario:
        """The scenario as the default suite runs it: only its suite cells."""
        tops = tuple(t for t in self.topologies if not self.suite_topologies or t in self.suite_topologies)
        conns = tuple(c for c in self.connectors if not self.suite_connectors or c in self.suite_connectors)
        return replace(self, topologies=tops, connectors=conns)

    def with_router(self, **changes: Any) -> Scenario:
        return replace(self, router=replace(self.router, **changes))

    def matrix(
        self,
        topologies: Sequence[str] | None = None,
        connectors: Sequence[str] | None = None,
        transports: Sequence[str] | None = None,
    ) -> list[tuple[str, str, str]]:
        """(topology, connector, transport) cells this scenario runs in, filtered by the given choices."""
        out = []
        for t in self.topologies:
            if topologies is not None and t not in topologies:
                continue
            for c in self.connectors:
                if connectors is not None and c not in connectors:
                    continue
                for tr in self.transports:
                    if transports is not None and tr not in transports:
                        continue
                    out.append((t, c, tr))
        return out


def _scenario_value_problems(s: Scenario) -> list[str]:
    out = []
    if s.min_duration_s < 0:
        out.append(f"min_duration_s must be >= 0, got {s.min_duration_s}")
    if s.ready_timeout_s <= 0:
        out.append(f"ready_timeout_s must be > 0, got {s.ready_timeout_s}")
    if s.observe_interval_s <= 0:
        out.append(f"observe_interval_s must be > 0, got {s.observe_interval_s}")
    if s.preset not in PRESETS:
        out.append(f"unknown preset {s.preset!r} (known: {', '.join(PRESETS)})")
    for preset_name, over in s.preset_overrides.items():
        out += [f"preset_overrides[{preset_name!r}]: {p}" for p in _override_problems(over)]
    return out


_OVERRIDABLE = {"router": RouterSettings, "engines": EngineSettings, "workload": Workload}


def _override_problems(over: Mapping[str, Any]) -> list[str]:
    out = []
    for key, value in over.items():
        if key == "time_scale":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            out += [] if ok else [f"time_scale must be a number > 0, got {value!r}"]
            continue
        cls = _OVERRIDABLE.get(key)
        if cls is None:
            out.append(f"unknown key {key!r} (known: time_scale, {', '.join(_OVERRIDABLE)})")
            continue
        if not isinstance(value, Mapping):
            out.append(f"{key} must be a mapping of {cls.__name__} fields, got {value!r}")
            continue
        known = {f.name for f in fields(cls)}
        out += [f"{key}.{k}: unknown {cls.__name__} field" for k in value if k not in known]
    return out


def _condition_problems(cond: Condition, steps_before: set[str], engines: set[str]) -> list[str]:
    if isinstance(cond, At):
        return [] if cond.t >= 0 else [f"At({cond.t}) is negative"]
    if isinstance(cond, After):
        out = [] if cond.step in steps_before else [f"After({cond.step!r}) names no earlier step"]
        return out + ([] if cond.delay_s >= 0 else [f"After delay {cond.delay_s} is negative"])
    if isinstance(cond, WorkerStatus):
        out = [] if cond.status in WORKER_STATUSES else [f"unknown worker status {cond.status!r}"]
        return out + ([] if cond.target in engines else [f"condition target {cond.target!r} not in topology"])
    if isinstance(cond, RequestsCompleted):
        return [] if cond.n >= 0 else [f"RequestsCompleted({cond.n}) is negative"]
    if isinstance(cond, AllOf):
        return [p for c in cond.conditions for p in _condition_problems(c, steps_before, engines)]
    return [f"unknown condition {cond!r}"]


def _type_problems(scenario: Any) -> list[str]:
    """Wrong types anywhere in the scenario (a Step action is checked against every action type)."""
    if not isinstance(scenario, Scenario):
        return [f"expected a Scenario, got {type(scenario).__name__}"]
    out = fields_problems(scenario)
    for i, step in enumerate(scenario.timeline if isinstance(scenario.timeline, tuple | list) else ()):
        if isinstance(step, Step):
            out += type_problems(step.action, Action, f"timeline[{i}] ({step.name!r}).action")
    for i, x in enumerate(scenario.expect if isinstance(scenario.expect, tuple | list) else ()):
        if isinstance(x, Expect) and x.checker not in _checker_names():
            out.append(f"expect[{i}]: unknown checker {x.checker!r} (known: {', '.join(_checker_names())})")
    return out


def _checker_names() -> list[str]:
    from harness.checkers import CHECKERS

    return sorted(CHECKERS)


def validate(scenario: Scenario) -> None:
    """Raise ScenarioError listing every problem (wrong types, bad topology, unknown targets, dangling step
    references, values out of range, deadlines no run can meet, bad checker parameters...)."""
    name = getattr(scenario, "name", None)
    label = repr(name) if isinstance(name, str) else "(unnamed)"
    typed = _type_problems(scenario)
    if typed:
        # Everything below assumes the types are right.
        raise ScenarioError(f"scenario {label}: " + "; ".join(dict.fromkeys(typed)))
    problems: list[str] = []
    if not scenario.name or not scenario.name.replace("_", "").replace("-", "").isalnum():
        problems.append(f"bad scenario name {scenario.name!r} (letters, digits, - and _)")
    for what, values in (("topologies", scenario.topologies), ("connectors", scenario.connectors),
                         ("transports", scenario.transports)):
        if not values:
            problems.append(f"no {what} (the scenario would have no cell to run in)")
    shapes = []
    for t in scenario.topologies:
        try:
            shapes.append(parse_topology(t))
        except ValueError as e:
            problems.append(str(e))
    problems += [f"bad connector {c!r}" for c in scenario.connectors if c not in CONNECTORS]
    problems += [f"bad transport {tr!r}" for tr in scenario.transports if tr not in TRANSPORTS]
    problems += [f"unknown world {world!r} (known: {', '.join(WORLDS)})"
                 for world in scenario.worlds if world not in WORLDS]
    problems += [f"suite_worlds names unknown world {world!r} (known: {', '.join(WORLDS)})"
                 for world in scenario.suite_worlds if world not in WORLDS]
    problems += [f"preset_overrides names unknown preset {name!r} (known: {', '.join(PRESETS)})"
                 for name in scenario.preset_overrides if name not in PRESETS]
    problems += [f"catches unknown bug {bug!r} (known: {', '.join(INJECTABLE_BUGS)})"
                 for bug in scenario.catches if bug not in INJECTABLE_BUGS]
    for name, cut, whole in (("suite_topologies", scenario.suite_topologies, scenario.topologies),
                             ("suite_connectors", scenario.suite_connectors, scenario.connectors)):
        extra = [x for x in cut if x not in whole]
        if extra:
            problems.append(f"{name} {extra} not among the scenario's own {list(whole)}")
    problems += [f"router.inject_bugs: unknown router bug {bug!r}"
                 for bug in scenario.router.inject_bugs if bug not in ROUTER_BUGS]
    problems += [f"engines.inject_bugs: unknown engine bug {bug!r}"
                 for bug in scenario.engines.inject_bugs if bug not in ENGINE_BUGS]
    for engine, over in scenario.engines.per_engine.items():
        own = over.get("inject_bugs", ()) if isinstance(over, Mapping) else ()
        for bug in own if isinstance(own, tuple | list) else ():
            if bug not in ENGINE_BUGS:
                problems.append(f"engines.per_engine[{engine!r}].inject_bugs: unknown engine bug {bug!r} "
                                f"(known: {', '.join(sorted(ENGINE_BUGS))})")
    problems += workload_problems(scenario.workload)
    problems += router_problems(scenario.router)
    # Targets must exist in every topology the scenario claims.
    for sh in shapes:
        engines = set(sh.engine_names())
        seen: set[str] = set()
        for step in scenario.timeline:
            if step.name in seen:
                problems.append(f"duplicate step name {step.name!r}")
            if step.action.target not in engines and not isinstance(step.action, PauseRouter):
                problems.append(f"step {step.name!r}: target {step.action.target!r} not in {sh.name}")
            problems += [f"step {step.name!r}: {p}" for p in _condition_problems(step.when, seen, engines)]
            problems += [f"step {step.name!r}: {p}" for p in action_problems(step.action)]
            problems += [f"step {step.name!r}: {p}" for p in action_value_problems(step.action)]
            seen.add(step.name)
        for name in (*scenario.deferred_engines, *scenario.unregistered_engines):
            if name not in engines:
                problems.append(f"engine {name!r} not in {sh.name}")
    all_engines = {n for sh in shapes for n in sh.engine_names()}
    problems += engine_problems(scenario.engines, all_engines)
    problems += _scenario_value_problems(scenario)
    problems += reach_problems(scenario.timeline, scenario.workload)
    steps = {st.name for st in scenario.timeline}
    for x in scenario.expect:
        problems += expect_problems(x.checker, x.params, steps)
    # Network actions check themselves against the scenario (a link must exist under its connectors).
    for step in scenario.timeline:
        own = getattr(step.action, "problems", None)
        if callable(own):
            problems += [f"step {step.name!r}: {p}" for p in own(scenario)]
    problems += side_channel_restart_problems(scenario)
    problems += [f"step {st.name!r}: StartEngine({st.action.target!r}) starts an engine that is not in "
                 "deferred_engines (it already starts with the cell)"
                 for st in scenario.timeline
                 if isinstance(st.action, StartEngine) and st.action.target not in scenario.deferred_engines]
    if problems:
        uniq = list(dict.fromkeys(problems))
        raise ScenarioError(f"scenario {label}: " + "; ".join(uniq))


def side_channel_restart_problems(scenario: Scenario) -> list[str]:
    """A Mooncake prefill binds a new side-channel port at every start. In real time the proxy a link fault on
    its side channel goes through is set up for the port of its first start and cannot follow: every pull
    after a restart would fail because of the harness, not of the system under test."""
    if "real" not in scenario.worlds or "mooncake" not in scenario.connectors:
        return []
    faulted = {st.action.target: st.name for st in scenario.timeline
               if is_network_action(st.action) and st.action.link == "side_channel"}
    out = []
    for st in scenario.timeline:
        a = st.action
        if isinstance(a, Restart | SlowStart | Respawn) and a.target in faulted:
            out.append(f"step {st.name!r} restarts {a.target}, whose side_channel link step "
                       f"{faulted[a.target]!r} faults: in real time that link's proxy keeps the side-channel "
                       "port of the first start (Mooncake binds a new one at each start); run it in "
                       "simulation only (worlds=('sim',), world_notes={'real': why}) or with "
                       "connectors=('nixl',)")
    return out
