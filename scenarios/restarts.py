"""Engine restarts on the same address: the router must notice the new engine id (Mooncake) or at least not
send work to a dead engine, and every request must end cleanly."""

from __future__ import annotations

from dataclasses import replace

from harness.scenario import At, Expect, Restart, Scenario, SlowStart, Step
from harness.scenario.defaults import ALL_SHAPES, BASE_EXPECT, SCALED_ENGINES, SCALED_ROUTER, SCALED_WORKLOAD

_RESTART_EXPECT = (
    *BASE_EXPECT,
    # Grace covers the restart and one transfer timeout (a decode record is stamped when the pull ends).
    Expect("handoff", {"grace_s": 2.5}),
    Expect("transfer_timeout"),
    Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["restart"]}),
    Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["restart"]}),
)
# Mooncake only: the router holds the prefill's engine id, and its worker API must show the one in force, not
# the one read at registration (bug #14). With NIXL the id travels in the prefill's answer; the router keeps
# none.
_MOONCAKE_RESTART_EXPECT = (*_RESTART_EXPECT, Expect("reported_engine_id", {"max_lag_s": 3.0}))

SCENARIOS = [
    Scenario(
        name="prefill_restart_mooncake",
        tags=("default",),
        description="A Mooncake prefill restarts on the same address with a new engine id (down 0.6 s, so a "
        "probe fails). The router must re-read the id: minting the dead id makes every decode wait out the "
        "KV transfer timeout (vLLM #2491: 480 s at production settings; the scaled preset waits 2 s).",
        bugs=("#2491", "zoo-1"),
        catches=("stale_engine_id", "api_reports_first_id", "reports_first_id"),
        topologies=ALL_SHAPES,
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        # Long enough that, with the stale id bug, stale handoffs go on past the grace window whatever the
        # timing of the restart (the handoff checker then catches it in both worlds, not by luck).
        workload=replace(SCALED_WORKLOAD, duration_s=7.5),
        timeline=(Step("restart", Restart("prefill-0", down_s=0.6), At(1.5)),),
        expect=_MOONCAKE_RESTART_EXPECT,
    ),
    Scenario(
        name="connector_learned",
        # A contract workout (the router learns each worker's connector): simulated suite.
        tags=("default",),
        suite_worlds=("sim",),
        suite_topologies=("2p1d",),
        description="Over gRPC the router is not told the KV connector: it learns each worker's from its "
        "GetServerInfo, and must hand off exactly as when told (no request minted or relayed before it "
        "knows, none recomputed for it). Then a prefill restarts with a new engine id, so the learned worker "
        "goes through a re-read as well.",
        bugs=("#2491", "zoo-1"),
        topologies=("1p1d", "2p1d"),
        connectors=("mooncake", "nixl"),
        transports=("grpc",),
        router=replace(SCALED_ROUTER, tell_connector=False),
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=7.5),
        timeline=(Step("restart", Restart("prefill-0", down_s=0.6), At(1.5)),),
        expect=_RESTART_EXPECT,
    ),
    Scenario(
        name="prefill_restart_nixl",
        description="A NIXL prefill restarts on the same address (same NIXL port, new engine id). The router "
        "relays kv_transfer_params verbatim, so the decode handshakes with the new engine: no stale id, no "
        "silent recompute.",
        bugs=("#2491", "zoo-11"),
        topologies=ALL_SHAPES,
        connectors=("nixl",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(Step("restart", Restart("prefill-0", down_s=0.6), At(1.5)),),
        expect=_RESTART_EXPECT,
    ),
    Scenario(
        name="prefill_process_restart",
        description="The prefill process is killed and started again on the same ports (a new process, a new "
        "engine id, a new side-channel port), as an orchestrator restart would do.",
        bugs=("#2491", "zoo-1"),
        catches=("stale_engine_id",),
        topologies=("1p1d", "2p1d"),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        # Long enough that, with the stale id bug, stale handoffs go on past the grace window whatever the
        # timing of the restart (the handoff checker then catches it in both worlds, not by luck).
        workload=replace(SCALED_WORKLOAD, duration_s=7.5),
        timeline=(Step("restart", Restart("prefill-0", down_s=0.3, mode="process"), At(1.5)),),
        expect=_MOONCAKE_RESTART_EXPECT,
    ),
    Scenario(
        name="prefill_restart_between_probes",
        tags=("default",),
        suite_topologies=("1p1d",),
        description="A Mooncake prefill restarts in a few milliseconds, between two health probes (1 s "
        "apart): no probe fails, so only an identity check (engine id / uptime) can notice. Stale handoffs "
        "are allowed for one identity interval plus a transfer timeout, never after.",
        bugs=("zoo-13",),
        catches=("stale_engine_id", "no_identity_check"),
        topologies=ALL_SHAPES,
        connectors=("mooncake",),
        router=replace(SCALED_ROUTER, health_interval_s=1.0, identity_check_interval_s=1.0),
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=7.5),
        timeline=(Step("restart", Restart("prefill-0", down_s=0.0), At(1.5)),),
        expect=(
            *BASE_EXPECT,
            # identity interval 1 s + probe timeout 0.5 s + transfer timeout 2 s of the last stale request.
            Expect("handoff", {"grace_s": 3.5}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 3.5, "kinds": ["restart"]}),
        ),
    ),
    Scenario(
        name="decode_restart",
        description="A decode restarts on the same address and stays down long enough to be marked Failed "
        "(1.5 s at 0.3 s probes). It must rejoin (Failed is not terminal) and its fresh handshake cache must "
        "not break handoffs.",
        bugs=("zoo-6",),
        topologies=ALL_SHAPES,
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(Step("restart", Restart("decode-0", down_s=1.5), At(1.5)),),
        expect=_RESTART_EXPECT,
    ),
    Scenario(
        name="prefill_slow_start",
        description="A Mooncake prefill restarts and keeps its ports closed for 1.5 s while it loads "
        "(connection refused), then serves with a new engine id: the router must wait it out and re-read the "
        "id.",
        bugs=("#2491", "zoo-1", "zoo-6"),
        catches=("stale_engine_id",),
        topologies=("1p1d", "2p1d"),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        # Long enough that, with the stale id bug, stale handoffs go on past the grace window whatever the
        # timing of the restart (the handoff checker then catches it in both worlds, not by luck).
        workload=replace(SCALED_WORKLOAD, duration_s=8.5),
        timeline=(Step("slow_start", SlowStart("prefill-0", refuse_s=1.5), At(1.5)),),
        expect=(
            *BASE_EXPECT,
            Expect("handoff", {"grace_s": 2.5}),
            Expect("transfer_timeout"),
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["slow_start"]}),
        ),
    ),
    Scenario(
        name="prefill_restart_under_load",
        description="Six clients keep the router busy while the Mooncake prefill restarts three times. "
        "Requests caught by a restart may fail, but each must get an HTTP answer (a clear error) before its "
        "deadline: a dropped connection is a lost request.",
        bugs=("#2491", "zoo-1"),
        catches=("stale_engine_id",),
        topologies=("1p2d", "2p1d"),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        # Three seconds apart: a request whose prefill finished as the restart began (its server lets it
        # finish) waits out the decode's 2 s transfer timeout on the old side channel, and the clients it
        # held must be back before the next restart for the availability window to see anything.
        workload=replace(SCALED_WORKLOAD, concurrency=6, duration_s=10.0),
        timeline=(
            Step("restart_1", Restart("prefill-0", down_s=0.6), At(1.0)),
            Step("restart_2", Restart("prefill-0", down_s=0.6), At(4.0)),
            Step("restart_3", Restart("prefill-0", down_s=0.6), At(7.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("handoff", {"grace_s": 2.5}),
            Expect("transfer_timeout"),
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["restart"]}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["restart"]}),
            Expect("reported_engine_id", {"max_lag_s": 3.0}),
        ),
    ),
]
