"""Scenarios as data: topology filter, router and engine settings, workload, fault timeline, expectations.

Nothing here sleeps, opens sockets or reads clocks: the real-time runner and a simulated-time runner interpret
the same objects. The timeline's firing rule (`Timeline`) is a sans-IO core that takes `now` and an observed
`World`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.topology import CONNECTORS, parse_topology

WorkerStatusName = Literal["pending", "ready", "not_ready", "failed", "draining", "absent"]
WORKER_STATUSES: tuple[str, ...] = ("pending", "ready", "not_ready", "failed", "draining", "absent")
ENGINE_FAULT_KINDS: tuple[str, ...] = (
    "wedge", "fail_server_info", "no_engine_id", "fail_requests", "latency"
)
WEDGE_SURFACES: tuple[str, ...] = ("all", "health", "metadata", "server_info", "generate", "side_channel")
INJECTABLE_BUGS: tuple[str, ...] = ("stale_engine_id", "metadata_no_deadline", "partial_read_clears_id")


class ScenarioError(ValueError):
    """A scenario (or scenario file) that cannot be run as written."""


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class RouterSettings:
    """What the router under test is told (adapters translate to their own flags)."""

    health_interval_s: float = 0.3
    health_timeout_s: float = 1.0
    failure_threshold: int = 1
    success_threshold: int = 1
    max_concurrent_health_checks: int | None = None
    identity_check_interval_s: float | None = 1.0
    prefill_policy: str = "round_robin"
    decode_policy: str = "round_robin"
    request_timeout_s: float = 10.0
    inject_bug: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineSettings:
    """Engine flags shared by every engine; `per_engine` overrides by engine name (e.g. a slow loader)."""

    transfer_timeout_s: float = 3.0
    kv_abort_timeout_s: float = 30.0
    handshake_timeout_s: float = 1.0
    load_failure_policy: Literal["fail", "recompute"] = "fail"
    load_time_s: float = 0.0
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    per_engine: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def for_engine(self, name: str) -> dict[str, Any]:
        base: dict[str, Any] = {
            "transfer_timeout_s": self.transfer_timeout_s,
            "kv_abort_timeout_s": self.kv_abort_timeout_s,
            "handshake_timeout_s": self.handshake_timeout_s,
            "load_failure_policy": self.load_failure_policy,
            "load_time_s": self.load_time_s,
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
        }
        base.update(self.per_engine.get(name, {}))
        return base


@dataclass(frozen=True)
class Workload:
    """Client traffic through the router. Times are seconds from the timeline's zero (all workers Ready)."""

    mode: Literal["open", "closed"] = "closed"
    rate_rps: float = 20.0
    concurrency: int = 4
    duration_s: float = 4.0
    stream_fraction: float = 0.3
    chat_fraction: float = 0.2
    prompt_words: tuple[int, int] = (6, 30)
    max_tokens: int = 8
    deadline_s: float = 6.0
    think_time_s: float = 0.02


# ---------------------------------------------------------------- timeline: conditions


@dataclass(frozen=True)
class At:
    """Holds from `t` seconds after the timeline's zero."""

    t: float


@dataclass(frozen=True)
class After:
    """Holds `delay_s` after the named step was applied."""

    step: str
    delay_s: float = 0.0


@dataclass(frozen=True)
class WorkerStatus:
    """Holds while the router reports the engine's worker in this status (`absent`: not listed)."""

    target: str
    status: str


@dataclass(frozen=True)
class RequestsCompleted:
    """Holds once at least n client requests have completed (any outcome)."""

    n: int


@dataclass(frozen=True)
class AllOf:
    conditions: tuple[Condition, ...]


Condition = At | After | WorkerStatus | RequestsCompleted | AllOf


# ---------------------------------------------------------------- timeline: actions


@dataclass(frozen=True)
class Restart:
    """Restart an engine on the same serving ports with a new engine id.

    mode `control`: in-process via the control API (`down_s` listeners closed); `process`: SIGKILL the
    process and
    spawn it again on the same ports after `down_s`.
    """

    target: str
    down_s: float = 0.0
    mode: Literal["control", "process"] = "control"
    engine_id: str | None = None


@dataclass(frozen=True)
class SlowStart:
    """Restart whose listeners refuse connections for `refuse_s`."""

    target: str
    refuse_s: float


@dataclass(frozen=True)
class Crash:
    """SIGKILL (mode `signal`) or ask the engine to kill itself (`control`); it stays down until `Respawn`."""

    target: str
    mode: Literal["control", "signal"] = "signal"


@dataclass(frozen=True)
class Respawn:
    """Start a crashed engine's process again on the same ports."""

    target: str


