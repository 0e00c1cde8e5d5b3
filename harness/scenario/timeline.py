"""The fault timeline: steps that fire in order, each once its condition holds, each with a deadline if set.

`Timeline` is a sans-IO core: it takes the timeline time and what has been observed, says which steps fire
or are missed now, and when it next needs to be asked (`next_due`), so its interpreter never polls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.scenario.actions import Action
from harness.scenario.conditions import Condition, Observed, condition_time, earliest, holds
from harness.scenario.typecheck import CHECKED_APART


@dataclass(frozen=True)
class Step:
    """One timeline step: apply `action` once `when` holds; if it does not hold by `deadline_s` (timeline
    time), the step is missed and the run's verdict cannot be a pass."""

    name: str
    # The scenario's check names the step in what it says of a wrong action (`model._type_problems`).
    action: Action = field(metadata={CHECKED_APART: True})
    when: Condition
    deadline_s: float | None = None


@dataclass
class Timeline:
    """Decides which steps fire. Steps fire in order: a step is not considered before the previous one fired
    or was missed, so a timeline reads like a script ("restart, then when Ready again, wedge...")."""

    steps: tuple[Step, ...]
    _next: int = 0
    missed: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self._next >= len(self.steps)

    @property
    def pending(self) -> list[Step]:
        return list(self.steps[self._next:])

    def due(self, now: float, seen: Observed) -> tuple[list[Step], list[Step]]:
        """(steps to apply now, steps missed now). Fired steps are stamped in `seen.applied_at`."""
        fire: list[Step] = []
        miss: list[Step] = []
        while self._next < len(self.steps):
            step = self.steps[self._next]
            if holds(step.when, now, seen):
                fire.append(step)
                # Later steps may depend on this one (After): mark it now so they can be judged in this call.
                seen.applied_at.setdefault(step.name, now)
            elif step.deadline_s is not None and now > step.deadline_s:
                miss.append(step)
                self.missed.append(step.name)
            else:
                break
            self._next += 1
        return fire, miss

    def give_up(self) -> list[str]:
        """Mark every step not yet fired or missed as missed; their names."""
        rest = [s.name for s in self.steps[self._next:]]
        self.missed.extend(rest)
        self._next = len(self.steps)
        return rest

    def next_due(self, now: float, seen: Observed) -> float | None:
        """The timeline time after `now` at which the next step may fire or be missed, as far as the clock
        decides (None: only an observation can make it due)."""
        if self.done:
            return None
        step = self.steps[self._next]
        times = [earliest(step.when, seen)]
        if step.deadline_s is not None:
            # A step is missed once its deadline has passed: ask just after it.
            times.append(step.deadline_s + 1e-6)
        later = [t for t in times if t is not None and t > now]
        return min(later) if later else None

    def last_fixed_time(self) -> float:
        """Latest At()/deadline time mentioned: a lower bound on how long the timeline needs."""
        t = 0.0
        for s in self.steps:
            t = max(t, condition_time(s.when), s.deadline_s or 0.0)
        return t
