"""What a session asks its world to do. Commands are plain data; a world executes each and answers with the
events of `harness.session.events`. Every command names engines, links and steps by name, never by address:
addresses are the world's business."""

from __future__ import annotations

from dataclasses import dataclass

from harness.scenario import RouterSettings
from harness.scenario.actions import Action
from harness.session.requests import RequestPlan


@dataclass(frozen=True)
class LaunchEngine:
    """Start an engine (first start: with its loading delay, if any). Answer: `EngineUp` or `EngineFailed`.
    The set-up's own start, not the timeline action `StartEngine` of a deferred engine (an `ApplyAction`)."""

    name: str
    first_start: bool = True


@dataclass(frozen=True)
class LaunchRouter:
    """Start the router under test, told about the `registered` engines. Answer: `RouterUp` or
    `RouterFailed`."""

    registered: tuple[str, ...]
    settings: RouterSettings


@dataclass(frozen=True)
class PollWorkers:
    """Read the router's workers once. Answer: `WorkersSeen`."""


@dataclass(frozen=True)
class PollRouterEvents:
    """Read the router's events from cursor `since`. Answer: `RouterEventsSeen`. `final`: the run's last read,
    which first reads the router's counters too (`RouterEventsSeen.metrics`)."""

    since: int
    final: bool = False


@dataclass(frozen=True)
class CheckRoutable:
    """For a router without a worker API: does one completion go through? Answer: `RoutableSeen`."""


@dataclass(frozen=True)
class SendRequest:
    """Send one client request through the router; it must end by its deadline. Answer: `RequestDone`."""

    plan: RequestPlan


@dataclass(frozen=True)
class CancelRequests:
    """Give up on every request still in flight (each then answers `RequestDone`, or nothing)."""


@dataclass(frozen=True)
class ApplyAction:
    """Apply one timeline action as fault `fault` (the step's name). Answer: `FaultApplied`, `EngineReport`,
    `FaultVerified`, `WorldNote` as they happen, then `ActionDone`."""

    fault: str
    action: Action


@dataclass(frozen=True)
class SetLinkEnabled:
    """Take a link down or bring it back up (a flapping link's toggles). Answer: `LinkToggled`."""

    fault: str
    engine: str
    link: str
    enabled: bool


@dataclass(frozen=True)
class Teardown:
    """End the cell: resume frozen processes, stop the router, then the engines. Answer: `TornDown`."""


@dataclass(frozen=True)
class CollectHandoffs:
    """Read every engine's handoff provenance records. Answer: `HandoffsCollected`."""


Command = (
    LaunchEngine
    | LaunchRouter
    | PollWorkers
    | PollRouterEvents
    | CheckRoutable
    | SendRequest
    | CancelRequests
    | ApplyAction
    | SetLinkEnabled
    | Teardown
    | CollectHandoffs
)
