"""The fault ledger: which faults are active, and the history records of each one's life.

One ledger per run, for every kind of fault (engine, protocol, network, worker API). A world reports what it
did (applied, verified, what a heal found); the ledger decides which faults that ends, by the rules below,
and writes `fault_applied` / `fault_verified` / `fault_healed` (and the heal notes). Pure: no I/O but the
history writer it is given.

Heal rules:
- one-shot actions (restart, slow start, start engine, worker API calls) end the moment they are done;
- a restart (any mode) or a slow start also ends its target's protocol faults and wedges: the engine comes
  back clean (a crash, death or graceful stop stays until a respawn);
- a respawn ends everything on its target;
- `Heal(kind)` ends the target's engine faults of that kind (`None`: all of them, a SIGSTOP included);
- `HealLink(link)` ends the target's faults on that link (`None`: on all its links);
- a flapping link ends when its last cycle does; at the end of the run, link faults end ("end of run") and
  frozen processes that the world resumed end their wedge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.history_writer import HistoryRecorder
from harness.scenario import (
    Action,
    Crash,
    Die,
    GracefulStop,
    Heal,
    HealLink,
    Respawn,
    Restart,
    SlowStart,
)
from harness.scenario.actions import ONE_SHOT


@dataclass
class ActiveFault:
    fault: str
    kind: str
    target: str
    link: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


# Kinds a restart does not undo: the process is gone until a respawn.
_OUTLIVE_RESTART = ("crash", "die", "graceful_stop")


class FaultLedger:
    def __init__(self, history: HistoryRecorder) -> None:
        self.history = history
        self.active: list[ActiveFault] = []
        self.failures: list[str] = []  # actions that could not be applied or verified
        self.engine_findings: list[str] = []  # what engines answered that their contract does not allow

    # -- what the world reports

    def applied(self, fault: str, kind: str, target: str, params: Mapping[str, Any],
                changed: Mapping[str, Any], link: str | None = None) -> None:
        self.history.fault_applied(fault, kind, target, dict(params), dict(changed))
        self.active.append(ActiveFault(fault, kind, target, link, dict(params)))

    def verified(self, fault: str, ok: bool, evidence: Any, engine_finding: str | None = None) -> None:
        extra = {} if engine_finding is None else {"engine_finding": engine_finding}
        self.history.fault_verified(fault, ok, evidence, **extra)
        if not ok:
            self.failures.append(f"{fault}: not verified ({evidence})")
        if engine_finding is not None:
            self.engine_findings.append(f"engine side: {fault}: {engine_finding}")

    def raised(self, fault: str, error: str) -> None:
        """The action broke: evidence that the fault may not be in place, never an abort of the run."""
        self.history.note(f"action {fault} raised {error}", fault=fault)
        self.history.fault_verified(fault, False, {"error": error})
        self.failures.append(f"{fault}: {error}")

    def action_done(self, fault: str, action: Action, verified: bool, evidence: Mapping[str, Any]) -> None:
        """Apply the heal rules once an action has been carried out."""
        target = action.target
        if isinstance(action, (Restart, SlowStart)):
            self._heal(fault)
            self.heal_matching(target, lambda a: a.kind not in _OUTLIVE_RESTART)
        elif isinstance(action, Respawn):
            self.heal_matching(target, lambda a: a.fault != fault)
            self._heal(fault)
        elif isinstance(action, ONE_SHOT):
            self._heal(fault)
        elif isinstance(action, Heal):
            kinds = None if action.kind is None else {action.kind}
            healed = self.heal_matching(target, lambda a: kinds is None or a.kind in kinds)
            ev = {**evidence, "healed": healed}
            self.history.note(f"heal {target} {action.kind or 'all'}: {healed}", fault=fault, evidence=ev)
            if not verified:
                self.failures.append(f"{fault}: heal not verified ({ev})")
        elif isinstance(action, HealLink):
            healed = self.heal_links(target, action.link)
            self.history.note(f"heal {target} {action.link or 'all links'}: {healed}", fault=fault,
                              evidence=dict(evidence), healed=healed)
            if not verified:
                self.failures.append(f"{fault}: heal not verified ({dict(evidence)})")
        elif isinstance(action, (Crash, Die, GracefulStop)):
            pass  # stays until a respawn

    # -- ending faults

    def _heal(self, fault: str, reason: str | None = None) -> None:
        for a in list(self.active):
            if a.fault == fault:
                self._end(a, reason)

    def _end(self, a: ActiveFault, reason: str | None = None) -> None:
        self.active.remove(a)
        extra: dict[str, Any] = {}
        if a.link is not None:
            extra["link"] = a.link
        if reason is not None:
            extra["reason"] = reason
        self.history.fault_healed(a.fault, a.kind, a.target, **extra)

    def heal_matching(self, target: str, pick: Any) -> list[str]:
        """End the target's engine faults (not its link faults) that `pick` selects; their ids."""
        ended = [a for a in self.active if a.target == target and a.link is None and pick(a)]
        for a in ended:
            self._end(a)
        return [a.fault for a in ended]

    def heal_links(self, target: str, link: str | None, reason: str | None = None) -> list[str]:
        ended = [a for a in self.active
                 if a.target == target and a.link is not None and (link is None or a.link == link)]
        for a in ended:
            self._end(a, reason)
        return [a.fault for a in ended]

    def flap_ended(self, fault: str) -> None:
        self._heal(fault, reason="flapping ended")

    def end_of_run(self, resumed: tuple[str, ...]) -> None:
        """Frozen processes the world resumed end their wedge; every link fault ends with the run."""
        for name in resumed:
            self.heal_matching(name, lambda a: a.kind == "wedge")
        for a in [a for a in self.active if a.link is not None]:
            self._end(a, reason="end of run")

    def is_active(self, fault: str) -> bool:
        return any(a.fault == fault for a in self.active)