@dataclass(frozen=True)
class Die:
    """Engine death: /health 503, HealthCheck unhealthy, process exits after `exit_after_s`."""

    target: str
    exit_after_s: float = 5.0


@dataclass(frozen=True)
class Wedge:
    """Accept and never answer. mode `control`: one surface via the fault API; `sigstop`: the whole
    process."""

    target: str
    surface: str = "all"
    mode: Literal["control", "sigstop"] = "control"


@dataclass(frozen=True)
class EngineFault:
    """Any CONTRACTS §1 fault kind with its parameters, e.g. `EngineFault("decode-0", "fail_requests",
    {...})`."""

    target: str
    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Heal:
    """Clear one fault kind (`kind`), or every fault including a SIGSTOP (`kind=None`)."""

    target: str
    kind: str | None = None


@dataclass(frozen=True)
class PatchWorker:
    """Router worker API PATCH of the engine's worker (property update: labels, priority)."""

    target: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class AddWorker:
    """Register the engine with the router through its worker API (the engine need not be up)."""

    target: str


@dataclass(frozen=True)
class RemoveWorker:
    target: str


@dataclass(frozen=True)
class StartEngine:
    """Start an engine that the scenario keeps out of the initial set (`Scenario.deferred_engines`)."""

    target: str


Action = (
    Restart
    | SlowStart
    | Crash
    | Respawn
    | Die
    | Wedge
    | EngineFault
    | Heal
    | PatchWorker
    | AddWorker
    | RemoveWorker
    | StartEngine
)


def action_kind(action: Action) -> str:
    """Short lower-case name used in history records (`restart`, `wedge`, `engine_fault:no_engine_id`...)."""
    if isinstance(action, EngineFault):
        return f"fault:{action.kind}"
    name = type(action).__name__
    out = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return out


@dataclass(frozen=True)
class Step:
    """One timeline step: apply `action` once `when` holds; if it does not hold by `deadline_s` (timeline
    time),
    the step is missed and the run's verdict cannot be a pass."""

    name: str
    action: Action
    when: Condition
    deadline_s: float | None = None


