"""Settings presets: the same scenario at the scaled settings it is written for, or at production settings.

`scaled` (the default in real time) is the scenario as written: short probe intervals and scaled timeouts
keep a real-time run a few seconds long while keeping a real deployment's ratios. `production` (the default
in simulation) is what users run: smg's defaults (60 s probes, 5 s probe timeout, 3 failures / 2 successes,
a 30 s identity check, circuit breaker 10 failures / 60 s open, 30 min request timeout) and vLLM's 480 s KV
transfer timeout.

Applying a preset to a scenario (`apply_preset`):
- a router or engine setting the scenario left at the scaled default takes the preset's value;
- a setting the scenario chose itself (a shorter request timeout, identity checks pushed out of the run) is
  a statement about the scenario's own timeline, so it scales with it;
- every time of the scenario's timeline scales by the preset's `time_scale`: step times and deadlines,
  outage lengths (restart down time, slow start, death, flapping), loading times, the workload's duration,
  think time, rate (so the run keeps its number of requests) and client deadline, and the checkers' windows
  (recovery bounds, grace and settle windows, lags). Latencies and bandwidths of links are physical: they
  stay. `time_scale` for production is 600: a scaled scenario detects an outage in one 0.3 s probe, the
  production router in three 60 s probes (180 s).
A scenario can override what a preset gives it: `Scenario(preset_overrides={"production": {...}})` with
`router`, `engines`, `workload` field values (applied after scaling) and `time_scale`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from harness.scenario.actions import Action
from harness.scenario.conditions import After, AllOf, At, Condition
from harness.scenario.settings import EngineSettings, RouterSettings, Workload

# The scaled reference values every shipped scenario starts from (harness/scenario/defaults.py exports them).
SCALED_ROUTER = RouterSettings(
    health_interval_s=0.3,
    health_timeout_s=0.5,
    failure_threshold=1,
    success_threshold=1,
    identity_check_interval_s=1.0,
    request_timeout_s=8.0,
)
SCALED_ENGINES = EngineSettings(transfer_timeout_s=2.0, kv_abort_timeout_s=30.0, handshake_timeout_s=1.0)

# Checker parameters that are windows on the scenario's timeline (they scale); the others (latency bounds,
# record lags, races) stay.
TIMELINE_PARAMS = frozenset({"max_recovery_s", "grace_s", "settle_s", "max_lag_s", "start_s", "end_s"})
# Action fields that are durations on the timeline.
ACTION_TIMES = frozenset({"down_s", "refuse_s", "exit_after_s", "up_s", "grace_s", "pause_s"})


@dataclass(frozen=True)
class SettingsPreset:
    name: str
    description: str
    router: Mapping[str, Any] = field(default_factory=dict)
    engines: Mapping[str, Any] = field(default_factory=dict)
    time_scale: float = 1.0
    # How often the harness reads the router's workers (its events: 5/3 of it) while a run lasts.
    observe_interval_s: float = 0.15


SCALED = SettingsPreset(
    "scaled",
    "the scenario as written: probes every 0.3 s, thresholds 1/1, 2 s KV transfer timeout "
    "(real-time default)",
)
PRODUCTION = SettingsPreset(
    "production",
    "smg's defaults (60 s probes, 5 s timeout, 3 failures / 2 successes, breaker 10 failures / 60 s open, "
    "30 min request timeout) and vLLM's 480 s KV transfer timeout; scenario times x600 (simulation default)",
    router={
        "health_interval_s": 60.0,
        "health_timeout_s": 5.0,
        "failure_threshold": 3,
        "success_threshold": 2,
        "identity_check_interval_s": 30.0,
        "request_timeout_s": 1800.0,
        "circuit_breaker_failures": 10,
        "circuit_breaker_open_s": 60.0,
    },
    engines={"transfer_timeout_s": 480.0, "kv_abort_timeout_s": 480.0, "handshake_timeout_s": 5.0},
    time_scale=600.0,
    observe_interval_s=2.0,
)
PRESETS: dict[str, SettingsPreset] = {p.name: p for p in (SCALED, PRODUCTION)}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


def preset(name: str) -> SettingsPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown settings preset {name!r} (known: {', '.join(PRESETS)})") from None


def _settings(current: Any, scaled: Any, values: Mapping[str, Any], k: float) -> Any:
    changes: dict[str, Any] = {}
    for f in fields(current):
        now, ref = getattr(current, f.name), getattr(scaled, f.name)
        if f.name in values and now == ref:
            changes[f.name] = values[f.name]
        elif (
            now != ref
            and f.name.endswith("_s")
            and isinstance(now, int | float)
            and not isinstance(now, bool)
        ):
            changes[f.name] = now * k
    return replace(current, **changes) if changes else current


def _engines(e: EngineSettings, values: Mapping[str, Any], k: float) -> EngineSettings:
    out = _settings(e, SCALED_ENGINES, values, k)
    per = {
        name: {
            key: (v * k if key.endswith("_s") and isinstance(v, int | float) else v)
            for key, v in over.items()
        }
        for name, over in e.per_engine.items()
    }
    return replace(out, per_engine=per)


def _workload(w: Workload, k: float) -> Workload:
    return replace(
        w,
        duration_s=w.duration_s * k,
        deadline_s=w.deadline_s * k,
        think_time_s=w.think_time_s * k,
        rate_rps=w.rate_rps / k,
        after_heal_s=None if w.after_heal_s is None else w.after_heal_s * k,
    )


def _condition(c: Condition, k: float) -> Condition:
    if isinstance(c, At):
        return At(c.t * k)
    if isinstance(c, After):
        return After(c.step, c.delay_s * k)
    if isinstance(c, AllOf):
        return AllOf(tuple(_condition(x, k) for x in c.conditions))
    return c


def _action(a: Action, k: float) -> Action:
    changes = {name: getattr(a, name) * k for name in ACTION_TIMES if hasattr(a, name)}
    return replace(a, **changes) if changes else a


def apply_preset(scenario: Any, p: SettingsPreset) -> Any:
    """The scenario at preset `p` (scaled: itself). See the module docstring for the rules."""
    if p.name == SCALED.name and not scenario.preset_overrides.get(p.name):
        return replace(scenario, preset=p.name)
    own = dict(scenario.preset_overrides.get(p.name) or {})
    k = float(own.get("time_scale", p.time_scale))
    steps = tuple(
        replace(
            st,
            when=_condition(st.when, k),
            action=_action(st.action, k),
            deadline_s=None if st.deadline_s is None else st.deadline_s * k,
        )
        for st in scenario.timeline
    )
    expect = tuple(
        replace(
            x,
            params={
                key: (v * k if key in TIMELINE_PARAMS and isinstance(v, int | float) else v)
                for key, v in x.params.items()
            },
        )
        for x in scenario.expect
    )
    router = _settings(scenario.router, SCALED_ROUTER, p.router, k)
    engines = _engines(scenario.engines, p.engines, k)
    workload = _workload(scenario.workload, k)
    router = replace(router, **dict(own.get("router") or {}))
    engines = replace(engines, **dict(own.get("engines") or {}))
    workload = replace(workload, **dict(own.get("workload") or {}))
    return replace(
        scenario,
        router=router,
        engines=engines,
        workload=workload,
        timeline=steps,
        expect=expect,
        min_duration_s=scenario.min_duration_s * k,
        ready_timeout_s=scenario.ready_timeout_s * k,
        preset=p.name,
        observe_interval_s=p.observe_interval_s,
    )
