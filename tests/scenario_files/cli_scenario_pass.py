"""A short fault-free 1p1d scenario that passes: the CLI and plugin tests' exit-code-0 case."""

from __future__ import annotations

from harness.scenario import EngineSettings, Expect, RouterSettings, Scenario, Workload

SCENARIOS = [
    Scenario(
        name="quick_pass",
        description="1p1d, 0.6 s of load, no fault: every request must succeed with the right text.",
        topologies=("1p1d",),
        connectors=("mooncake",),
        transports=("http",),
        router=RouterSettings(health_interval_s=0.1, health_timeout_s=0.5, request_timeout_s=5.0),
        engines=EngineSettings(transfer_timeout_s=1.0, kv_abort_timeout_s=10.0),
        workload=Workload(mode="closed", concurrency=2, duration_s=0.6, max_tokens=4, deadline_s=4.0),
        expect=(Expect("nothing_lost"), Expect("output"), Expect("availability", {"before": 1.0})),
        tags=("default",),
    )
]
