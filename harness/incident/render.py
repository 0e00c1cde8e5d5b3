"""A replay plan as a scenario file: `SCENARIOS = [<the incident>]`, written at scaled settings (the
incident's times divided by the plan's time scale, so that the probe interval is about a second), with the
incident's own settings as its `production` preset (`--settings production` runs the incident as it was:
the default in simulation). The header lists the defaults used, what reading skipped, and the evidence of
each element."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from harness.incident.infer import GATEWAY_DEFAULTS
from harness.incident.plan import Plan, PlanFault
from harness.scenario import (
    At,
    Crash,
    Die,
    EngineFault,
    EngineSettings,
    Expect,
    GracefulStop,
    Heal,
    Respawn,
    Restart,
    RouterSettings,
    Scenario,
    SlowStart,
    Step,
    Wedge,
)
from harness.scenario.defaults import SCALED_ROUTER, SCALED_WORKLOAD
from harness.scenario.presets import ACTION_TIMES
from harness.search.source import module_head, to_source

# A PlanFault's `action` is the class's name.
_ACTIONS: dict[str, Any] = {a.__name__: a for a in (Restart, SlowStart, Crash, Respawn, Die, GracefulStop,
                                                     Wedge, Heal, EngineFault)}
# The gateway settings a plan holds (what the gateway's flags set).
ROUTER_FIELDS = tuple(GATEWAY_DEFAULTS)


def _scaled(v: Any, k: float) -> Any:
    return round(v / k, 3) if isinstance(v, float) else v


def _action(f: PlanFault, k: float) -> Any:
    params = {key: (round(float(v) / k, 3) if key in ACTION_TIMES else v) for key, v in f.params.items()}
    return _ACTIONS[f.action](f.target, **params)


def _own_router(plan: Plan) -> dict[str, Any]:
    """The plan's gateway settings; none of the breaker's when the gateway keeps its own."""
    own = {name: plan.router[name] for name in ROUTER_FIELDS if name in plan.router}
    if own.get("circuit_breaker_failures") is None:
        own.pop("circuit_breaker_open_s", None)
        own.pop("circuit_breaker_failures", None)
    return own


def _router(plan: Plan, k: float) -> RouterSettings:
    return RouterSettings(**{name: (_scaled(float(v), k) if name.endswith("_s") and v is not None else v)
                             for name, v in _own_router(plan).items()})


def scenario_name(plan: Plan, label: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_") or "bundle"
    return f"incident_{slug}"


def build_scenario(plan: Plan, label: str) -> Scenario:
    k = plan.time_scale
    steps: list[Step] = []
    used: dict[str, int] = {}
    for f in plan.faults:
        base = f.label or f"{f.action.lower()}_{f.target.replace('-', '_')}"
        used[base] = used.get(base, 0) + 1
        name = base if used[base] == 1 else f"{base}_{used[base]}"
        steps.append(Step(name, _action(f, k), At(round((f.at_s - plan.load_start) / k, 3))))
    workload = replace(
        SCALED_WORKLOAD,
        concurrency=plan.concurrency,
        duration_s=round(plan.duration_s / k, 3),
        deadline_s=round(plan.deadline_s / k, 3),
        chat_fraction=plan.chat_fraction,
    )
    expect = tuple(
        Expect(
            s.checker,
            {key: (_scaled(float(v), k) if key.endswith("_s") else v) for key, v in s.params.items()},
        )
        for s in plan.symptoms
    )
    own_router = _own_router(plan)
    # No gateway flag sets the reference router's identity check: it keeps its scaled ratio to the probes
    # (the production preset's 30 s would let it mint a stale id far longer than the replay allows).
    scaled_identity = SCALED_ROUTER.identity_check_interval_s
    if scaled_identity is not None:
        own_router["identity_check_interval_s"] = round(scaled_identity * k, 3)
    return Scenario(
        name=scenario_name(plan, label),
        description=f"Replay of incident {label}: " + "; ".join(s.why for s in plan.symptoms) + ".",
        topologies=(plan.topology,),
        connectors=(plan.connector,),
        transports=(plan.transport,),
        router=_router(plan, k),
        engines=EngineSettings(transfer_timeout_s=_scaled(float(plan.transfer_timeout_s), k)),
        workload=workload,
        timeline=tuple(steps),
        expect=expect,
        preset_overrides={
            "production": {
                "time_scale": k,
                "router": own_router,
                "engines": {"transfer_timeout_s": float(plan.transfer_timeout_s)},
            }
        },
    )


def render(plan: Plan, label: str, bundle_desc: str) -> str:
    scenario = build_scenario(plan, label)
    names: set[str] = set()
    body = to_source(scenario, names, 0)
    k = plan.time_scale
    lines = [
        f'"""Built by `pdchaos incident build` from {bundle_desc}.',
        "",
        f"Gateway: {plan.release or plan.gateway or 'not named in the bundle'}. Topology {plan.topology}, "
        f"{plan.connector}, {plan.transport}.",
        "Symptom (each with the checker that judges it):",
        *[f"- {s.checker}: {s.why} ({s.cite})" for s in plan.symptoms],
        "",
        f"Times: the incident's seconds divided by {k:g} (--settings scaled, real time); --settings "
        "production runs the incident's own times and settings (the simulation default).",
        "",
        "Named defaults (the bundle did not say):",
        *([f"- {d}" for d in plan.defaults] or ["- none"]),
        "",
        "Skipped while reading:",
        *([f"- {s}" for s in plan.skipped] or ["- nothing"]),
        *module_head(names),
        "# Where each element came from:",
        *[f"#   {element}: {src}" for element, src in plan.sources.items()],
        "# The faults, at incident time (seconds after the load began):",
        *[
            f"#   {f.at_s - plan.load_start:8.2f} s  {f.action} {f.target} {f.params or ''}  <- {f.cite}"
            for f in plan.faults
        ],
        f"INCIDENT = {body}",
        "",
        "SCENARIOS = [INCIDENT]",
        "",
    ]
    return "\n".join(lines)
