"""The circuit breaker contract as a model a history is held to: the states one worker's breaker may be in,
given the outcomes of the legs it ran as the router saw them (docs/DESIGN.md §2; the reference router's
`core/breaker.py` semantics, written apart from it).

- closed(k): k own failures in a row; `threshold` of them open it. A success resets the count.
- open(lo, hi): opened at some moment of [lo, hi]; it admits nothing until `open_s` after that.
- half(trial): its open period is over; one trial request may go (`trial` True: it is out). The trial's
  success closes it, its own failure opens it again.
- A worker promoted back to Ready by its probes after an outage is re-admitted: its breaker closes.

What counts against a worker: its leg was refused, reset or timed out, or it answered 5xx for its own
leg. Never: a client's mistake (4xx), a decode whose KV load failed (its prefill's, or the path's, failure).
Outcomes are read from the engines' records, so where a fault could hide or bend what the router saw (a
window of `harness.contract.reach`: legs refused unseen, answers lost on the way back) any number of own
failures may hide. The model is a set of states (`BreakerStates`); a check holds a router to it only where
every state in the set agrees.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

CLOSED, OPEN, HALF = "closed", "open", "half_open"

# How a leg ended, as the breaker counts it.
SUCCESS, FAILURE, NEUTRAL, EITHER = "success", "failure", "neutral", "either"


# A tuple, not a dataclass: a history's model hashes millions of these into sets, and a tuple's hash is C.
class BreakerState(NamedTuple):
    kind: str
    count: int = 0  # closed: own failures in a row
    lo: float = 0.0  # open: the earliest and latest moment it may have opened
    hi: float = 0.0
    trial: bool = False  # half-open: its one trial request is out

    def admits(self, t: float, open_s: float) -> bool | None:
        """Whether a request may be sent to it at `t` (None: it cannot be told from this state alone)."""
        if self.kind == CLOSED:
            return True
        if self.kind == OPEN:
            if t < self.lo + open_s:
                return False
            return True if t >= self.hi + open_s else None
        return not self.trial


BreakerStates = frozenset[BreakerState]
INITIAL: BreakerStates = frozenset({BreakerState(CLOSED)})


@dataclass(frozen=True)
class BreakerRules:
    threshold: int
    open_s: float


def _tick(s: BreakerState, t: float, rules: BreakerRules) -> frozenset[BreakerState]:
    """Time passing: an open period that surely ended is half-open (one that may have ended is both)."""
    if s.kind != OPEN or t < s.lo + rules.open_s:
        return frozenset({s})
    if t >= s.hi + rules.open_s:
        return frozenset({BreakerState(HALF)})
    return frozenset({s, BreakerState(HALF)})


def advance(states: BreakerStates, t: float, rules: BreakerRules) -> BreakerStates:
    if _timeless(states):
        return states
    return frozenset(x for s in states for x in _tick(s, t, rules))


def _outcome(s: BreakerState, outcome: str, t: float, rules: BreakerRules) -> set[BreakerState]:
    if outcome == EITHER:
        return (_outcome(s, SUCCESS, t, rules) | _outcome(s, FAILURE, t, rules)
                | _outcome(s, NEUTRAL, t, rules))
    if s.kind == CLOSED:
        if outcome == SUCCESS:
            return {BreakerState(CLOSED)}
        if outcome == FAILURE:
            if s.count + 1 >= rules.threshold:
                return {BreakerState(OPEN, lo=t, hi=t)}
            return {BreakerState(CLOSED, s.count + 1)}
        return {s}
    if s.kind == OPEN:
        return {s}  # a leg sent before it opened says nothing of the worker since
    if not s.trial:
        return {s}  # no trial out: a leg from before the open period
    # The leg may be the trial's, or an earlier one's that ended late.
    if outcome == SUCCESS:
        return {BreakerState(CLOSED), s}
    if outcome == FAILURE:
        return {BreakerState(OPEN, lo=t, hi=t), s}
    return {BreakerState(HALF), s}  # the trial ended without a verdict: the next request gets it


def on_outcome(states: BreakerStates, outcome: str, t: float, rules: BreakerRules) -> BreakerStates:
    """A leg to the worker ended at `t` with `outcome` (SUCCESS, FAILURE, NEUTRAL or EITHER)."""
    if outcome in (SUCCESS, NEUTRAL) and _timeless(states):
        return _timeless_outcome(states, outcome, rules)
    return frozenset(x for s in advance(states, t, rules) for x in _outcome(s, outcome, t, rules))


def on_pick(states: BreakerStates, t: float, rules: BreakerRules, *,
            maybe_closed: bool = True) -> BreakerStates:
    """A leg to the worker was picked at `t`: a half-open breaker gives it the trial. If the breaker may
    have been closed when the router picked the leg (`maybe_closed`), it may have gone half-open only
    since, and the state may stay as it was; otherwise a half-open breaker surely gave it the trial."""
    if _timeless(states):
        return _timeless_pick(states, maybe_closed)
    return _pick(advance(states, t, rules), maybe_closed)


def _timeless(states: BreakerStates) -> bool:
    """No state that time changes (open), so a success, a neutral end or a pick gives the same set at any
    time: a history's model meets the same few sets again and again, answered once each."""
    return all(s.kind != OPEN for s in states)


@functools.lru_cache(maxsize=4096)
def _timeless_outcome(states: BreakerStates, outcome: str, rules: BreakerRules) -> BreakerStates:
    return frozenset(x for s in states for x in _outcome(s, outcome, 0.0, rules))


@functools.lru_cache(maxsize=4096)
def _timeless_pick(states: BreakerStates, maybe_closed: bool) -> BreakerStates:
    return _pick(states, maybe_closed)


def _pick(states: BreakerStates, maybe_closed: bool) -> BreakerStates:
    out: set[BreakerState] = set()
    for s in states:
        if s.kind == HALF and not s.trial:
            out.add(BreakerState(HALF, trial=True))
            if not maybe_closed:
                continue
        out.add(s)
    return frozenset(out)


def hidden_failures(states: BreakerStates, start: float, end: float, rules: BreakerRules) -> BreakerStates:
    """Any number of own failures the engines could not see in [start, end] (and any trial's outcome)."""
    out: set[BreakerState] = set(advance(states, start, rules))
    out.update(BreakerState(CLOSED, k) for k in range(rules.threshold))
    out.add(BreakerState(OPEN, lo=start, hi=end))
    out.add(BreakerState(HALF))
    out.add(BreakerState(HALF, trial=True))
    for s in list(out):
        if s.kind == OPEN and s.lo < start:
            out.add(BreakerState(OPEN, lo=s.lo, hi=end))  # a trial of it may have failed again meanwhile
    return frozenset(out)


def readmitted(states: BreakerStates) -> BreakerStates:
    """The worker may have been promoted back to Ready after an outage: its breaker may have closed."""
    return states | {BreakerState(CLOSED)}


def surely_refuses(states: BreakerStates, t: float, rules: BreakerRules) -> bool:
    return all(s.admits(t, rules.open_s) is False for s in advance(states, t, rules))


def surely_admits(states: BreakerStates, t: float, rules: BreakerRules) -> bool:
    return all(s.admits(t, rules.open_s) is True for s in advance(states, t, rules))
