"""The worker status contract (docs/DESIGN.md §2) as a model a history is held to, written apart from the
reference router's own code so that a mistake there is not a mistake here.

A router probes each worker; each outcome moves the worker through Pending, Ready, NotReady and Failed.
The engines see most probes, not all: a probe to a dead, frozen or cut-off engine fails without reaching
it, and a probe that crosses a faulty link may time out although the engine answered. So the model tracks
the *set* of states the router may be in, given what is known (the Knossos way): each probe outcome is
OK, FAIL or EITHER, and a stretch where the engine could not be seen may hide any number of failed
probes up to a bound. A router is held to the contract only where every state in the set agrees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

PENDING, READY, NOT_READY, FAILED, DRAINING = "pending", "ready", "not_ready", "failed", "draining"
STATUSES = (PENDING, READY, NOT_READY, FAILED, DRAINING)


class Outcome(Enum):
    OK = "ok"
    FAIL = "fail"
    EITHER = "either"


@dataclass(frozen=True)
class Thresholds:
    """The router's probe thresholds: `failure` consecutive failures take a Ready worker out, `success`
    consecutive successes bring one in; a Pending worker fails after 10 x `failure` probes, a NotReady one
    after 3 x `failure` consecutive failures counted from Ready."""

    failure: int
    success: int

    def __post_init__(self) -> None:
        if self.failure < 1 or self.success < 1:
            raise ValueError(f"thresholds must be at least 1, got {self.failure}/{self.success}")


@dataclass(frozen=True, order=True)
class WorkerState:
    """A status and the consecutive counters that decide its next move."""

    status: str
    successes: int = 0
    failures: int = 0
    pending_probes: int = 0


def step(state: WorkerState, ok: bool, th: Thresholds) -> WorkerState:
    """One probe outcome under the contract."""
    status = state.status
    if status == DRAINING:
        return state
    succ = state.successes + 1 if ok else 0
    fail = 0 if ok else state.failures + 1
    if status == PENDING:
        # Failures while Pending count only as probes (it never goes NotReady): kept out of the state.
        probes = state.pending_probes + 1
        if succ >= th.success:
            return WorkerState(READY)
        if probes >= 10 * th.failure:
            return WorkerState(FAILED)
        return WorkerState(PENDING, succ, 0, probes)
    if status == READY:
        if fail >= th.failure:
            return WorkerState(NOT_READY, 0, fail)
        # Successes while Ready lead nowhere: not counted (a set of states stays finite).
        return WorkerState(READY, 0, fail)
    if status == NOT_READY:
        if succ >= th.success:
            return WorkerState(READY)
        if fail >= 3 * th.failure:
            return WorkerState(FAILED)
        return WorkerState(NOT_READY, succ, fail)
    # Failed is not terminal: a worker restarted on the same address rejoins.
    if succ >= th.success:
        return WorkerState(READY)
    # Only successes lead out of Failed: its failures are not counted (a set of states stays finite).
    return WorkerState(FAILED, succ, 0)


States = frozenset[WorkerState]


def apply(states: Iterable[WorkerState], outcome: Outcome, th: Thresholds) -> States:
    out: set[WorkerState] = set()
    for s in states:
        if outcome is not Outcome.FAIL:
            out.add(step(s, True, th))
        if outcome is not Outcome.OK:
            out.add(step(s, False, th))
    return frozenset(out)


def apply_hidden_failures(states: Iterable[WorkerState], at_most: int, th: Thresholds) -> States:
    """Between none and `at_most` failed probes the engines could not see."""
    seen: set[WorkerState] = set(states)
    frontier = set(seen)
    for _ in range(max(0, at_most)):
        frontier = {step(s, False, th) for s in frontier} - seen
        if not frontier:
            break
        seen |= frontier
    return frozenset(seen)


def apply_failures(states: Iterable[WorkerState], least: int, most: int, th: Thresholds) -> States:
    """Between `least` and `most` failed probes in a row."""
    frontier = frozenset(states)
    for _ in range(max(0, least)):
        nxt = frozenset(step(s, False, th) for s in frontier)
        if nxt == frontier:
            break
        frontier = nxt
    return apply_hidden_failures(frontier, max(0, most - least), th)


def statuses(states: Iterable[WorkerState]) -> frozenset[str]:
    return frozenset(s.status for s in states)
