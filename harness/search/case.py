"""A search case: one generated cell (topology, connector, transport, settings preset), its workload, router
knobs and fault schedule, and the scenario it becomes (`to_scenario`).

A case is written at scaled times (what real time runs); a settings preset scales it like any scenario, so
the same file replays in simulated time at either preset and in real time at scaled settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.scenario import EngineSettings, Expect, RouterSettings, Scenario, Workload
from harness.scenario.bugs import with_bugs
from harness.scenario.model import side_channel_restart_problems
from harness.scenario.presets import PRESETS, SCALED_ENGINES, SCALED_ROUTER
from harness.scenario.settings import whole_seconds
from harness.search.faults import NEW_ID_KINDS, FaultSpec, effective_windows, to_steps
from harness.topology import parse_topology

# The router answers a held leg with an error well before the client gives up (a shipped wedge scenario's
# own setting): a request held by a fault is an error, never a lost request, on a correct router.
REQUEST_TIMEOUT_S = 2.0
CLIENT_DEADLINE_S = 6.0
# The engines' KV transfer timeout: half the router's request timeout, so that a decode's pull that cannot
# succeed (a prefill gone, a stale id) ends as a timed-out transfer in the engine's records before the router
# gives the request up (with the scaled 2 s both end together, and the engine records only an abort). A
# scenario's own setting: under a preset it scales with the timeline (`apply_preset`).
TRANSFER_TIMEOUT_S = 1.0
# Load before the first fault can start: every worker has served some requests.
LEAD_S = 0.5
# An identity check interval longer than any run (the shipped reread_fails_at_promotion's): the router
# learns an engine id only at promotions. Drawn only where every id change is seen by the probes
# (`identity_checks_optional`), so that a correct router needs no identity check.
IDENTITY_OFF_S = 30.0
# A circuit breaker open period longer than any run: a worker it takes out is back before the run ends only if
# the router re-admits it when its probes see it recover (what breaker_no_readmit breaks).
LONG_OPEN_S = 30.0
# A prefill KV abort timeout far above a normal pull and under a stalled decode's wait (the shipped
# late_pull_after_kv_abort's): KV not pulled in time is given up while the run lasts.
SHORT_KV_ABORT_S = 0.3
# Faults after which no circuit breaker stays open on a correct router:
# - those every probe sees from their start to their heal (the engine refuses or is gone): the worker goes
#   NotReady, and its promotion when they heal re-admits it, closing a breaker their failed legs opened. A
#   graceful stop is not one (a draining worker keeps its breaker), nor a restart or a flapping serving link
#   (either may fall between two probes);
# - those that break a NIXL KV path at once (refused, reset): a decode's failed KV load is charged to no
#   worker.
#   Not a held or slowed KV path: the decode's wait may outlast the router's request timeout, which is
#   charged.
READMIT_KINDS = ("crash", "die")
KV_PATH_LINKS = ("side_channel", "bootstrap")


def never_leaves_breaker_open(f: FaultSpec, connector: str) -> bool:
    if f.kind in READMIT_KINDS or (f.kind == "partition_down" and f.link == "serve"):
        return True
    # NIXL only: a Mooncake decode whose pull breaks waits out its transfer timeout (the router's request
    # timeout may come first, and is charged).
    return (connector == "nixl" and f.link in KV_PATH_LINKS
            and f.kind in ("partition_down", "link_reset", "link_flap"))


# A restart at least this long is seen by a probe at the scaled settings (0.3 s apart, one failure marks a
# worker down); a shorter one may fall between two probes. Each further failed probe it takes lengthens it.
UNSEEN_RESTART_S = 1.0
RESTART_KINDS = ("restart", "process_restart", "slow_start")


# How soon after a short restart a probe outage of the engine must begin for its promotion to re-read the new
# id well within the handoffs' grace (the shipped reread_fails_at_promotion slows health 0.3 s after one).
COVER_S = 0.5


def _probe_outage(f: FaultSpec) -> bool:
    """A fault that fails every probe of its engine for long enough to take it down (at one failed probe)."""
    if f.length_s < UNSEEN_RESTART_S:
        return False
    if f.kind in ("crash", "die", "graceful_stop", "freeze") or f.kind in RESTART_KINDS:
        return True
    if f.link == "serve" and f.kind in ("partition_down", "partition_timeout"):
        return True
    surface = f.param.get("surface")
    if f.kind == "wedge":
        return surface in ("all", "health")
    # Slower than any preset's probe timeout (scaled 0.5 s, production 5 s).
    return f.kind == "latency_fault" and surface in ("all", "health") and int(f.param.get("ms", 0)) > 5000


def identity_checks_optional(faults: tuple[FaultSpec, ...], failure_threshold: int) -> bool:
    """Every engine id change of the schedule is seen by the probes (a promotion re-reads the id), with one
    failed probe taking a worker down (a crash's respawn takes 0.8 s or more): a restart long enough, or one
    a probe outage of its engine follows at once. Not where an engine whose id changes is also made to report
    none (`no_engine_id`): the promotion's read may meet it, and a complete read without an id is kept as
    final (DESIGN §2), so only an identity check brings the new id."""
    if failure_threshold != 1:
        return False
    renewed = {f.target for f in faults if f.kind in NEW_ID_KINDS}
    if any(f.kind == "no_engine_id" and f.target in renewed for f in faults):
        return False
    return all(
        f.length_s >= UNSEEN_RESTART_S or any(
            o.target == f.target and _probe_outage(o) and f.end_s <= o.start_s <= f.end_s + COVER_S
            for o in faults)
        for f in faults if f.kind in RESTART_KINDS)


def readmit_only(faults: tuple[FaultSpec, ...], connector: str) -> bool:
    """A long breaker open period is safe for this schedule (`never_leaves_breaker_open`)."""
    return all(never_leaves_breaker_open(f, connector) for f in faults)


@dataclass(frozen=True)
class Load:
    """The client traffic: closed loop (`concurrency` clients) or open loop (`rate_rps`)."""

    concurrency: int = 1
    rate_rps: float | None = None
    stream_fraction: float = 0.0
    chat_fraction: float = 0.0
    prompt_words: tuple[int, int] = (2, 8)
    max_tokens: int = 1


@dataclass(frozen=True)
class Breaker:
    failures: int
    open_s: float


@dataclass(frozen=True)
class SearchCase:
    topology: str = "1p1d"
    connector: str = "mooncake"
    transport: str = "http"
    settings: str = "scaled"
    load: Load = field(default_factory=Load)
    breaker: Breaker | None = None
    faults: tuple[FaultSpec, ...] = ()
    run_seed: int = 0
    # Extra load after the recovery tail (a drawn number; 0 is the simplest).
    extra_s: float = 0.0
    # The prefills' KV abort timeout (None: the scaled default).
    kv_abort_s: float | None = None
    # Failed probes that take a worker out (the scaled 1, or a few, as production's 3): with more, the router
    # keeps picking a worker that refuses its legs for a while, and must retry them elsewhere.
    failure_threshold: int = 1
    # Identity checks on (every scaled second) or pushed out of the run (IDENTITY_OFF_S).
    identity_checks: bool = True
    # Good probes that bring a worker back (the scaled 1, or 2: an off-by-one shows only above 1).
    success_threshold: int = 1
    # The share of requests carrying a client's mistake (`Workload.mistake_fraction`).
    mistake_fraction: float = 0.0
    # gRPC: the router is not told the workers' connector and learns it from GetServerInfo
    # (`RouterSettings.tell_connector=False`).
    learn_connector: bool = False
    # The share of chat requests capped with max_completion_tokens (`Workload.completion_tokens_fraction`).
    completion_tokens_fraction: float = 0.0
    # The shares of requests with a stop string, and with an answer that end of sequence ends at once
    # (`Workload.stop_fraction`, `Workload.eos_fraction`): what a prefill leg must not stop short on.
    stop_fraction: float = 0.0
    eos_fraction: float = 0.0
    # The router takes its probe interval and timeout in whole seconds (a gateway's flags): the bounds
    # allow for the rounding. Set by the space searched, never drawn.
    whole_second_probes: bool = False

    @property
    def engines(self) -> list[str]:
        return parse_topology(self.topology).engine_names()

    @property
    def last_heal_s(self) -> float:
        """When the last fault is healed, as the timeline carries the schedule out."""
        return max((end for _, end in effective_windows(self.faults)), default=0.0)

    def size(self) -> dict[str, float]:
        """What shrinking minimises, as numbers for the summary."""
        shape = parse_topology(self.topology)
        return {
            "faults": len(self.faults),
            "engines": shape.prefills + shape.decodes,
            "duration_s": round(duration_s(self), 3),
            "concurrency": self.load.concurrency,
        }


def shifted(case: SearchCase, by_s: float) -> SearchCase:
    """The case with its whole fault schedule `by_s` seconds later (the load and the probes as they were)."""
    return replace(case, faults=tuple(replace(f, start_s=round(f.start_s + by_s, 3)) for f in case.faults))


def recovery_bound_s(settings: str, breaker: Breaker | None, identity_checks: bool = True,
                     success_threshold: int | None = None, whole_second_probes: bool = False) -> float:
    """Heal -> first correct handoff through the healed engine on a correct router, in scaled seconds: one
    probe interval to notice, the promotion (success threshold probes), a probe timeout for a probe caught
    by the fault, the id re-read (a probe timeout) and an identity check (when they are on: off, every id
    change is seen by the probes), then one KV transfer timeout and an open circuit breaker's time. Computed
    at the preset's own settings (divided by its time scale, as its times are) and never under 3 s, the
    shipped scenarios' own bound. `whole_second_probes`: the router rounds its probe interval and timeout up
    to whole seconds, and is judged by the times it runs with."""
    p = PRESETS[settings]
    router = {**{f: getattr(SCALED_ROUTER, f) for f in (
        "health_interval_s", "health_timeout_s", "success_threshold", "identity_check_interval_s")},
        **p.router}
    if whole_second_probes:
        for f in ("health_interval_s", "health_timeout_s"):
            router[f] = float(whole_seconds(router[f]))
    if success_threshold is not None:
        # A case's own threshold (a count: the preset keeps it, as it keeps a scenario's).
        router["success_threshold"] = success_threshold
    k = p.time_scale
    secs = ((router["success_threshold"] + 1) * router["health_interval_s"] + 2 * router["health_timeout_s"]
            + ((router["identity_check_interval_s"] or 0.0) if identity_checks else 0.0)) / k
    # The case's own transfer timeout scales with the timeline: the same in scaled seconds at any preset.
    secs += TRANSFER_TIMEOUT_S
    # A long open period is drawn only for schedules of faults the probes see (`readmit_only`): the worker's
    # promotion closes its breaker, so the period never delays recovery on a correct router.
    held_out = breaker.open_s if breaker is not None and breaker.open_s < LONG_OPEN_S else 0.0
    return max(3.0, secs) + held_out


def tail_s(case: SearchCase) -> float:
    """Load kept after the last heal: the recovery bound and a second to see it."""
    return bound_of(case) + 1.0


def bound_of(case: SearchCase) -> float:
    return recovery_bound_s(case.settings, case.breaker, case.identity_checks, case.success_threshold,
                            case.whole_second_probes)


def probe_times_s(case: SearchCase) -> tuple[float, float]:
    """(probe interval, probe timeout) in scaled seconds, as the router runs them."""
    interval, timeout = SCALED_ROUTER.health_interval_s, SCALED_ROUTER.health_timeout_s
    if case.whole_second_probes:
        return float(whole_seconds(interval)), float(whole_seconds(timeout))
    return interval, timeout


def duration_s(case: SearchCase) -> float:
    return round(max(case.last_heal_s, LEAD_S) + tail_s(case) + case.extra_s, 3)


def workload(case: SearchCase) -> Workload:
    ld = case.load
    base = Workload(
        mode="closed" if ld.rate_rps is None else "open",
        concurrency=ld.concurrency,
        rate_rps=ld.rate_rps if ld.rate_rps is not None else 20.0,
        duration_s=duration_s(case),
        stream_fraction=ld.stream_fraction,
        chat_fraction=ld.chat_fraction,
        prompt_words=ld.prompt_words,
        max_tokens=ld.max_tokens,
        deadline_s=CLIENT_DEADLINE_S,
        mistake_fraction=case.mistake_fraction,
        completion_tokens_fraction=case.completion_tokens_fraction,
        stop_fraction=case.stop_fraction,
        eos_fraction=case.eos_fraction,
    )
    return base


def router_settings(case: SearchCase) -> RouterSettings:
    r = replace(SCALED_ROUTER, request_timeout_s=REQUEST_TIMEOUT_S, failure_threshold=case.failure_threshold,
                success_threshold=case.success_threshold)
    if not case.identity_checks:
        r = replace(r, identity_check_interval_s=IDENTITY_OFF_S)
    if case.learn_connector:
        r = replace(r, tell_connector=False)
    if case.breaker is not None:
        r = replace(r, circuit_breaker_failures=case.breaker.failures,
                    circuit_breaker_open_s=case.breaker.open_s)
    return r


def engine_settings(case: SearchCase) -> EngineSettings:
    engines = replace(SCALED_ENGINES, transfer_timeout_s=TRANSFER_TIMEOUT_S)
    if case.kv_abort_s is None:
        return engines
    return replace(engines, kv_abort_timeout_s=case.kv_abort_s)


def to_scenario(case: SearchCase, name: str, expect: tuple[Expect, ...], bugs: tuple[str, ...] = (),
                description: str = "") -> Scenario:
    """The case as a scenario of exactly its own cell, with the bug switches on."""
    s = Scenario(
        name=name,
        description=description or f"pdchaos search case: {len(case.faults)} fault(s) on {case.topology}",
        topologies=(case.topology,),
        connectors=(case.connector,),
        transports=(case.transport,),
        router=router_settings(case),
        engines=engine_settings(case),
        workload=workload(case),
        timeline=to_steps(case.faults),
        expect=expect,
        catches=tuple(bugs),
        tags=("search",),
    )
    if side_channel_restart_problems(s):
        s = replace(s, worlds=("sim",), world_notes={"real": SIDE_CHANNEL_RESTART_NOTE})
    return with_bugs(s, bugs) if bugs else s


SIDE_CHANNEL_RESTART_NOTE = ("a side_channel link fault and a restart of the same Mooncake prefill: the real "
                             "world's link proxy cannot follow the prefill's new side-channel port")
