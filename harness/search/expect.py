"""The expectations of a generated case: invariants a correct router keeps under any schedule the strategies
draw, each included only where its own conditions hold.

- `nothing_lost`, `output`, `legs_sequenced`: always. The router's request timeout (2 s) is well inside the
  client's deadline (6 s), so a held request ends in an error, never in a lost one; wrong KV is never
  excusable; a decode leg never runs for a request no prefill computed.
- `handoff`: stale ids, recomputes and failed pulls are excused from each fault's start until the recovery
  bound after its heal (the router cannot know sooner); wrong KV never.
- `no_local_compute`: a decode computes a prompt itself only within that bound of a fault that changes an
  engine id (the router may have no id to mint for a moment), never otherwise.
- `transfer_timeout`: only when no fault may hold a request (wedge, freeze, added latency, a timeout
  partition, a bandwidth cap): those make a request legitimately slow.
- `recovery`: for each fault healed with no other fault anywhere until the recovery bound after its heal:
  the worker is Ready and hands off correctly within the bound.
- `reported_engine_id` (Mooncake): every id change on a prefill is shown by the router within the recovery
  bound, when nothing else happens to that prefill meanwhile.
- `prompt_503`: a sole prefill or decode taken down (crash, death, graceful stop, refused serving link)
  longer than the router's detection, with no other fault around: requests from the router's notice (or
  the detection bound) to the heal get a prompt 503 (or a success).
- `probe_schedule`: wedges and freezes that overlap no fault on another engine that can hold a probe: every
  worker keeps being probed on schedule.
- `legs_once`: always. A correct router runs a leg again only where its engine never saw it (a refused
  connection), so no request reaches one role's engines twice whatever the schedule.
- `availability` (retries): a prefill cut off (crash, refused or flapping serving link) while another prefill
  serves, with no other fault near: every request sent meanwhile succeeds (a refused leg is retried on the
  other prefill); requests on the wire at a cut are set apart, as in the shipped prefill_link_partitioned.
- `availability` (after): from the recovery bound after the last heal (a second for a fault on a KV path
  alone, which no correct router charges to a worker) at least 95% of the requests succeed.
- `availability` (ejection): a generate-only hang (probes still pass) on one of several engines of a role,
  with a circuit breaker that its first request timeouts open and no other fault near, lasting well past a
  request timeout: the router takes the hung engine out on its timeouts, so 85% of the requests of the
  window succeed (measured: 97% or more; one that keeps sending it requests fails a third or more).
- `latency`: a wedge or freeze with no other fault near: requests that succeed meanwhile took at most a
  request timeout (plus a margin): a held request never holds up another one.
- `balance`: a role of two or more engines that no fault touches, without a circuit breaker: round robin
  spreads its legs within 50% of the mean.
- `metadata_reads`: an engine id taken away (`no_engine_id`) on a Mooncake prefill with no other fault on it
  from then on: reads of it stay within one per identity check interval (plus two), never one per probe.
- A router pause (`pause_router`) holds every request and probe: it counts as a fault on every engine.
- `worker_api`: a mistaken worker API call (`api_mistake`) is refused with a 4xx naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.checkers import CONTRACT_CHECKS
from harness.scenario import Expect
from harness.scenario.actions import ROUTER
from harness.search.case import (
    KV_PATH_LINKS,
    REQUEST_TIMEOUT_S,
    UNSEEN_RESTART_S,
    SearchCase,
    bound_of,
    duration_s,
    probe_times_s,
)
from harness.search.faults import (
    DOWN_KINDS,
    HOLDING_KINDS,
    NEW_ID_KINDS,
    FaultSpec,
    effective_windows,
    step_name,
    stop_grace_s,
)
from harness.topology import parse_topology

ALWAYS = ("nothing_lost", "output", "legs_sequenced", "legs_once", *CONTRACT_CHECKS)
# History kinds of the faults that give an engine a new id (a respawn ends a crash, death or stop).
ID_CHANGE_HISTORY_KINDS = ("restart", "slow_start", "crash", "die", "graceful_stop", "respawn")
# Margin on every window: real time carries a schedule out later than simulated time does (processes take
# longer to spawn), and a fault's effects outlive its records by a few probes.
SLACK_S = 1.0


@dataclass(frozen=True)
class Window:
    """A fault as carried out: when it was applied and healed (`faults.effective_windows`)."""

    fault: FaultSpec
    start: float
    end: float

    def overlaps(self, start: float, end: float) -> bool:
        return self.start <= end + SLACK_S and self.end + SLACK_S >= start


def windows(faults: Sequence[FaultSpec]) -> list[Window]:
    return [Window(f, a, b) for f, (a, b) in zip(faults, effective_windows(faults), strict=True)]


def isolated_after(i: int, ws: Sequence[Window], window_s: float, same_engine_only: bool = False) -> bool:
    """No other fault (on the same engine only, when asked) is on from fault i's heal until `window_s`
    after it."""
    return not _near(i, ws, ws[i].end, ws[i].end + window_s, same_engine_only)


def _alone(i: int, ws: Sequence[Window], margin_s: float) -> bool:
    return not _near(i, ws, ws[i].start - margin_s, ws[i].end + margin_s)


def _holds_transfers(f: FaultSpec) -> bool:
    """Faults under which a correct router's request may legitimately take a transfer timeout: anything that
    holds an answer, and a cut, flapping or reset KV path (a Mooncake decode whose pull breaks waits out its
    transfer timeout)."""
    return f.kind in HOLDING_KINDS or (f.link in KV_PATH_LINKS
                                       and f.kind in ("partition_down", "link_flap", "link_reset"))


def _unseen_restart(f: FaultSpec, failure_threshold: int = 1) -> bool:
    """A restart shorter than UNSEEN_RESTART_S (longer, for each further failed probe it takes to take a
    worker out) may fall between two probes: only the identity check notices it, and requests meanwhile are
    minted the old id and wait out the transfer timeout on a correct router too (the shipped
    `prefill_restart_between_probes` judges it so)."""
    return f.kind in ("restart", "slow_start") and f.length_s < UNSEEN_RESTART_S * failure_threshold


def _fails_reads(f: FaultSpec) -> bool:
    """A fault that keeps the router from reading a new engine id: the read fails, hangs or has no id."""
    if f.kind in ("fail_server_info", "no_engine_id"):
        return True
    surfaces = ("all", "metadata", "server_info")
    return f.kind in ("wedge", "latency_fault") and f.param.get("surface") in surfaces


def _id_kept_stale(faults: Sequence[FaultSpec]) -> bool:
    """An engine whose id changes while (or before) its id cannot be read: a correct router keeps minting the
    old id until a read succeeds, and requests meanwhile wait out the transfer timeout."""
    changed = {f.target for f in faults if f.kind in NEW_ID_KINDS}
    return any(_fails_reads(f) and f.target in changed for f in faults)


def expectations(case: SearchCase) -> tuple[Expect, ...]:
    faults = case.faults
    ws = windows(faults)
    bound = bound_of(case)
    out = [Expect(name) for name in ALWAYS]
    out.append(Expect("handoff", {"grace_s": bound}))
    out.append(Expect("no_local_compute", {"grace_s": bound, "excuse_kinds": list(ID_CHANGE_HISTORY_KINDS)}))
    if not any(_holds_transfers(f) or _unseen_restart(f, case.failure_threshold) for f in faults) and not (
            _id_kept_stale(faults)):
        out.append(Expect("transfer_timeout"))
    healed = [step_name(i, f) for i, f in enumerate(faults) if isolated_after(i, ws, bound)]
    if healed:
        out.append(Expect("recovery", {"max_recovery_s": bound, "faults": healed, "require_ready": False}))
    if case.connector == "mooncake":
        changes = [i for i, f in enumerate(faults)
                   if f.kind in NEW_ID_KINDS and f.target.startswith("prefill")]
        if changes and all(isolated_after(i, ws, bound, same_engine_only=True) for i in changes):
            out.append(Expect("reported_engine_id", {"max_lag_s": bound}))
    # A correct router cannot answer 503 for a worker it has not taken out yet: an outage shorter than its
    # detection may pass unnoticed (requests meanwhile fail on the leg), and a longer one is judged from
    # the router's notice, or from the detection bound where no notice was seen.
    detect = _detection_s(case)
    outages = [
        step_name(i, f) for i, f in enumerate(faults)
        if f.kind in DOWN_KINDS and f.link in (None, "serve") and _role_size(case, f.target) == 1
        and _alone(i, ws, bound) and f.length_s > detect
    ]
    if outages:
        out.append(Expect("prompt_503", {"max_503_latency_s": 1.0, "faults": outages, "settle_s": detect}))
    wedges = [i for i, f in enumerate(faults) if f.kind in ("wedge", "freeze")]
    # A hold on the wedged engine itself only holds its own probes, each for a probe timeout at most (the
    # shipped metadata_wedged slows its health meanwhile); one on another engine may hold a probe slot too.
    if wedges and all(
        not any(j != i and o.fault.kind in HOLDING_KINDS and o.fault.target != ws[i].fault.target
                and o.overlaps(ws[i].start, ws[i].end)
                for j, o in enumerate(ws))
        for i in wedges
    ):
        out.append(Expect("probe_schedule", {"kinds": ["wedge"]}))
    out += _retry_availability(case, ws, bound)
    ejection = _ejection_availability(case, ws, bound)
    out += ejection
    out += _held_availability(case, ws, bound, [n for e in ejection for n in e.params["faults"]])
    out += _after_availability(case, ws, bound)
    out += _latency(case, ws, bound)
    out += _balance(case)
    out += _drain_handoff(case, ws)
    out += _metadata_reads(case, ws, bound)
    if any(f.kind == "api_mistake" for f in faults):
        out.append(Expect("worker_api"))
    return tuple(out)


def _near(i: int, ws: Sequence[Window], start: float, end: float, same_engine_only: bool = False) -> bool:
    """Some other fault (on the same engine only, when asked) is on within [start, end]."""
    mine = (ws[i].fault.target, ROUTER)
    return any(j != i and o.overlaps(start, end) and (not same_engine_only or o.fault.target in mine)
               for j, o in enumerate(ws))


def _role_size(case: SearchCase, target: str) -> int:
    shape = parse_topology(case.topology)
    return shape.prefills if target.startswith("prefill") else shape.decodes


def _retried(f: FaultSpec) -> bool:
    """A prefill outage whose legs are refused before anything is sent (the correct router retries them on
    another prefill): a crash, or a refused or flapping serving link. Not a death or a graceful stop: the
    dying or draining engine answers 503 itself, a leg that ran."""
    return f.target.startswith("prefill") and (
        f.kind == "crash" or (f.kind in ("partition_down", "link_flap") and f.link == "serve"))


def _retry_availability(case: SearchCase, ws: Sequence[Window], bound: float) -> list[Expect]:
    names = [step_name(i, w.fault) for i, w in enumerate(ws)
             if _retried(w.fault) and _role_size(case, w.fault.target) >= 2
             and _alone(i, ws, bound)]
    if not names:
        return []
    return [Expect("availability", {"before": None, "during": 1.0, "after": None, "faults": names,
                                    "exclude_in_flight_at_fault": True})]


# A hang must last this much past the router's request timeout for the ejection to show: the first request
# timeouts open the breaker, and the rest of the window runs on the other engines.
EJECTION_MARGIN_S = 2.0
EJECTION_AVAILABILITY = 0.85


HELD_AVAILABILITY = 0.3


def _held_availability(case: SearchCase, ws: Sequence[Window], bound: float,
                       judged: Sequence[str]) -> list[Expect]:
    """A hold on one of several engines of a role, with no other fault near: round robin sends the held
    engine one leg in K (fewer once probes or a breaker take it out), and the others serve theirs, so at
    least half the requests of the window succeed on a correct router; a router whose held requests stall
    the others serves almost none. 30%: a margin for the requests on the wire at the hold."""
    names = [step_name(i, w.fault) for i, w in enumerate(ws)
             if _holds_one_engine(w.fault) and _role_size(case, w.fault.target) >= 2
             and step_name(i, w.fault) not in judged
             and _alone(i, ws, bound)]
    if not names:
        return []
    return [Expect("availability", {"before": None, "during": HELD_AVAILABILITY, "after": None,
                                    "faults": names})]


def _ejection_availability(case: SearchCase, ws: Sequence[Window], bound: float) -> list[Expect]:
    """Closed-loop clients at least as many as the breaker's threshold: the first timeouts (one per client at
    most, all at about one request timeout in) open it at once; afterwards only one trial request per open
    period goes to the hung engine. Open loop keeps sending during the first timeout, so it is not judged."""
    b, ld = case.breaker, case.load
    if b is None or ld.rate_rps is not None or b.failures > ld.concurrency:
        return []
    names = [step_name(i, w.fault) for i, w in enumerate(ws)
             if w.fault.kind == "wedge" and w.fault.param.get("surface") == "generate"
             and _role_size(case, w.fault.target) >= 2
             and w.fault.length_s >= REQUEST_TIMEOUT_S + EJECTION_MARGIN_S
             and _alone(i, ws, bound)]
    if not names:
        return []
    return [Expect("availability", {"before": None, "during": EJECTION_AVAILABILITY, "after": None,
                                    "faults": names})]


def _kv_path(f: FaultSpec) -> bool:
    return f.link in KV_PATH_LINKS


def _after_availability(case: SearchCase, ws: Sequence[Window], bound: float) -> list[Expect]:
    """From the recovery bound after the last heal, every fault of the schedule is over and recovered from:
    requests sent then succeed."""
    if not ws:
        return []
    last = max(range(len(ws)), key=lambda i: (ws[i].end, i))
    w = ws[last]
    # A fault on a KV path alone leaves nothing to recover on a correct router: no worker is charged for the
    # path's failures and no id changes. Unless a breaker counts a Mooncake decode's wait for its broken
    # pull: the router's request timeout may end it first, and that is charged.
    quick = (_kv_path(w.fault) and (case.connector == "nixl" or case.breaker is None)
             and not _near(last, ws, w.start - bound, duration_s(case)))
    settle = SLACK_S if quick else bound
    return [Expect("availability", {"before": None, "during": None, "after": 0.95, "settle_s": settle,
                                    "faults": [step_name(last, w.fault)]})]


# Kinds that hold a request on one engine until the router's request timeout answers it.
def _holds_one_engine(f: FaultSpec) -> bool:
    return f.kind == "freeze" or (f.kind == "wedge" and f.param.get("surface") in ("all", "generate"))


# The slowest a request that no fault touches takes (the fakes answer in tens of milliseconds; no engine
# queues): a physical bound, like the shipped hung_decode_ejected's 0.6 s.
UNTOUCHED_LATENCY_S = 1.0


def _probes_see(f: FaultSpec) -> bool:
    """A hold the probes see too (a freeze, every surface wedged): the router takes the engine out."""
    return f.kind == "freeze" or (f.kind == "wedge" and f.param.get("surface") == "all")


def _detection_s(case: SearchCase) -> float:
    """How long a correct router may take to take out a worker whose probes all fail."""
    return case.failure_threshold * sum(probe_times_s(case))


def _latency(case: SearchCase, ws: Sequence[Window], bound: float) -> list[Expect]:
    """A hold the probes see, long enough that every request sent to the held engine before they did has
    ended with the request timeout before the heal (none is released by it to succeed late): a request that
    succeeds meanwhile went to another engine and took no longer than an untouched request. A router that
    holds everything behind the held requests makes those successes wait up to a request timeout."""
    detect = _detection_s(case)
    names = [step_name(i, w.fault) for i, w in enumerate(ws)
             if _probes_see(w.fault) and w.fault.length_s >= detect + REQUEST_TIMEOUT_S + SLACK_S
             and not _near(i, ws, w.start - bound, w.end + SLACK_S)]
    if not names:
        return []
    return [Expect("latency", {"max_latency_s": UNTOUCHED_LATENCY_S, "faults": names, "min_requests": 1})]


# A decode stall short enough that its parked legs pull well within the router's request timeout.
SHORT_STALL_S = 1.0


def _drain_handoff(case: SearchCase, ws: Sequence[Window]) -> list[Expect]:
    """A graceful stop of a prefill finishes what it started: every pull of KV it computed before the stop
    succeeds, also for a decode stalled a moment (its generate surface wedged, legs parked) as long as the
    stop's grace outlasts the stall; only the respawn (a new engine id) may leave a handoff stale for a while.
    Judged where nothing else happens and the KV abort timeout is the long default (as the shipped
    prefill_graceful_stop)."""
    stops = [w for w in ws if w.fault.kind == "graceful_stop" and w.fault.target.startswith("prefill")]
    if not stops or case.kv_abort_s is not None:
        return []
    for w in ws:
        f = w.fault
        if f.kind == "graceful_stop" and f.target.startswith("prefill"):
            continue
        stall = (f.kind == "wedge" and f.param.get("surface") == "generate" and f.target.startswith("decode")
                 and f.length_s <= SHORT_STALL_S)
        # The grace must outlast every stall from each stop's start on, with a second to pull.
        if not stall or any(w.end + SLACK_S > s.start + stop_grace_s(s.fault) for s in stops):
            return []
    return [Expect("handoff_strict", {"excuse_kinds": ["respawn"], "grace_s": bound_of(case),
                                      "excuse_in_flight": False})]


def _balance(case: SearchCase) -> list[Expect]:
    """Roles untouched by the schedule, under round robin (the search's policy). Without a circuit breaker:
    one may legitimately take a worker out (a decode timed out on KV its prefill lost)."""
    if case.breaker is not None:
        return []
    shape = parse_topology(case.topology)
    roles = [role for role, n in (("prefill", shape.prefills), ("decode", shape.decodes))
             if n >= 2 and not any(f.target.startswith(role) for f in case.faults)]
    if not roles:
        return []
    return [Expect("balance", {"roles": roles, "max_skew": 0.5, "min_requests": 30})]


# Faults on the engine itself that a metadata_reads bound can count: each makes the router re-read the id at
# most once (at the promotion after it: the worker went NotReady, or restarted and is new). Others (failed or
# held metadata reads, a slow serving link) make a correct router retry the read on every probe.
OUTAGE_KINDS = ("restart", "process_restart", "slow_start", "crash", "die", "graceful_stop")


def _outages(f: FaultSpec) -> int | None:
    """Promotions (hence re-reads) the fault may cause; None: not countable."""
    if f.kind in OUTAGE_KINDS or (f.kind == "partition_down" and f.link == "serve"):
        return 1
    if f.kind == "link_flap" and f.link == "serve":
        return int(f.param.get("cycles", 2))
    if f.kind in ("latency_fault", "wedge") and f.param.get("surface") == "health":
        return 1
    return None


def _metadata_reads(case: SearchCase, ws: Sequence[Window], bound: float) -> list[Expect]:
    """From the fault on, a correct router re-reads the engine's id only at a promotion (the read without id
    is kept as final; identity checks are no re-reads): at most two per outage of the engine from then on
    (the read may meet the outage's end), plus two."""
    if case.connector != "mooncake":
        return []
    out = []
    end = duration_s(case)
    for i, w in enumerate(ws):
        f = w.fault
        if f.kind != "no_engine_id" or not f.target.startswith("prefill"):
            continue
        others = [o.fault for j, o in enumerate(ws)
                  if j != i and o.fault.target in (f.target, ROUTER) and o.overlaps(w.start - bound, end)]
        counts = [_outages(o) for o in others]
        if any(c is None for c in counts):
            continue
        outages = sum(c for c in counts if c is not None)
        out.append(Expect("metadata_reads", {"target": f.target, "from_fault": step_name(i, f),
                                             "max_reads": 2 * outages + 2}))
    return out
