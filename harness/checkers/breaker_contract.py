"""Circuit breaker conformance, judged from the engines' legs and the client's answers for any router with a
breaker configured (`harness.contract.breaker_model`):
- a leg to a worker whose breaker surely kept it out (opened by its own failures, its open period not over)
  all the time from the client's request to the leg's arrival is a violation;
- a request refused with 503 before any leg, while a worker of every role was surely Ready and its breaker
  surely admitted requests all along, kept routable workers out.
A router that counts what it must not (a client's 4xx, a decode's failed KV load), opens early or late, keeps
a worker out past its open period or ignores its own breaker shows here.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from harness.checkers._common import cap, judged_from_engines
from harness.contract.breaker_model import (
    CLOSED,
    EITHER,
    FAILURE,
    INITIAL,
    NEUTRAL,
    SUCCESS,
    BreakerRules,
    BreakerStates,
    advance,
    hidden_failures,
    on_outcome,
    on_pick,
    readmitted,
    surely_admits,
    surely_refuses,
)
from harness.contract.evidence import REFUSED, EngineView, Leg
from harness.contract.reach import Window, leg_windows
from harness.contract.status_model import FAILED, NOT_READY, READY
from harness.history import History
from harness.verdict import Verdict

NAME = "breaker_contract"
_EPS = 1e-6
# A leg that ended this close to the router's request timeout may have been given up on, or answered.
_NEAR_TIMEOUT_S = 0.05


@dataclass(frozen=True)
class BreakerContractExpect:
    """`slack_s`: how far the router's view may lag the engines' (seconds, both sides of each moment)."""

    slack_s: float = 0.1


def outcome_of(leg: Leg, leg_timeout_s: float, transport: str) -> str:
    """How a leg the engine recorded counts against its worker, as the router saw it end."""
    if leg.ended is not None and abs(leg.ended - leg.at - leg_timeout_s) <= _NEAR_TIMEOUT_S:
        return EITHER
    if leg.ended is not None and leg.ended - leg.at > leg_timeout_s:
        return FAILURE  # the router gave up on it first
    if leg.kind == REFUSED and transport == "http" and leg.leg.get("stream"):
        # Refused after its 200 went out (an error chunk): a router relaying the stream as is sees a success.
        return EITHER
    if leg.kind == REFUSED:
        status = leg.status or 0
        if status == 499:
            return EITHER  # cut: the router's timeout (its failure) or the client gone (no verdict)
        if 400 <= status < 500:
            return NEUTRAL  # the client's mistake
        return FAILURE if status >= 500 else EITHER
    if leg.kind == "decode" and leg.outcome in ("failed", "timed_out"):
        return NEUTRAL  # its KV load failed: the prefill's or the path's failure, not the decode's
    return SUCCESS


def _requests_in_flight(view: EngineView, start: float, end: float) -> bool:
    history = view.history
    for req in history.request_list():
        done = req.completed_t if req.completed_t is not None else history.end_t
        if req.invoked_t is not None and req.invoked_t <= end and done >= start:
            return True
    return False


def router_end(leg: Leg, leg_timeout_s: float) -> float:
    """When the router saw the leg end: its answer, or its request timeout if that came first (a slow leg
    counts when the router gives up on it, not when the engine finally answers)."""
    if leg.ended is None:
        return leg.at
    return min(leg.ended, leg.at + leg_timeout_s)


class BreakerTimeline:
    """The states one worker's breaker may be in, as epochs (each holds from its start to the next one's)."""

    def __init__(self, starts: list[float], sets: list[BreakerStates], rules: BreakerRules) -> None:
        self.starts, self.sets, self.rules = starts, sets, rules

    def _spans(self, a: float, b: float) -> list[tuple[float, float, BreakerStates]]:
        i = max(0, bisect_right(self.starts, a) - 1)
        out = []
        for j in range(i, len(self.starts)):
            lo = max(a, self.starts[j])
            hi = min(b, self.starts[j + 1] - _EPS) if j + 1 < len(self.starts) else b
            if lo > b:
                break
            if lo <= hi:
                out.append((lo, hi, self.sets[j]))
        return out

    def refused_all_along(self, a: float, b: float) -> bool:
        """Surely kept out at every moment of [a, b] (an open period only runs out: each span's end)."""
        spans = self._spans(a, b)
        return bool(spans) and all(surely_refuses(states, hi, self.rules) for _, hi, states in spans)

    def kinds_in(self, a: float, b: float) -> set[str]:
        """Every state the breaker may have been in at some moment of [a, b]."""
        out: set[str] = set()
        for lo, hi, states in self._spans(a, b):
            for t in (lo, hi):
                out.update(s.kind for s in advance(states, t, self.rules))
        return out

    def admitted_all_along(self, a: float, b: float) -> bool:
        """Surely admitting at every moment of [a, b] (admission only comes with time: each span's start)."""
        spans = self._spans(a, b)
        return bool(spans) and all(surely_admits(states, lo, self.rules) for lo, _, states in spans)


def breaker_timeline(view: EngineView, engine: str, legs: list[Leg], rules: BreakerRules,
                     slack_s: float = BreakerContractExpect.slack_s) -> BreakerTimeline:
    """`slack_s`: how far the router's view may lag the engines' (a pick is placed no earlier than its
    request, less twice that)."""
    contract = view.contract
    history = view.history
    windows = leg_windows(view.history, engine, contract)
    events: list[tuple[float, int, str, object]] = []
    for w in windows:
        events.append((w.start, 0, "window", w))
    for leg in legs:
        events.append((leg.at, 1, "pick", leg))
        events.append((router_end(leg, contract.request_timeout_s), 2, "end", leg))
    if view.roles.get(engine) == "decode":
        # A request's decode is picked with its prefill, before the prefill leg: a half-open decode may give
        # its trial to a request whose prefill leg then fails or hangs, and keep it until that request ends,
        # with no leg any decode saw.
        seen = {leg.tag for leg in view.legs() if view.roles.get(leg.engine) == "decode"}
        with_legs = {leg.tag for leg in view.legs()}
        hiding = [w for e, role in view.roles.items() if role == "prefill"
                  for w in leg_windows(view.history, e, contract)]
        for req in view.history.request_list():
            if req.tag in seen or req.invoked_t is None:
                continue
            start, end = req.invoked_t, req.completed_t if req.completed_t is not None else view.history.end_t
            if req.tag not in with_legs and not any(w.start <= end and start <= w.end for w in hiding):
                continue  # no leg anywhere and none could hide: refused before any pick
            events.append((start, 1, "pick", None))
            events.append((end, 2, "unseen_end", None))
    status = view.timeline(engine)
    for prev, cur in zip(status.epochs, status.epochs[1:], strict=False):
        was = {s.status for s in prev.states}
        now = {s.status for s in cur.states}
        if READY in now and was & {NOT_READY, FAILED}:
            events.append((cur.start, 3, "readmit", None))
    events.sort(key=lambda e: (e[0], e[1]))
    states: BreakerStates = INITIAL
    starts, sets = [float("-inf")], [states]
    for t, _, what, item in events:
        if what == "window":
            assert isinstance(item, Window)
            # Legs fail unseen only where the router sends them: for a client's request, to a worker it may
            # have had Ready when it picked it (a leg picked up to a request timeout before may land in the
            # window).
            if READY in status.statuses_in(item.start - contract.request_timeout_s, item.end) \
                    and _requests_in_flight(view, item.start, item.end):
                states = hidden_failures(states, item.start, item.end, rules)
        elif what == "pick":
            states = on_pick(states, t, rules, maybe_closed=_maybe_closed(
                history, item, t, BreakerTimeline(starts, sets, rules), slack_s))
        elif what == "unseen_end":
            states = on_outcome(states, NEUTRAL, t, rules)
        elif what == "end":
            assert isinstance(item, Leg)
            inside = any(w.start <= t <= w.end for w in windows)
            outcome = EITHER if inside else outcome_of(item, contract.request_timeout_s, contract.transport)
            states = on_outcome(states, outcome, t, rules)
        else:
            states = readmitted(states)
        if states != sets[-1]:
            starts.append(t)
            sets.append(states)
    return BreakerTimeline(starts, sets, rules)


def _maybe_closed(history: History, leg: object, t: float, so_far: BreakerTimeline, slack_s: float) -> bool:
    """Whether the breaker may have been closed when the router picked this leg: at some moment from its
    request (less the lag, both ways) to its arrival at `t`. A request with no leg seen gives no bound."""
    if not isinstance(leg, Leg):
        return True
    req = history.request_by_tag(leg.tag)
    if req is None or req.invoked_t is None:
        return True
    return CLOSED in so_far.kinds_in(req.invoked_t - 2 * slack_s, t)


def _roles(view: EngineView) -> list[str]:
    roles = sorted(set(view.roles.values()))
    return [r for r in roles if r in ("prefill", "decode")] or roles


@judged_from_engines(NAME, BreakerContractExpect)
def check_breaker_contract(view: EngineView, exp: BreakerContractExpect) -> Verdict:
    history = view.history
    threshold = view.contract.breaker_failures
    if threshold is None:
        return Verdict.ok(NAME, "no circuit breaker configured: nothing keeps a Ready worker out",
                          {"breaker": None})
    rules = BreakerRules(threshold, view.contract.breaker_open_s)
    slack = exp.slack_s
    legs = view.legs()
    by_engine: dict[str, list[Leg]] = {}
    for leg in legs:
        by_engine.setdefault(leg.engine, []).append(leg)
    timelines = {e: breaker_timeline(view, e, by_engine.get(e, []), rules, slack) for e in view.roles}
    evidence: list[str] = []
    judged = 0
    for leg in legs:
        req = history.request_by_tag(leg.tag)
        if req is None or req.invoked_t is None or leg.engine not in timelines:
            continue
        judged += 1
        if timelines[leg.engine].refused_all_along(req.invoked_t - slack, leg.at + slack):
            evidence.append(f"router side: {leg.tag} sent a {leg.kind} leg to {leg.engine} at t={leg.at:.3f} "
                            f"while its circuit breaker surely kept it out (open {rules.open_s:g}s after "
                            f"{rules.threshold} own failures)")
    with_legs = {leg.tag for leg in legs}
    refusals = 0
    for req in history.request_list():
        if req.status != 503 or req.tag in with_legs or req.invoked_t is None or req.completed_t is None:
            continue
        refusals += 1
        a, b = req.invoked_t - slack, req.completed_t + slack
        open_to: dict[str, str] = {}
        for role in _roles(view):
            for w in view.workers(role):
                if view.timeline(w).surely(READY, a, b) and timelines[w].admitted_all_along(a, b):
                    open_to[role] = w
                    break
        if len(open_to) == len(_roles(view)):
            evidence.append(f"router side: {req.tag} was refused 503 at t={req.completed_t:.3f} "
                            f"({req.error or 'no error'}) while {', '.join(open_to.values())} were Ready and "
                            "their breakers surely admitted requests")
    numbers = {"legs": judged, "refusals": refusals, "threshold": rules.threshold, "open_s": rules.open_s,
               "slack_s": slack}
    if evidence:
        what = f"{len(evidence)} action(s) the circuit breaker contract does not allow"
        return Verdict.fail(NAME, what, numbers, cap(evidence))
    return Verdict.ok(NAME, f"breaker kept to its contract ({judged} legs, {refusals} refusals)", numbers)
