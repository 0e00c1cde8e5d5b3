"""A scenario: the cells it applies to, what the router and engines are told, the workload, the fault
timeline and the checkers that judge the run. Data only: every world interprets the same objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.scenario.actions import action_problems
from harness.scenario.conditions import (
    WORKER_STATUSES,
    After,
    AllOf,
    At,
    Condition,
    RequestsCompleted,
    WorkerStatus,
)
from harness.scenario.presets import PRESETS
from harness.scenario.settings import EngineSettings, RouterSettings, Workload
from harness.scenario.timeline import Step
from harness.topology import CONNECTORS, parse_topology
from reference_router.core.bugs import KNOWN_BUGS

INJECTABLE_BUGS: tuple[str, ...] = tuple(sorted(KNOWN_BUGS))
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
    name: str
    description: str
    bugs: tuple[str, ...] = ()
    topologies: tuple[str, ...] = ("1p1d",)
    connectors: tuple[str, ...] = ("mooncake",)
    transports: tuple[str, ...] = ("http", "grpc")
    router: RouterSettings = field(default_factory=RouterSettings)
    engines: EngineSettings = field(default_factory=EngineSettings)
    workload: Workload = field(default_factory=Workload)
    timeline: tuple[Step, ...] = ()
    expect: tuple[Expect, ...] = ()
    # Engines started by a timeline step instead of at set-up (not registered with the router at start).
    deferred_engines: tuple[str, ...] = ()
    # Engines the router is not told about at start (the timeline adds them through the worker API).
    unregistered_engines: tuple[str, ...] = ()
    # Run past the workload's end (e.g. to watch a recovery); the run ends at max(workload, timeline, this).
    min_duration_s: float = 0.0
    # Seconds allowed for every worker to be Ready before the timeline starts.
    ready_timeout_s: float = 15.0
    tags: tuple[str, ...] = ()
    # Router bugs (`--inject-bug` names) this scenario must fail under: the proof that it guards them.
    catches: tuple[str, ...] = ()
    # The worlds it runs in, and for each world the scenario cannot run in (or whose verdicts differ from the
    # other's), why.
    worlds: tuple[str, ...] = ("real", "sim")
    world_notes: Mapping[str, str] = field(default_factory=dict)
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


def validate(scenario: Scenario) -> None:
    """Raise ScenarioError listing every problem (bad topology, unknown targets, dangling step
    references...)."""
    problems: list[str] = []
    if not scenario.name or not scenario.name.replace("_", "").replace("-", "").isalnum():
        problems.append(f"bad scenario name {scenario.name!r} (letters, digits, - and _)")
    if not scenario.topologies:
        problems.append("no topologies")
    shapes = []
    for t in scenario.topologies:
        try:
            shapes.append(parse_topology(t))
        except ValueError as e:
            problems.append(str(e))
    for c in scenario.connectors:
        if c not in CONNECTORS:
            problems.append(f"bad connector {c!r}")
    for tr in scenario.transports:
        if tr not in ("http", "grpc"):
            problems.append(f"bad transport {tr!r}")
    for world in scenario.worlds:
        if world not in WORLDS:
            problems.append(f"unknown world {world!r} (known: {', '.join(WORLDS)})")
    for name in scenario.preset_overrides:
        if name not in PRESETS:
            problems.append(f"preset_overrides names unknown preset {name!r} (known: {', '.join(PRESETS)})")
    for bug in scenario.catches:
        if bug not in INJECTABLE_BUGS:
            problems.append(f"catches unknown bug {bug!r} (known: {', '.join(INJECTABLE_BUGS)})")
    if scenario.router.inject_bug is not None and scenario.router.inject_bug not in INJECTABLE_BUGS:
        problems.append(f"unknown inject_bug {scenario.router.inject_bug!r}")
    w = scenario.workload
    if w.duration_s <= 0 or w.deadline_s <= 0:
        problems.append("workload duration and deadline must be positive")
    if w.mode == "open" and w.rate_rps <= 0:
        problems.append("open-loop workload needs rate_rps > 0")
    if w.mode == "closed" and w.concurrency < 1:
        problems.append("closed-loop workload needs concurrency >= 1")
    if not (0 <= w.stream_fraction <= 1 and 0 <= w.chat_fraction <= 1):
        problems.append("stream_fraction and chat_fraction must be within [0, 1]")
    if w.prompt_words[0] < 1 or w.prompt_words[0] > w.prompt_words[1]:
        problems.append(f"bad prompt_words range {w.prompt_words}")
    # Targets must exist in every topology the scenario claims.
    for sh in shapes:
        engines = set(sh.engine_names())
        seen: set[str] = set()
        for step in scenario.timeline:
            if step.name in seen:
                problems.append(f"duplicate step name {step.name!r}")
            if step.action.target not in engines:
                problems.append(f"step {step.name!r}: target {step.action.target!r} not in {sh.name}")
            problems += [f"step {step.name!r}: {p}" for p in _condition_problems(step.when, seen, engines)]
            problems += [f"step {step.name!r}: {p}" for p in action_problems(step.action)]
            seen.add(step.name)
        for name in (*scenario.deferred_engines, *scenario.unregistered_engines):
            if name not in engines:
                problems.append(f"engine {name!r} not in {sh.name}")
    # Network actions check themselves against the scenario (a link must exist under its connectors).
    for step in scenario.timeline:
        own = getattr(step.action, "problems", None)
        if callable(own):
            problems += [f"step {step.name!r}: {p}" for p in own(scenario)]
    if problems:
        uniq = list(dict.fromkeys(problems))
        raise ScenarioError(f"scenario {scenario.name!r}: " + "; ".join(uniq))