@dataclass(frozen=True)
class Expect:
    """One checker to run on the history, with its parameters (names from `harness.checkers`)."""

    checker: str
    params: Mapping[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- scenario


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

    def applies_to(self, topology: str, connector: str, transport: str | None = None) -> bool:
        ok = topology in self.topologies and connector in self.connectors
        return ok and (transport is None or transport in self.transports)

    def with_router(self, **changes: Any) -> Scenario:
        from dataclasses import replace

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


def _targets(action: Action) -> str:
    return action.target


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


def _action_problems(action: Action) -> list[str]:
    if isinstance(action, EngineFault):
        if action.kind not in ENGINE_FAULT_KINDS:
            return [f"unknown engine fault kind {action.kind!r} (known: {', '.join(ENGINE_FAULT_KINDS)})"]
        if action.kind == "wedge" and action.params.get("surface", "all") not in WEDGE_SURFACES:
            return [f"unknown wedge surface {action.params.get('surface')!r}"]
    if isinstance(action, Wedge) and action.surface not in WEDGE_SURFACES:
        return [f"unknown wedge surface {action.surface!r}"]
    if isinstance(action, Wedge) and action.mode == "sigstop" and action.surface != "all":
        return ["a SIGSTOP wedge stops the whole process: surface must be 'all'"]
    if isinstance(action, Heal) and action.kind is not None and action.kind not in ENGINE_FAULT_KINDS:
        return [f"unknown fault kind to heal {action.kind!r}"]
    return []


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
            if _targets(step.action) not in engines:
                problems.append(f"step {step.name!r}: target {_targets(step.action)!r} not in {sh.name}")
            problems += [f"step {step.name!r}: {p}" for p in _condition_problems(step.when, seen, engines)]
            problems += [f"step {step.name!r}: {p}" for p in _action_problems(step.action)]
            seen.add(step.name)
        for name in (*scenario.deferred_engines, *scenario.unregistered_engines):
            if name not in engines:
                problems.append(f"engine {name!r} not in {sh.name}")
    # Actions defined outside this module (harness.netlinks) check themselves against the scenario.
    for step in scenario.timeline:
        own = getattr(step.action, "problems", None)
        if callable(own):
            problems += [f"step {step.name!r}: {p}" for p in own(scenario)]
    if problems:
        uniq = list(dict.fromkeys(problems))
        raise ScenarioError(f"scenario {scenario.name!r}: " + "; ".join(uniq))


# ---------------------------------------------------------------- timeline core (sans-IO)


@dataclass
class World:
    """What the timeline may look at: router worker statuses by engine name, completed requests, applied
    steps."""

    worker_status: dict[str, str] = field(default_factory=dict)
    requests_completed: int = 0
    applied_at: dict[str, float] = field(default_factory=dict)


def holds(cond: Condition, now: float, world: World) -> bool:
    if isinstance(cond, At):
        return now >= cond.t
    if isinstance(cond, After):
        t = world.applied_at.get(cond.step)
        return t is not None and now >= t + cond.delay_s
    if isinstance(cond, WorkerStatus):
        return world.worker_status.get(cond.target, "absent") == cond.status
    if isinstance(cond, RequestsCompleted):
        return world.requests_completed >= cond.n
    if isinstance(cond, AllOf):
        return all(holds(c, now, world) for c in cond.conditions)
    raise TypeError(f"unknown condition {cond!r}")


@dataclass
class Timeline:
    """Decides which steps fire. Steps fire in order: a step is not considered before the previous one fired
    or
    was missed, so a timeline reads like a script ("restart, then when Ready again, wedge...")."""

    steps: tuple[Step, ...]
    _next: int = 0
    missed: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self._next >= len(self.steps)

    def due(self, now: float, world: World) -> tuple[list[Step], list[Step]]:
        """(steps to apply now, steps missed now). The caller applies them and records `world.applied_at`."""
        fire: list[Step] = []
        miss: list[Step] = []
        while self._next < len(self.steps):
            step = self.steps[self._next]
            if holds(step.when, now, world):
                fire.append(step)
                # Later steps may depend on this one (After): mark it now so they can be judged in this call.
                world.applied_at.setdefault(step.name, now)
            elif step.deadline_s is not None and now > step.deadline_s:
                miss.append(step)
                self.missed.append(step.name)
            else:
                break
            self._next += 1
        return fire, miss

    def last_fixed_time(self) -> float:
        """Latest At()/deadline time mentioned: a lower bound on how long the timeline needs."""
        t = 0.0
        for s in self.steps:
            t = max(t, _cond_time(s.when), s.deadline_s or 0.0)
        return t


def _cond_time(cond: Condition) -> float:
    if isinstance(cond, At):
        return cond.t
    if isinstance(cond, AllOf):
        return max((_cond_time(c) for c in cond.conditions), default=0.0)
    return 0.0


# ---------------------------------------------------------------- loading scenario files


def _scenario_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "scenarios"


def _load_module(path: Path) -> Any:
    mod_name = f"pdchaos_scenarios_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ScenarioError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise ScenarioError(f"{path}: failed to import: {type(e).__name__}: {e}") from e
    return module


def scenarios_in_file(path: str | Path) -> list[Scenario]:
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"{p}: no such scenario file")
    module = _load_module(p)
    found = getattr(module, "SCENARIOS", None)
    if found is None:
        raise ScenarioError(f"{p}: defines no SCENARIOS list")
    if not isinstance(found, (list, tuple)):
        raise ScenarioError(f"{p}: SCENARIOS must be a list of Scenario, got {type(found).__name__}")
    out = []
    for i, s in enumerate(found):
        if not isinstance(s, Scenario):
            raise ScenarioError(f"{p}: SCENARIOS[{i}] is a {type(s).__name__}, not a Scenario")
        validate(s)
        out.append(s)
    return out


def all_scenario_files(directory: Path | None = None) -> list[Path]:
    d = directory or _scenario_dir()
    return sorted(p for p in d.glob("*.py") if not p.name.startswith("_"))


def load_scenarios(
    items: Iterable[str | Path] | None = None, directory: Path | None = None
) -> list[Scenario]:
    """Scenarios from files (paths ending .py) or names (of scenarios in the scenario directory).

    No items: every scenario in the directory. An unknown name or a bad file is a ScenarioError saying which.
    Duplicate names across files are an error (names key reports and test ids).
    """
    files = all_scenario_files(directory)
    pool: dict[str, Scenario] = {}
    origin: dict[str, Path] = {}

    def add(s: Scenario, f: Path) -> None:
        if s.name in pool and origin[s.name] != f:
            raise ScenarioError(f"scenario name {s.name!r} defined in both {origin[s.name]} and {f}")
        pool[s.name] = s
        origin[s.name] = f

    wanted = [str(i) for i in (items or [])]
    if not wanted:
        for f in files:
            for s in scenarios_in_file(f):
                add(s, f)
        return list(pool.values())
    out: list[Scenario] = []
    names_needed = [w for w in wanted if not (w.endswith(".py") or "/" in w)]
    if names_needed:
        for f in files:
            for s in scenarios_in_file(f):
                add(s, f)
    for w in wanted:
        if w.endswith(".py") or "/" in w:
            out.extend(scenarios_in_file(w))
        elif w in pool:
            out.append(pool[w])
        else:
            known = ", ".join(sorted(pool)) or "none"
            raise ScenarioError(f"unknown scenario {w!r} (known: {known})")
    return out
