"""What a search with bug switches on draws first: only the connectors and transports where the switches
can occur at all (`BugSwitch.connectors/transports`), and first the fault kinds, router and engine settings
of the shipped scenarios that catch them (`Scenario.catches`), whose fault schedules also become templates
(`fault_templates`): a group of faults the strategies may draw whole, on engines of the same roles, at a
random time of a random topology, workload and settings. A bias, not a restriction: every kind stays in the
space, a template is one group kind among the random ones, and the shrinker still walks toward the simplest
case (a single random fault before a template)."""

from __future__ import annotations

from typing import Any

from harness.scenario import (
    Action,
    AddWorker,
    After,
    At,
    Crash,
    Die,
    EngineFault,
    GracefulStop,
    Heal,
    HealLink,
    LinkBandwidth,
    LinkFlap,
    LinkLatency,
    LinkReset,
    Partition,
    PatchWorker,
    Respawn,
    Restart,
    Scenario,
    SlowStart,
    Step,
    Wedge,
)
from harness.scenario.bugs import SWITCHES
from harness.scenario.presets import SCALED_ENGINES, SCALED_ROUTER
from harness.search.case import Breaker, Load
from harness.search.faults import API_MISTAKES, KINDS, LONG_GRACE_S, FaultSpec
from harness.search.strategies import Space
from harness.topology import CONNECTORS, TRANSPORTS, parse_topology

_FAULT_KIND = {"fail_server_info": "fail_server_info", "no_engine_id": "no_engine_id",
               "fail_requests": "fail_requests", "latency": "latency_fault", "wedge": "wedge"}


def search_kind(action: Action) -> str | None:
    """The search's fault kind for a timeline action (None: not a fault the search draws)."""
    if isinstance(action, Restart):
        return "process_restart" if action.mode == "process" else "restart"
    if isinstance(action, Wedge):
        return "freeze" if action.mode == "sigstop" else "wedge"
    if isinstance(action, EngineFault):
        return _FAULT_KIND.get(action.kind)
    if isinstance(action, Partition):
        return f"partition_{action.mode}"
    if isinstance(action, PatchWorker | AddWorker) and _mistake_of(action) is not None:
        return "api_mistake"
    if isinstance(action, PatchWorker) and action.refused is None:
        return "patch_worker"
    simple = {SlowStart: "slow_start", Crash: "crash", Die: "die", GracefulStop: "graceful_stop",
              LinkLatency: "link_latency", LinkReset: "link_reset", LinkBandwidth: "link_bandwidth",
              LinkFlap: "link_flap"}
    for cls, kind in simple.items():
        if isinstance(action, cls):
            return kind
    return None


def _mistake_of(action: PatchWorker | AddWorker) -> str | None:
    """The search's name of a worker API mistake the action makes (None: none it draws)."""
    call = "patch" if isinstance(action, PatchWorker) else "add"
    return next((name for name, (c, field, _) in API_MISTAKES.items()
                 if c == call and field == action.refused), None)


def _catching(bugs: tuple[str, ...]) -> list[Scenario]:
    if not bugs:
        return []
    from harness.scenario.files import load_scenarios

    return [s for s in load_scenarios() if set(bugs) & set(s.catches)]


def favoured_kinds(bugs: tuple[str, ...]) -> tuple[str, ...]:
    kinds: list[str] = []
    for s in _catching(bugs):
        kinds += [k for st in s.timeline if (k := search_kind(st.action)) is not None]
    return tuple(dict.fromkeys(k for k in kinds if k in KINDS))


def favours_breaker(bugs: tuple[str, ...]) -> bool:
    """Some scenario catching the bugs runs a circuit breaker (the bug lives in what it counts or when it
    re-admits)."""
    return any(s.router.circuit_breaker_failures is not None for s in _catching(bugs))


def favours_slow_detection(bugs: tuple[str, ...]) -> bool:
    """Some scenario catching the bugs takes more than one failed probe to take a worker out."""
    return any(s.router.failure_threshold > 1 for s in _catching(bugs))


def favours_no_identity(bugs: tuple[str, ...]) -> bool:
    """Some scenario catching the bugs pushes identity checks out of its run."""
    return any((s.router.identity_check_interval_s or 0.0) > SCALED_ROUTER.identity_check_interval_s
               for s in _catching(bugs))


def favours_short_abort(bugs: tuple[str, ...]) -> bool:
    """Some scenario catching the bugs gives the prefills a KV abort timeout shorter than the scaled one."""
    return any(s.engines.kv_abort_timeout_s < SCALED_ENGINES.kv_abort_timeout_s for s in _catching(bugs))


def _step_times(timeline: tuple[Step, ...]) -> dict[str, float]:
    """When each step fires, where its condition is a time (At, or After a step with a time)."""
    out: dict[str, float] = {}
    for st in timeline:
        w = st.when
        if isinstance(w, At):
            out[st.name] = w.t
        elif isinstance(w, After) and w.step in out:
            out[st.name] = out[w.step] + w.delay_s
    return out


def _heals(fault: Action, kind: str, heal: Action) -> bool:
    """Whether `heal` ends the fault `fault` (of search kind `kind`)."""
    if getattr(heal, "target", None) != fault.target:
        return False
    if isinstance(heal, Respawn):
        return kind in ("crash", "die", "graceful_stop")
    if isinstance(heal, HealLink):
        link = getattr(fault, "link", None)
        return link is not None and heal.link in (None, link)
    if isinstance(heal, Heal):
        if heal.kind is None:
            return True
        if isinstance(fault, Wedge):
            return heal.kind == "wedge"
        return isinstance(fault, EngineFault) and heal.kind == fault.kind
    return False


