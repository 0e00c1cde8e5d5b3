"""Hypothesis strategies for search cases: cells, settings presets, workloads, router knobs and fault
schedules.

Hypothesis shrinks the choice sequence toward smaller integers, the first branch of `one_of` and shorter
lists, so each strategy is laid out so that simpler means smaller: the smallest topology, the first
connector/transport/preset, one closed-loop client, short prompts, no circuit breaker, fewer fault groups,
a single fault before a repeated one, a cluster or a swizzle-clog, short faults that start early. Times are
drawn as integer tenths of a second: a float shrinks badly, and a tenth is finer than any bound judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from harness.scenario.actions import ROUTER, WEDGE_SURFACES
from harness.scenario.links import link_applies
from harness.search.case import (
    LEAD_S,
    LONG_OPEN_S,
    SHORT_KV_ABORT_S,
    Breaker,
    Load,
    SearchCase,
    identity_checks_optional,
    readmit_only,
)
from harness.search.faults import (
    API_MISTAKES,
    KINDS,
    LINK_KINDS,
    ROUTER_KINDS,
    SELF_HEALING,
    FaultSpec,
    without_conflicts,
)
from harness.topology import CONNECTORS, TRANSPORTS

# Smallest first: the shrinker walks toward the front. 1p1d..8p8d, biased to few engines by the draw below.
SMALL_SIDES = (1, 2)
LINKS_BY_PREFERENCE = ("serve", "side_channel", "bootstrap")
# Fault starts: from LEAD_S to LEAD_S + this (tenths of a second); lengths up to this.
START_SPAN_TENTHS = 60
MAX_LENGTH_TENTHS = 30
# Kinds that need some length to mean anything (a crash that is respawned at once is a restart).
MIN_LENGTH_TENTHS = {"slow_start": 1, "crash": 3, "die": 4, "graceful_stop": 4, "freeze": 2,
                     "link_flap": 2}
# Every fault healed by a step lasts at least half a second: a shorter one is carried out too differently in
# real time (process and proxy latencies of tens of milliseconds) for a shrunk failure to replay there, as
# measured (a 0.1 s KV-path reset opened a breaker in simulation and none in real time).
MIN_HEALED_TENTHS = 5


@dataclass(frozen=True)
class Space:
    """What a search may draw."""

    max_side: int = 8
    connectors: tuple[str, ...] = CONNECTORS
    transports: tuple[str, ...] = TRANSPORTS
    presets: tuple[str, ...] = ("scaled",)
    kinds: tuple[str, ...] = KINDS
    max_groups: int = 4
    # Kinds drawn first (a bias toward what the injected bugs need; the shrinker still prefers them).
    favoured: tuple[str, ...] = ()
    # Draw a circuit breaker / a short KV abort timeout first (the same bias, for router and engine settings
    # that the shipped scenarios catching the injected bugs set).
    favour_breaker: bool = False
    favour_short_abort: bool = False
    favour_slow_detection: bool = False
    favour_no_identity: bool = False
    # Fault groups drawn whole (`shipped`): the schedules of the shipped scenarios that catch the injected
    # bugs, start times from 0 and engine names standing for their role (`harness.search.bias`).
    templates: tuple[tuple[FaultSpec, ...], ...] = ()
    # (topology, load, breaker) of those scenarios: drawn as a whole half the time (their breaker kept only
    # where the schedule makes it safe, as any drawn one).
    cells: tuple[tuple[str, Load, Breaker | None], ...] = ()
    # The router searched takes its probe times in whole seconds (a gateway): each case says so, and its
    # bounds allow for it.
    whole_second_probes: bool = False

    def kind_order(self) -> tuple[str, ...]:
        allowed = [k for k in KINDS if k in self.kinds]
        first = [k for k in self.favoured if k in allowed]
        return tuple(dict.fromkeys([*first, *allowed]))


def kinds(space: Space) -> st.SearchStrategy[str]:
    """A fault kind: with favoured kinds, half the draws pick among them (a uniform draw over every kind would
    give the few that matter a few percent each); the shrinker still walks toward the first of them."""
    order = space.kind_order()
    first = [k for k in space.favoured if k in order]
    if not first:
        return st.sampled_from(order)
    return st.one_of(st.sampled_from(first), st.sampled_from(order))


def sides(space: Space) -> st.SearchStrategy[int]:
    big = st.integers(1, space.max_side)
    return st.one_of(st.sampled_from([s for s in SMALL_SIDES if s <= space.max_side]), big)


@st.composite
def topologies(draw: Any, space: Space) -> str:
    return f"{draw(sides(space))}p{draw(sides(space))}d"


def loads() -> st.SearchStrategy[Load]:
    return st.builds(
        Load,
        concurrency=st.integers(1, 6),
        rate_rps=st.one_of(st.none(), st.sampled_from([5.0, 20.0, 50.0])),
        stream_fraction=st.sampled_from([0.0, 0.3, 1.0]),
        chat_fraction=st.sampled_from([0.0, 0.2]),
        prompt_words=st.sampled_from([(2, 8), (6, 30), (40, 200)]),
        max_tokens=st.integers(1, 16),
    )


# The longest open period drawn short (a long one is LONG_OPEN_S).
MAX_OPEN_S = 2.0


def breakers(space: Space | None = None) -> st.SearchStrategy[Breaker | None]:
    # A long open period (LONG_OPEN_S) outlasts any run: only a re-admission at promotion brings the worker
    # back before it ends (`search_cases` keeps it only for schedules whose faults the probes see).
    # No breaker first, even where the catching scenarios run one: the branches are drawn alike either way,
    # and the shrinker then drops a breaker the failure does not need. One that only opens on the first few
    # failures makes a case hang on the order those failures come in, which real time does not keep.
    some = st.builds(Breaker, failures=st.integers(2, 5),
                     open_s=st.sampled_from([0.5, 1.0, MAX_OPEN_S, LONG_OPEN_S]))
    if space is not None and space.favour_breaker:
        # Two draws in three have one.
        return st.one_of(st.none(), some, some)
    return st.one_of(st.none(), some)


def kv_aborts(space: Space) -> st.SearchStrategy[float | None]:
    """The prefills' KV abort timeout: the scaled default (None) or short, so that KV a stalled decode has not
    pulled yet is given up while the run lasts (the shipped late_pull_after_kv_abort)."""
    if space.favour_short_abort:
        return st.one_of(st.just(SHORT_KV_ABORT_S), st.none())
    return st.one_of(st.none(), st.just(SHORT_KV_ABORT_S))


def _links_of(engine: str, connector: str) -> list[str]:
    return [ln for ln in LINKS_BY_PREFERENCE if link_applies(engine, ln, connector) is None]


@st.composite
def targets(draw: Any, engines: list[str]) -> str:
    return draw(st.sampled_from(engines))


@st.composite
def params(draw: Any, kind: str) -> tuple[tuple[str, Any], ...]:
    if kind == "wedge":
        return (("surface", draw(st.sampled_from(WEDGE_SURFACES))),)
    if kind == "fail_requests":
        return (("count", draw(st.integers(1, 10))), ("status", draw(st.sampled_from([500, 503]))))
    if kind == "latency_fault":
        return (("surface", draw(st.sampled_from(WEDGE_SURFACES))),
                ("ms", draw(st.sampled_from([50, 200, 800, 3000]))))
    if kind == "link_latency":
        return (("ms", draw(st.sampled_from([50, 200, 1000]))),)
    if kind == "link_reset":
        return (("ms", draw(st.sampled_from([0, 50]))),)
    if kind == "link_bandwidth":
        return (("kb_s", draw(st.sampled_from([64, 8, 1]))),)
    if kind == "link_flap":
        return (("cycles", draw(st.integers(1, 3))),)
    if kind == "patch_worker":
        return (("priority", draw(st.integers(1, 9))),)
    if kind == "api_mistake":
        return (("mistake", draw(st.sampled_from(sorted(API_MISTAKES)))),)
    if kind == "graceful_stop":
        return (("long_grace", draw(st.booleans())),)
    return ()


# Kinds that hold the timeline for their length (a restart's down time): kept short, or one restart would
# push every later fault of the schedule back. An API call is instant. A wedge and a missing engine id may
# last longer: a hung engine is only told apart from a slow one after a few request timeouts (outlier
# ejection), a request is only lost once held past the client's deadline, and re-reads on every probe only
# outnumber the identity checks over a few seconds.
# A restart may reach 1.5 s: one of at least a second (`case.UNSEEN_RESTART_S`) is seen by the probes, what a
# promotion's re-read needs without a second fault to force it.
MAX_LENGTH_TENTHS_BY_KIND = {"restart": 15, "process_restart": 15, "slow_start": 15, "patch_worker": 0,
                             "api_mistake": 0, "wedge": 70, "freeze": 50, "no_engine_id": 60,
                             "pause_router": 15}
# A router pause lasts at least this: a shorter one is within a real scheduler's own hiccups.
MIN_PAUSE_TENTHS = 2


def _length(kind: str, tenths: int) -> float:
    tenths = min(tenths, MAX_LENGTH_TENTHS_BY_KIND.get(kind, MAX_LENGTH_TENTHS))
    # A fault healed by a later step lasts at least MIN_HEALED_TENTHS (its heal comes after it, and long
    # enough for real time to replay it).
    floor = 0 if kind in SELF_HEALING else max(MIN_HEALED_TENTHS, MIN_LENGTH_TENTHS.get(kind, 0))
    if kind in ROUTER_KINDS:
        floor = MIN_PAUSE_TENTHS
    return max(tenths, floor) / 10


@st.composite
def one_fault(draw: Any, space: Space, engines: list[str], connector: str, start_tenths: int | None = None,
              kind: str | None = None, target: str | None = None) -> FaultSpec | None:
    """A fault (None when the drawn kind has no link on the drawn engine under this connector)."""
    kind = kind or draw(kinds(space))
    if kind in ROUTER_KINDS:
        target = ROUTER
    elif target in (None, ROUTER):  # a fault after a router pause goes to an engine
        target = draw(targets(engines))
    link = None
    if kind in LINK_KINDS:
        links = _links_of(target, connector)
        if kind == "link_reset":
            # A reset needs data on the way: the serve link and the KV side channel carry answers.
            links = [ln for ln in links if ln != "bootstrap"] or links
        link = draw(st.sampled_from(links))
    if start_tenths is None:
        start_tenths = draw(st.integers(0, START_SPAN_TENTHS))
    most = max(MAX_LENGTH_TENTHS, MAX_LENGTH_TENTHS_BY_KIND.get(kind, 0))
    length = _length(kind, draw(st.integers(0, most)))
    return FaultSpec(kind, target, round(LEAD_S + start_tenths / 10, 3), length, link, draw(params(kind)))


@st.composite
def repeated(draw: Any, space: Space, engines: list[str], connector: str) -> list[FaultSpec]:
    """The same fault on the same engine (or link) again and again: a restart loop, a flapping outage."""
    first = draw(one_fault(space, engines, connector))
    times = draw(st.integers(2, 4))
    gap = draw(st.integers(3, 15)) / 10
    out = [first]
    for i in range(1, times):
        start = round(first.start_s + i * (first.length_s + gap), 3)
        out.append(FaultSpec(first.kind, first.target, start, first.length_s, first.link, first.params))
    return out


@st.composite
def cluster(draw: Any, space: Space, engines: list[str], connector: str) -> list[FaultSpec]:
    """Several faults starting within half a second of each other, anywhere: correlated failures."""
    center = draw(st.integers(0, START_SPAN_TENTHS))
    n = draw(st.integers(2, 4))
    out = []
    for _ in range(n):
        offset = draw(st.integers(0, 5))
        out.append(draw(one_fault(space, engines, connector, start_tenths=center + offset)))
    return out


@st.composite
def swizzle_clog(draw: Any, space: Space, engines: list[str], connector: str) -> list[FaultSpec]:
    """FoundationDB's swizzle-clog: cut a random subset of links one by one, then restore them in a random
    order."""
    mode = draw(st.sampled_from([k for k in ("partition_down", "partition_timeout") if k in space.kinds]
                                or ["partition_down"]))
    every = [(e, ln) for e in engines for ln in _links_of(e, connector)]
    chosen = draw(st.lists(st.sampled_from(every), min_size=1, max_size=min(4, len(every)), unique=True))
    start = LEAD_S + draw(st.integers(0, START_SPAN_TENTHS)) / 10
    step = draw(st.integers(1, 5)) / 10
    hold = draw(st.integers(MIN_HEALED_TENTHS, 15)) / 10
    cut_at = [round(start + i * step, 3) for i in range(len(chosen))]
    restore_order = draw(st.permutations(range(len(chosen))))
    last_cut = cut_at[-1]
    out = []
    for rank, i in enumerate(restore_order):
        engine, link = chosen[i]
        end = round(last_cut + hold + rank * step, 3)
        out.append(FaultSpec(mode, engine, cut_at[i], round(end - cut_at[i], 3), link))
    return out


@st.composite
def shipped(draw: Any, space: Space, engines: list[str], connector: str) -> list[FaultSpec]:
    """A template's faults at a drawn time, each engine name of the template mapped to a drawn engine of
    the same role (the same name to the same engine); faults on a link the cell lacks are left out."""
    template = draw(st.sampled_from(space.templates))
    chosen: dict[str, str] = {}
    for name in sorted({f.target for f in template}):
        role = name.split("-", 1)[0]
        chosen[name] = draw(st.sampled_from([e for e in engines if e.startswith(role)] or engines))
    base = LEAD_S + draw(st.integers(0, START_SPAN_TENTHS)) / 10
    out = []
    for f in template:
        # Each fault kept three times in four; 0 (the shrinker's way) leaves it out, so a failure found with
        # a template shrinks to the part of it that matters.
        if draw(st.integers(0, 3)) == 0:
            continue
        if f.link is None or f.link in _links_of(chosen[f.target], connector):
            out.append(FaultSpec(f.kind, chosen[f.target], round(base + f.start_s, 3), f.length_s, f.link,
                                 f.params))
    return out


@st.composite
def followed(draw: Any, space: Space, engines: list[str], connector: str) -> list[FaultSpec]:
    """A fault, then another on the same engine as it ends (within 0.3 s): the engine comes back into a
    second failure (a restarted prefill whose metadata reads fail, a respawn into a wedge)."""
    first = draw(one_fault(space, engines, connector))
    if first is None:
        return []
    start = round(first.end_s - LEAD_S + draw(st.integers(0, 3)) / 10, 3)
    second = draw(one_fault(space, engines, connector, start_tenths=round(start * 10), target=first.target))
    return [first] if second is None else [first, second]


@st.composite
def fault_groups(draw: Any, space: Space, engines: list[str], connector: str) -> list[FaultSpec]:
    single = one_fault(space, engines, connector).map(lambda f: [f] if f is not None else [])
    kinds_of_group = [single, repeated(space, engines, connector), cluster(space, engines, connector),
                      followed(space, engines, connector), swizzle_clog(space, engines, connector)]
    # Last: the shrinker walks toward the first branches, a single random fault before a template.
    if space.templates:
        # Twice: a third of the groups (a uniform draw among the branches).
        kinds_of_group += [shipped(space, engines, connector)] * 2
    return draw(st.one_of(*kinds_of_group))


@st.composite
def schedules(draw: Any, space: Space, engines: list[str], connector: str) -> tuple[FaultSpec, ...]:
    """At least one fault; groups may overlap in time (on different engines and links). With templates, a
    third of the schedules are one template alone: the invariants a template's faults test are often judged
    only where nothing else happens (a graceful stop's drain, a wedge's probe schedule), which a template
    drawn among other groups seldom gives."""
    any_groups = st.lists(fault_groups(space, engines, connector), min_size=1, max_size=space.max_groups)
    if space.templates:
        alone = shipped(space, engines, connector).map(lambda g: [g])
        groups = draw(st.one_of(any_groups, any_groups, alone))
    else:
        groups = draw(any_groups)
    faults = without_conflicts(f for g in groups for f in g)
    return faults


# A share of the load with a client's mistake in it, when drawn (a tenth: the breaker sees some in a row).
MISTAKE_FRACTION = 0.1
# The share of chat requests capped with max_completion_tokens, when drawn.
COMPLETION_TOKENS_FRACTION = 0.5
# The shares of requests with a stop string, and with an answer empty by end of sequence, when drawn.
STOP_FRACTION = 0.3
EOS_FRACTION = 0.2


@st.composite
def search_cases(draw: Any, space: Space | None = None) -> SearchCase:
    space = space or Space()
    # A shipped cell (its topology, load and breaker) or a random one; random first, the shrinker's way.
    cell = draw(st.one_of(st.none(), st.sampled_from(space.cells))) if space.cells else None
    topology = cell[0] if cell is not None else draw(topologies(space))
    connector = draw(st.sampled_from(space.connectors))
    transport = draw(st.sampled_from(space.transports))
    preset = draw(st.sampled_from(space.presets))
    probe = SearchCase(topology=topology)
    faults = draw(schedules(space, probe.engines, connector))
    breaker = cell[2] if cell is not None else draw(breakers(space))
    if breaker is not None and breaker.open_s > MAX_OPEN_S:
        # A fault the probes may not see can open a breaker that nothing re-admits: a long open period would
        # then keep the worker out for the rest of the run on a correct router too (and one longer than the
        # drawn ones would make the recovery bound, hence the run, that much longer). Where every fault is
        # one a correct router re-admits after, a shipped cell's long period (5 s) becomes one longer than
        # the run: either way a worker a buggy router leaves out stays out, and the bound does not grow.
        long_ok = readmit_only(faults, connector)
        breaker = Breaker(breaker.failures, LONG_OPEN_S if long_ok else MAX_OPEN_S)
    load = cell[1] if cell is not None else draw(loads())
    run_seed = draw(st.integers(0, 1000))
    extra_s = draw(st.integers(0, 20)) / 10
    kv_abort_s = draw(kv_aborts(space))
    threshold = draw(st.sampled_from([3, 1] if space.favour_slow_detection else [1, 3]))
    identity = draw(st.sampled_from([False, True] if space.favour_no_identity else [True, False]))
    if not identity and not identity_checks_optional(faults, threshold):
        # An id change the probes may miss: only an identity check shows it to a correct router.
        identity = True
    # Drawn last: the draws above shrink as they always did.
    success = draw(st.sampled_from([1, 2]))
    mistakes = draw(st.sampled_from([0.0, MISTAKE_FRACTION]))
    # The router told each worker's connector, or (gRPC) left to learn it from GetServerInfo; and chat
    # requests capped as current OpenAI clients do. Drawn after the rest, so earlier draws shrink as before.
    learn = transport == "grpc" and draw(st.booleans())
    newer_cap = draw(st.sampled_from([0.0, COMPLETION_TOKENS_FRACTION]))
    # Answers that end early, a stop string or end of sequence: drawn last, for the same reason.
    stops = draw(st.sampled_from([0.0, STOP_FRACTION]))
    ends = draw(st.sampled_from([0.0, EOS_FRACTION]))
    return SearchCase(
        topology=topology,
        connector=connector,
        transport=transport,
        settings=preset,
        load=load,
        breaker=breaker,
        faults=faults,
        run_seed=run_seed,
        extra_s=extra_s,
        kv_abort_s=kv_abort_s,
        failure_threshold=threshold,
        identity_checks=identity,
        success_threshold=success,
        mistake_fraction=mistakes,
        learn_connector=learn,
        completion_tokens_fraction=newer_cap,
        stop_fraction=stops,
        eos_fraction=ends,
        whole_second_probes=space.whole_second_probes,
    )
