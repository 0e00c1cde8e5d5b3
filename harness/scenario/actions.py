"""What a timeline step does: engine actions (process and protocol faults), router worker API actions, and
the network actions of `harness.scenario.links`. Target = engine name.

The fault vocabulary (protocol fault kinds, wedge surfaces) is the fake engines' own: one source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fake_engines.core.fault_state import FAULT_KINDS as ENGINE_FAULT_KINDS
from fake_engines.core.fault_state import SURFACES as WEDGE_SURFACES
from harness.scenario.links import NetworkAction

__all__ = ["ENGINE_FAULT_KINDS", "WEDGE_SURFACES"]


@dataclass(frozen=True)
class Restart:
    """Restart an engine on the same serving ports with a new engine id.

    mode `control`: in-process via the control API (`down_s` listeners closed); `process`: SIGKILL the
    process and spawn it again on the same ports after `down_s`. A `down_s` shorter than the probe interval
    is a restart only the router's identity check can notice (see docs/scenarios.md).
    """

    target: str
    down_s: float = 0.0
    mode: Literal["control", "process"] = "control"
    engine_id: str | None = None


@dataclass(frozen=True)
class SlowStart:
    """Restart whose listeners refuse connections for `refuse_s`."""

    target: str
    refuse_s: float


@dataclass(frozen=True)
class Crash:
    """SIGKILL (mode `signal`) or ask the engine to kill itself (`control`); it stays down until `Respawn`."""

    target: str
    mode: Literal["control", "signal"] = "signal"


@dataclass(frozen=True)
class Respawn:
    """Start a crashed engine's process again on the same ports."""

    target: str


@dataclass(frozen=True)
class GracefulStop:
    """SIGTERM-style stop, as an orchestrator scaling down does: the engine stops taking work (health 503, new
    requests 503), finishes what is running and the KV its decodes have yet to pull, then exits; it is killed
    if that takes longer than `grace_s`. It stays down until `Respawn`."""

    target: str
    grace_s: float = 5.0


@dataclass(frozen=True)
class Die:
    """Engine death: /health 503, HealthCheck unhealthy, process exits after `exit_after_s`."""

    target: str
    exit_after_s: float = 5.0


@dataclass(frozen=True)
class Wedge:
    """Accept and never answer. mode `control`: one surface via the fault API; `sigstop`: the whole
    process."""

    target: str
    surface: str = "all"
    mode: Literal["control", "sigstop"] = "control"


@dataclass(frozen=True)
class EngineFault:
    """Any protocol fault kind of the fake engines with its parameters, e.g.
    `EngineFault("decode-0", "fail_requests", {"count": 5})`."""

    target: str
    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Heal:
    """Clear one fault kind (`kind`), or every fault including a SIGSTOP (`kind=None`)."""

    target: str
    kind: str | None = None


@dataclass(frozen=True)
class PatchWorker:
    """Router worker API PATCH of the engine's worker (property update: labels, priority). `refused`: the
    body is a mistake in this field, which the router must refuse (a 4xx naming it), changing nothing."""

    target: str
    body: Mapping[str, Any]
    refused: str | None = None


@dataclass(frozen=True)
class AddWorker:
    """Register the engine with the router through its worker API (the engine need not be up). `mistake`:
    fields laid over the body the router's adapter sends, making the call a mistake in field `refused`, which
    the router must refuse (a 4xx naming it), adding nothing. In a text value of `mistake`, `{url}` stands for
    the engine's own url: `{"url": "{url}/"}` registers a registered engine again under another spelling."""

    target: str
    mistake: Mapping[str, Any] | None = None
    refused: str | None = None


OWN_URL = "{url}"


def mistaken_body(body: Mapping[str, Any], mistake: Mapping[str, Any] | None) -> dict[str, Any]:
    """A worker registration `body` with `mistake`'s fields laid over it (`{url}`: the body's own url)."""
    own = str(body.get("url", ""))
    laid = {k: v.replace(OWN_URL, own) if isinstance(v, str) else v for k, v in (mistake or {}).items()}
    return {**body, **laid}


@dataclass(frozen=True)
class RemoveWorker:
    target: str


@dataclass(frozen=True)
class StartEngine:
    """Start an engine that the scenario keeps out of the initial set (`Scenario.deferred_engines`)."""

    target: str


ROUTER = "router"


@dataclass(frozen=True)
class PauseRouter:
    """Pause the router process for `pause_s` (SIGSTOP, then SIGCONT), as a long garbage collection, CPU
    throttling or a VM migration does. The engines go on; what reached the router meanwhile waits for it, and
    its timers are all overdue at once when it resumes. Target: the router (`ROUTER`)."""

    pause_s: float
    target: str = ROUTER


EngineAction = (
    Restart | SlowStart | Crash | GracefulStop | Respawn | Die | Wedge | EngineFault | Heal | StartEngine
)
WorkerApiAction = PatchWorker | AddWorker | RemoveWorker
Action = EngineAction | WorkerApiAction | NetworkAction | PauseRouter

# Faults that end with their action: the engine is back (or the router was told, or resumed) when it is done.
ONE_SHOT: tuple[type, ...] = (
    Restart, SlowStart, StartEngine, PatchWorker, AddWorker, RemoveWorker, PauseRouter
)


def action_kind(action: Action) -> str:
    """Short lower-case name used in history records (`restart`, `wedge`, `fault:no_engine_id`...)."""
    if isinstance(action, EngineFault):
        return f"fault:{action.kind}"
    name = type(action).__name__
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def action_problems(action: Action) -> list[str]:
    """What is wrong with an action's own fields (network actions check themselves: `problems`)."""
    if isinstance(action, EngineFault):
        if action.kind not in ENGINE_FAULT_KINDS:
            return [f"unknown engine fault kind {action.kind!r} (known: {', '.join(ENGINE_FAULT_KINDS)})"]
        if action.kind == "wedge" and action.params.get("surface", "all") not in WEDGE_SURFACES:
            return [f"unknown wedge surface {action.params.get('surface')!r}"]
    if isinstance(action, Wedge) and action.surface not in WEDGE_SURFACES:
        return [f"unknown wedge surface {action.surface!r}"]
    if isinstance(action, Wedge) and action.mode == "sigstop" and action.surface != "all":
        return ["a SIGSTOP wedge stops the whole process: surface must be 'all'"]
    if isinstance(action, Heal) and action.kind is not None and action.kind not in ENGINE_FAULT_KINDS:
        return [f"unknown fault kind to heal {action.kind!r}"]
    if isinstance(action, GracefulStop) and not action.grace_s > 0:
        return [f"grace_s must be > 0, got {action.grace_s!r}"]
    if isinstance(action, AddWorker) and (action.mistake is None) != (action.refused is None):
        return ["an AddWorker mistake needs both `mistake` (the wrong fields) and `refused` (the field)"]
    if isinstance(action, AddWorker) and action.mistake is not None and action.refused not in action.mistake:
        return [f"refused={action.refused!r} names no field of the mistake {dict(action.mistake)!r}"]
    if isinstance(action, PauseRouter):
        out = [] if action.target == ROUTER else [f"a router pause targets {ROUTER!r}, got {action.target!r}"]
        return out + ([] if action.pause_s > 0 else [f"pause_s must be > 0, got {action.pause_s!r}"])
    return []