def _params(a: Action, kind: str) -> tuple[tuple[str, Any], ...]:
    """The fault's parameters as the search writes them (`harness.search.faults`); `kind`: the action's
    `search_kind`."""
    match a:
        case Wedge() if kind == "wedge":
            return (("surface", a.surface),)
        case EngineFault() if kind == "fail_requests":
            return (("count", int(a.params.get("count", 1))), ("status", int(a.params.get("status", 500))))
        case EngineFault() if kind == "latency_fault":
            return (("surface", str(a.params.get("surface", "all"))), ("ms", int(a.params.get("ms", 100))))
        case LinkLatency():
            return (("ms", a.latency_ms),)
        case LinkReset():
            return (("ms", a.timeout_ms),)
        case LinkBandwidth():
            return (("kb_s", a.rate_kb_s),)
        case LinkFlap():
            return (("cycles", a.cycles),)
        case PatchWorker() | AddWorker() if kind == "api_mistake":
            return (("mistake", _mistake_of(a)),)
        case PatchWorker():
            return (("priority", int(a.body.get("priority", 1))),)
        case GracefulStop():
            return (("long_grace", a.grace_s >= LONG_GRACE_S),)
    return ()


def _length(a: Action, kind: str, start: float, step: Step, timeline: tuple[Step, ...],
            times: dict[str, float]) -> float | None:
    if isinstance(a, Restart):
        return a.down_s
    if isinstance(a, SlowStart):
        return a.refuse_s
    if isinstance(a, LinkFlap):
        return (a.down_s + a.up_s) * a.cycles
    if isinstance(a, PatchWorker | AddWorker):
        return 0.0
    later = timeline[timeline.index(step) + 1:]
    for st in later:
        if st.name in times and _heals(a, kind, st.action):
            return times[st.name] - start
    return None  # never healed in the scenario: the search heals every fault, so it is no template


def template_of(s: Scenario) -> tuple[FaultSpec, ...]:
    """The scenario's faults as search faults, times from its first fault (engine names kept: the strategy
    maps each to an engine of the same role)."""
    times = _step_times(s.timeline)
    out: list[FaultSpec] = []
    for st in s.timeline:
        kind = search_kind(st.action)
        if kind is None or kind not in KINDS or st.name not in times:
            continue
        a = st.action
        length = _length(a, kind, times[st.name], st, s.timeline, times)
        if length is None:
            continue
        out.append(FaultSpec(kind, a.target, times[st.name], round(max(length, 0.0), 3),
                             getattr(a, "link", None), _params(a, kind)))
    if not out:
        return ()
    t0 = min(f.start_s for f in out)
    return tuple(FaultSpec(f.kind, f.target, round(f.start_s - t0, 3), f.length_s, f.link, f.params)
                 for f in out)


def fault_templates(bugs: tuple[str, ...]) -> tuple[tuple[FaultSpec, ...], ...]:
    return tuple(dict.fromkeys(t for s in _catching(bugs) if (t := template_of(s))))


def favoured_cells(bugs: tuple[str, ...]) -> tuple[tuple[str, Load, Breaker | None], ...]:
    """The catching scenarios' topologies, workloads and circuit breakers (as the search writes them)."""
    out: list[tuple[str, Load, Breaker | None]] = []
    for s in _catching(bugs):
        w, r = s.workload, s.router
        load = Load(concurrency=w.concurrency, rate_rps=w.rate_rps if w.mode == "open" else None,
                    stream_fraction=w.stream_fraction, chat_fraction=w.chat_fraction,
                    prompt_words=(w.prompt_words[0], w.prompt_words[1]), max_tokens=w.max_tokens)
        breaker = (None if r.circuit_breaker_failures is None
                   else Breaker(r.circuit_breaker_failures, r.circuit_breaker_open_s))
        out += [(t, load, breaker) for t in s.topologies]
    return tuple(dict.fromkeys(out))


def _fits(topology: str, max_side: int) -> bool:
    shape = parse_topology(topology)
    return max(shape.prefills, shape.decodes) <= max_side


def space_for(bugs: tuple[str, ...], max_side: int = 8, presets: tuple[str, ...] = ("scaled",),
              connector: str | None = None, transport: str | None = None) -> Space:
    connectors: tuple[str, ...] = CONNECTORS
    transports: tuple[str, ...] = TRANSPORTS
    for b in bugs:
        sw = SWITCHES[b]
        connectors = tuple(c for c in connectors if c in sw.connectors) or connectors
        transports = tuple(t for t in transports if t in sw.transports) or transports
    if connector is not None:
        connectors = (connector,)
    if transport is not None:
        transports = (transport,)
    return Space(max_side=max_side, connectors=connectors, transports=transports, presets=presets,
                 favoured=favoured_kinds(bugs), favour_breaker=favours_breaker(bugs),
                 favour_short_abort=favours_short_abort(bugs),
                 favour_slow_detection=favours_slow_detection(bugs), templates=fault_templates(bugs),
                 favour_no_identity=favours_no_identity(bugs),
                 cells=tuple(c for c in favoured_cells(bugs) if _fits(c[0], max_side)))
