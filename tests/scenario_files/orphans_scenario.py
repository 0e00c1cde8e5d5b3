"""Scenario file for the no-orphan tests (tests/test_orphans.py): a 1p1d run long enough to be interrupted
mid-way, whose prefill is killed and respawned as a new process first, so the run owns a replaced pid too."""

from __future__ import annotations

from harness.scenario import At, EngineSettings, Expect, Restart, RouterSettings, Scenario, Step, Workload

SCENARIOS = [
    Scenario(
        name="orphans_long_run",
        description="Long 1p1d load with a process restart; interrupted by the no-orphan tests.",
        topologies=("1p1d",),
        connectors=("mooncake",),
        transports=("http",),
        router=RouterSettings(health_interval_s=0.2, health_timeout_s=0.5, request_timeout_s=5.0),
        engines=EngineSettings(transfer_timeout_s=1.0, kv_abort_timeout_s=10.0),
        workload=Workload(
            mode="closed", concurrency=1, duration_s=60.0, max_tokens=4, deadline_s=5.0, think_time_s=0.05
        ),
        timeline=(Step("respawn", Restart("prefill-0", down_s=0.1, mode="process"), At(0.2)),),
        # Only what an interrupt cannot spoil: the partial report must come out unknown (run cut short),
        # not fail because a handoff raced the process restart.
        expect=(Expect("nothing_lost"),),
    )
]
