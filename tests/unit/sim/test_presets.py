"""Settings presets: what `production` does to a scenario written at scaled settings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.scenario import (
    PRESETS,
    After,
    At,
    EngineSettings,
    Expect,
    LinkFlap,
    LinkLatency,
    Restart,
    Scenario,
    ScenarioError,
    Step,
    Workload,
    apply_preset,
    preset,
    validate,
)
from harness.scenario.presets import PRODUCTION, SCALED, SCALED_ENGINES, SCALED_ROUTER

BASE = Scenario(
    name="p",
    description="",
    topologies=("1p1d",),
    # NIXL: a Mooncake prefill's side channel moves at its restart, which real time cannot proxy.
    connectors=("nixl",),
    router=SCALED_ROUTER,
    engines=SCALED_ENGINES,
    workload=Workload(mode="open", rate_rps=40.0, duration_s=6.0, deadline_s=6.0, think_time_s=0.02),
    timeline=(
        Step("restart", Restart("prefill-0", down_s=0.6), At(1.5), deadline_s=3.0),
        Step("slow", LinkLatency("prefill-0", "side_channel", latency_ms=400), After("restart", 0.5)),
        Step("flap", LinkFlap("prefill-0", down_s=0.5, up_s=0.25, cycles=2), At(4.0)),
    ),
    expect=(Expect("recovery", {"max_recovery_s": 3.0}), Expect("prompt_503", {"max_503_latency_s": 1.0})),
)


def test_scaled_is_the_scenario_as_written() -> None:
    out = apply_preset(BASE, SCALED)
    assert replace(out, preset=BASE.preset) == BASE and out.preset == "scaled"


def test_production_takes_the_gateway_defaults_where_the_scenario_took_the_scaled_ones() -> None:
    out = apply_preset(BASE, PRODUCTION)
    r, e = out.router, out.engines
    assert (r.health_interval_s, r.health_timeout_s, r.failure_threshold, r.success_threshold) == (
        60.0,
        5.0,
        3,
        2,
    )
    assert (r.identity_check_interval_s, r.request_timeout_s) == (30.0, 1800.0)
    assert (r.circuit_breaker_failures, r.circuit_breaker_open_s) == (10, 60.0)
    assert (e.transfer_timeout_s, e.kv_abort_timeout_s, e.handshake_timeout_s) == (480.0, 480.0, 5.0)
    assert out.preset == "production" and out.observe_interval_s == PRODUCTION.observe_interval_s
    validate(out)


def test_production_scales_the_timeline_and_keeps_physical_quantities() -> None:
    k = PRODUCTION.time_scale
    out = apply_preset(BASE, PRODUCTION)
    restart, slow, flap = out.timeline
    assert restart.when == At(1.5 * k) and restart.deadline_s == 3.0 * k and restart.action.down_s == 0.6 * k
    assert slow.when == After("restart", 0.5 * k)
    assert slow.action.latency_ms == 400  # a link's latency is physical: it stays
    assert (flap.action.down_s, flap.action.up_s, flap.action.cycles) == (0.5 * k, 0.25 * k, 2)
    w = out.workload
    assert (w.duration_s, w.deadline_s, w.think_time_s) == (6.0 * k, 6.0 * k, 0.02 * k)
    assert w.rate_rps == pytest.approx(40.0 / k)  # the run keeps its number of requests
    recovery, prompt = out.expect
    assert recovery.params["max_recovery_s"] == 3.0 * k
    assert prompt.params["max_503_latency_s"] == 1.0  # a latency bound, not a window: it stays


def test_a_setting_the_scenario_chose_scales_with_its_timeline() -> None:
    own = replace(
        BASE,
        router=replace(SCALED_ROUTER, request_timeout_s=2.0, identity_check_interval_s=30.0),
        engines=EngineSettings(
            transfer_timeout_s=2.0,
            kv_abort_timeout_s=30.0,
            handshake_timeout_s=1.0,
            per_engine={"decode-0": {"load_time_s": 4.0}},
        ),
    )
    out = apply_preset(own, PRODUCTION)
    k = PRODUCTION.time_scale
    assert out.router.request_timeout_s == 2.0 * k
    assert out.router.identity_check_interval_s == 30.0 * k  # "identity checks off" stays off
    assert out.router.health_interval_s == 60.0
    assert out.engines.per_engine["decode-0"]["load_time_s"] == 4.0 * k


def test_a_scenario_overrides_what_a_preset_gives_it() -> None:
    own = replace(
        BASE, preset_overrides={"production": {"time_scale": 10, "router": {"failure_threshold": 1}}}
    )
    out = apply_preset(own, PRODUCTION)
    assert out.router.failure_threshold == 1 and out.timeline[0].when == At(15.0)
    with pytest.raises(ScenarioError, match="unknown preset"):
        validate(replace(BASE, preset_overrides={"staging": {}}))


def test_preset_names() -> None:
    assert set(PRESETS) == {"scaled", "production"}
    with pytest.raises(ValueError, match="unknown settings preset"):
        preset("fast")
