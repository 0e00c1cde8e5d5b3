"""When a timeline step fires: conditions on the scenario clock and on what the harness has observed."""

from __future__ import annotations

from dataclasses import dataclass, field

WORKER_STATUSES: tuple[str, ...] = ("pending", "ready", "not_ready", "failed", "draining", "absent")


@dataclass(frozen=True)
class At:
    """Holds from `t` seconds after the timeline's zero."""

    t: float


@dataclass(frozen=True)
class After:
    """Holds `delay_s` after the named step was applied."""

    step: str
    delay_s: float = 0.0


@dataclass(frozen=True)
class WorkerStatus:
    """Holds while the router reports the engine's worker in this status (`absent`: not listed)."""

    target: str
    status: str


@dataclass(frozen=True)
class RequestsCompleted:
    """Holds once at least n client requests have completed (any outcome)."""

    n: int


@dataclass(frozen=True)
class AllOf:
    conditions: tuple[Condition, ...]


Condition = At | After | WorkerStatus | RequestsCompleted | AllOf


@dataclass
class Observed:
    """What a condition may look at: router worker statuses by engine name, completed requests, and when each
    step was applied (timeline time)."""

    worker_status: dict[str, str] = field(default_factory=dict)
    requests_completed: int = 0
    applied_at: dict[str, float] = field(default_factory=dict)


def holds(cond: Condition, now: float, seen: Observed) -> bool:
    if isinstance(cond, At):
        return now >= cond.t
    if isinstance(cond, After):
        t = seen.applied_at.get(cond.step)
        return t is not None and now >= t + cond.delay_s
    if isinstance(cond, WorkerStatus):
        return seen.worker_status.get(cond.target, "absent") == cond.status
    if isinstance(cond, RequestsCompleted):
        return seen.requests_completed >= cond.n
    if isinstance(cond, AllOf):
        return all(holds(c, now, seen) for c in cond.conditions)
    raise TypeError(f"unknown condition {cond!r}")


def earliest(cond: Condition, seen: Observed) -> float | None:
    """The earliest timeline time at which the condition's clock part can hold (None: it has none, or waits on
    a step not applied yet). Conditions on observations are re-evaluated whenever something is observed."""
    if isinstance(cond, At):
        return cond.t
    if isinstance(cond, After):
        t = seen.applied_at.get(cond.step)
        return None if t is None else t + cond.delay_s
    if isinstance(cond, AllOf):
        times = [earliest(c, seen) for c in cond.conditions]
        clocked = [t for t in times if t is not None]
        return max(clocked) if clocked else None
    return None


def condition_time(cond: Condition) -> float:
    """Latest fixed time (At) a condition names: a lower bound on how long a timeline needs."""
    if isinstance(cond, At):
        return cond.t
    if isinstance(cond, AllOf):
        return max((condition_time(c) for c in cond.conditions), default=0.0)
    return 0.0
