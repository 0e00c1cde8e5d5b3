"""A short 1p1d scenario that fails: the decode answers 500 to everything while availability must stay
above 90% (the CLI and plugin tests' exit-code-1 case)."""

from __future__ import annotations

from harness.scenario import At, EngineFault, EngineSettings, Expect, RouterSettings, Scenario, Step, Workload

SCENARIOS = [
    Scenario(
        name="quick_fail",
        description="1p1d; the decode fails every request while availability must stay above 90%.",
        topologies=("1p1d",),
        connectors=("mooncake",),
        transports=("http",),
        router=RouterSettings(health_interval_s=0.1, health_timeout_s=0.5, request_timeout_s=5.0),
        engines=EngineSettings(transfer_timeout_s=1.0, kv_abort_timeout_s=10.0),
        workload=Workload(mode="closed", concurrency=2, duration_s=0.6, max_tokens=4, deadline_s=4.0),
        timeline=(
            Step("break", EngineFault("decode-0", "fail_requests", {"count": 10**5, "status": 500}), At(0.0)),
        ),
        expect=(Expect("availability", {"before": 0.0, "during": 0.9, "after": 0.0}),),
    )
]
