"""A scenario of your own (docs/howto/write-a-scenario.md): a decode restarts under load in a 1p2d topology.
The router must take it out while it is down, send its share to the other decode, and bring it back."""

from __future__ import annotations

from harness.scenario import At, Expect, Restart, Scenario, Step
from harness.scenario.defaults import BASE_EXPECT, SCALED_ENGINES, SCALED_ROUTER, SCALED_WORKLOAD

SCENARIOS = [
    Scenario(
        name="decode_restart",
        description="decode-1 restarts on the same address under load (down 0.6 s: a probe sees it). The "
        "other decode serves meanwhile; decode-1 is back in rotation soon after.",
        topologies=("1p2d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(Step("restart", Restart("decode-1", down_s=0.6), At(1.5)),),
        expect=(
            *BASE_EXPECT,
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["restart"]}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["restart"]}),
        ),
    ),
]
