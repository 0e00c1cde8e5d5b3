"""Worker selection policies for one leg. The server creates one instance per leg: a policy shared by the
prefill and decode legs would advance its round-robin cursor twice per request (bug #10).

Every policy considers Ready workers only, and returns None when there is none (the server answers 503).
Candidates are taken in the order given; the server should pass them in a stable order (e.g. by id).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from .workers import READY, Worker

POLICY_NAMES: tuple[str, ...] = ("round_robin", "random", "power_of_two", "least_load")


class SelectionPolicy(Protocol):
    name: str

    def select(self, candidates: Sequence[Worker], now: float) -> Worker | None:
        """One Ready worker from candidates, or None."""
        ...


def _ready(candidates: Sequence[Worker]) -> list[Worker]:
    return [w for w in candidates if w.runtime.status is READY]


class RoundRobin:
    """Cycles through Ready workers; the cursor is per instance (per leg)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, candidates: Sequence[Worker], now: float) -> Worker | None:
        ready = _ready(candidates)
        if not ready:
            return None
        chosen = ready[self._next % len(ready)]
        self._next += 1
        return chosen


class RandomPolicy:
    """Uniform over Ready workers, from a seeded generator."""

    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, candidates: Sequence[Worker], now: float) -> Worker | None:
        ready = _ready(candidates)
        return self._rng.choice(ready) if ready else None


class PowerOfTwo:
    """Two distinct Ready workers drawn at random; fewer in-flight requests wins (the first on a tie)."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def select(self, candidates: Sequence[Worker], now: float) -> Worker | None:
        ready = _ready(candidates)
        if len(ready) <= 1:
            return ready[0] if ready else None
        a, b = self._rng.sample(ready, 2)
        return b if b.runtime.load < a.runtime.load else a


class LeastLoad:
    """The Ready worker with the fewest in-flight requests; ties go round robin so equal load spreads."""

    name = "least_load"

    def __init__(self) -> None:
        self._tiebreak = 0

    def select(self, candidates: Sequence[Worker], now: float) -> Worker | None:
        ready = _ready(candidates)
        if not ready:
            return None
        low = min(w.runtime.load for w in ready)
        tied = [w for w in ready if w.runtime.load == low]
        chosen = tied[self._tiebreak % len(tied)]
        self._tiebreak += 1
        return chosen


def make_policy(name: str, seed: int | None = None) -> SelectionPolicy:
    """A new policy instance by name; ValueError for an unknown name. Call once per leg."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key == "round_robin":
        return RoundRobin()
    if key == "random":
        return RandomPolicy(seed)
    if key == "power_of_two":
        return PowerOfTwo(seed)
    if key == "least_load":
        return LeastLoad()
    raise ValueError(f"unknown policy {name!r}; expected one of: {', '.join(POLICY_NAMES)}")
