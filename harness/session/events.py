"""What a world tells its session. Events are plain data, answered to the commands of
`harness.session.commands`; the session stamps each with the time it is handled."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.session.commands import Command


@dataclass(frozen=True)
class EngineUp:
    """The engine serves; `state` is what it reports of itself (engine id, generation, ports...)."""

    name: str
    state: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class EngineFailed:
    name: str
    error: str


@dataclass(frozen=True)
class RouterUp:
    """The router serves. `has_events`: it exposes router events the harness can read."""

    has_events: bool = False


@dataclass(frozen=True)
class RouterFailed:
    error: str


@dataclass(frozen=True)
class WorkersSeen:
    """One read of the router's workers (None: it has no readable worker API). `engines` maps each worker URL
    the world knows to the engine behind it."""

    workers: tuple[Mapping[str, Any], ...] | None
    engines: Mapping[str, str] = field(default_factory=dict)
    # Why there is no worker list (an HTTP status, a connection error), when the world knows.
    problem: str = ""


@dataclass(frozen=True)
class RouterEventsSeen:
    """Router events from the cursor asked for (None: none readable) and the next cursor. `metrics`: on the
    final read, the router's counters read just before the events (`harness.router_metrics.snapshot`)."""

    events: tuple[Mapping[str, Any], ...] | None
    next: int = 0
    metrics: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RoutableSeen:
    ok: bool


@dataclass(frozen=True)
class RequestDone:
    """A client request ended. `status` 0 = no HTTP answer; `latency_s`/`ttft_s` as the client measured."""

    seq: int
    status: int = 0
    ok: bool = False
    text: str | None = None
    error: str | None = None
    latency_s: float = 0.0
    ttft_s: float | None = None
    timed_out: bool = False
    # An error answer's body not of the documented shape (`harness.value_checks.error_body_problem`).
    body_problem: str | None = None


@dataclass(frozen=True)
class FaultApplied:
    fault: str
    kind: str
    target: str
    params: Mapping[str, Any] = field(default_factory=dict)
    changed: Mapping[str, Any] = field(default_factory=dict)
    link: str | None = None


@dataclass(frozen=True)
class FaultVerified:
    """A fault was checked after it was applied: `evidence` says what was seen. `ok` rests on what the
    harness can see of the process and the link (a signal delivered, a port refused, a toxic listed), never
    on the engine's word alone; `engine_finding`: what the engine answered that its contract does not allow
    (e.g. healthy while it drains), a finding on the engine's side."""

    fault: str
    ok: bool
    evidence: Any = None
    engine_finding: str | None = None


@dataclass(frozen=True)
class EngineReport:
    """What an engine reports of itself after an action (None fields: unreadable)."""

    name: str
    state: Mapping[str, Any]


@dataclass(frozen=True)
class WorldNote:
    """Something the world did that belongs in the history (a router's command line, a proxy set up)."""

    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RouterExited:
    """The router process ended while the run still needed it (no step of the scenario stopped it): the
    system under test crashed. `why`: the exit summary from its log."""

    returncode: int | None
    why: str = ""
    log: str = ""
    # The harness lost it (its fork server died): the run cannot tell, the router is not to blame.
    by_harness: bool = False


@dataclass(frozen=True)
class ActionDone:
    """An `ApplyAction` ended. `error`: it raised (the fault is unverified). For heals, `verified` and
    `evidence` say whether the target is clean again."""

    fault: str
    error: str | None = None
    verified: bool = True
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LinkToggled:
    fault: str
    engine: str
    link: str
    enabled: bool


@dataclass(frozen=True)
class TornDown:
    """The cell's systems are stopped. `resumed`: engines that were frozen (SIGSTOP) and were resumed."""

    resumed: tuple[str, ...] = ()


@dataclass(frozen=True)
class HandoffsSeen:
    """Handoff provenance records the engines made since the last ones reported (a world that can see them
    as they are made reports them so; the rest come with `HandoffsCollected`)."""

    records: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class HandoffsCollected:
    """Every engine's handoff provenance records (`error`: they could not be read)."""

    records: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class CommandFailed:
    """A command broke inside the world in a way it has no answer for (a bug in the world, not a fault)."""

    command: Command
    error: str


Event = (
    EngineUp
    | EngineFailed
    | RouterUp
    | RouterFailed
    | WorkersSeen
    | RouterEventsSeen
    | RoutableSeen
    | RequestDone
    | FaultApplied
    | FaultVerified
    | EngineReport
    | WorldNote
    | RouterExited
    | ActionDone
    | LinkToggled
    | TornDown
    | HandoffsSeen
    | HandoffsCollected
    | CommandFailed
)
