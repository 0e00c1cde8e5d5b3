"""Each worker's contract status over a run, built from what its engine saw (its engine call records).

The probes an engine answered are outcomes the router saw, outside the windows where a fault could hide
or bend them (`harness.contract.reach`). Inside a MURKY window a probe it answered healthy may have looked
either way to the router (one it answered unhealthy, or that its caller cut, failed for the router in any
window), and failed probes it never saw may be hidden; inside a LOSSY one a probe it answered is
judged as it is, but failed ones may be hidden too; across a DOWN window the router's probes failed
unseen, at least and at most as many as its schedule allows. The result, per worker, is the set of
states the router may be in at every moment (`WorkerTimeline`), as Knossos keeps the set of states a
history allows.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.contract.reach import DOWN, LOSSY, Window
from harness.contract.settings import RouterContract
from harness.contract.status_model import (
    DRAINING,
    PENDING,
    Outcome,
    States,
    WorkerState,
    apply,
    apply_failures,
    apply_hidden_failures,
    statuses,
)

ABSENT = "absent"  # not registered with the router (yet, or any more)
_ABSENT = frozenset({WorkerState(ABSENT)})
# A probe answered within this share of the probe timeout counts as answered in time, one answered after
# this many timeouts as timed out; in between the router may have seen either.
_IN_TIME = 0.9
_LATE = 1.1


@dataclass(frozen=True)
class ProbeSeen:
    """A probe an engine answered: when it arrived, how long it took, whether it said healthy."""

    at: float
    duration_s: float
    healthy: bool


@dataclass(frozen=True)
class Epoch:
    start: float
    states: States


class WorkerTimeline:
    """The states a worker may be in, as epochs: each holds from its start to the next one's."""

    def __init__(self, engine: str, epochs: Sequence[Epoch]) -> None:
        self.engine = engine
        self.epochs = list(epochs)
        self._starts = [e.start for e in self.epochs]

    def statuses_in(self, a: float, b: float) -> frozenset[str]:
        """Every status the worker may have had at some moment of [a, b]."""
        i = max(0, bisect_right(self._starts, a) - 1)
        out: set[str] = set()
        for epoch in self.epochs[i:]:
            if epoch.start > b:
                break
            out |= statuses(epoch.states)
        return frozenset(out)

    def surely(self, status: str, a: float, b: float) -> bool:
        """Whether the worker had `status`, and no other, all through [a, b]."""
        return self.statuses_in(a, b) == {status}

    def since_not(self, t: float, status: str) -> float | None:
        """Since when, up to `t`, the worker has surely not had `status` (None: it may have at `t`)."""
        i = bisect_right(self._starts, t) - 1
        if i < 0 or status in statuses(self.epochs[i].states):
            return None
        while i > 0 and status not in statuses(self.epochs[i - 1].states):
            i -= 1
        return self.epochs[i].start


def probe_outcome(p: ProbeSeen, timeout_s: float) -> Outcome:
    if not p.healthy or p.duration_s > _LATE * timeout_s:
        return Outcome.FAIL
    if p.duration_s < _IN_TIME * timeout_s:
        return Outcome.OK
    return Outcome.EITHER


@dataclass
class _Open:
    window: Window
    base: States  # the states as it opened
    exact: bool = True  # nothing else moved the states while it was open


def build_timeline(
    engine: str,
    probes: Iterable[ProbeSeen],
    windows: Iterable[Window],
    contract: RouterContract,
    *,
    absent_at_start: bool = False,
    api_calls: Iterable[tuple[float, str]] = (),
) -> WorkerTimeline:
    """`absent_at_start`: the router started without the worker; `api_calls`: (time, "added" | "removed")
    for each time it was registered through the worker API (a new worker: Pending) or taken out (it
    drains: never probed, never Ready again, until registered anew)."""
    th = contract.thresholds
    # (time, order, what): at one instant a window closes before the next opens (a fault's own edge follows
    # it), and a probe then falls in the window just opened.
    events: list[tuple[float, int, object]] = []
    for w in windows:
        events.append((w.start, 1, ("open", w)))
        events.append((w.end, 0, ("close", w)))
    for p in probes:
        # The router takes a probe's outcome when it answered, or when its timeout ran out.
        events.append((p.at + min(p.duration_s, contract.probe_timeout_s), 2, p))
    for t, call in api_calls:
        events.append((t, -1 if call == "added" else 3, (call, None)))
    events.sort(key=lambda e: (e[0], e[1]))
    states: States = _ABSENT if absent_at_start else frozenset({WorkerState(PENDING)})
    epochs = [Epoch(-math.inf, states)]
    opened: list[_Open] = []
    for t, _, what in events:
        if isinstance(what, ProbeSeen):
            if ABSENT in statuses(states):
                continue  # a probe before the router knew the worker (another caller's, or early)
            murky = any(o.window.kind != LOSSY for o in opened)
            # An answer the engine gave as unhealthy, or never gave (cut: the caller left), the router saw
            # fail in any window; only one it answered healthy may have looked either way.
            outcome = probe_outcome(what, contract.probe_timeout_s)
            if murky and what.healthy:
                outcome = Outcome.EITHER
            states = apply(states, outcome, th)
            if opened:
                states = apply_hidden_failures(states, max(o.window.hidden(contract)[1] for o in opened), th)
            for o in opened:
                o.exact = False
        else:
            kind, w = what  # type: ignore[misc]
            if kind == "open":
                for o in opened:
                    o.exact = False
                opened.append(_Open(w, states, exact=not opened))
                states = apply_hidden_failures(states, w.hidden(contract)[1], th)
            elif kind == "close":
                o = next(x for x in opened if x.window is w)
                opened.remove(o)
                for other in opened:
                    other.exact = False
                if w.kind == DOWN and o.exact and ABSENT not in statuses(o.base):
                    least, most = w.hidden(contract)
                    states = apply_failures(o.base, least, most, th)
            else:
                for o in opened:
                    o.exact = False
                states = frozenset({WorkerState(PENDING if kind == "added" else DRAINING)})
        if states != epochs[-1].states:
            epochs.append(Epoch(t, states))
    return WorkerTimeline(engine, epochs)
