"""Engine-id metadata reads (gRPC `GetServerInfo`) that hang, half-fail, fail once, or carry no id.

Each timeline forces a re-read: the prefill's health answers slowly for a second (probes time out, the worker
goes NotReady), and when health is healed the next good probe is followed by a metadata read, which meets the
fault. gRPC only: over HTTP the router reads ids from the Mooncake bootstrap server instead.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.scenario import AddWorker, After, At, EngineFault, Expect, Heal, Restart, Scenario, Step, Wedge
from harness.scenario.defaults import (
    ALL_SHAPES,
    BASE_EXPECT,
    CORE_EXPECT,
    SCALED_ENGINES,
    SCALED_ROUTER,
    SCALED_WORKLOAD,
    STRICT_LOCAL,
)

# Longer than the probe timeout of every preset (scaled 0.5 s, production 5 s): the probes fail in both.
_SLOW_HEALTH = EngineFault("prefill-0", "latency", {"surface": "health", "ms": 8000})


# zoo-4: a failed engine-id read at promotion (identity checks pushed out, so only the promotion reads).
_READ_AT_PROMOTION: dict[str, Any] = {
    "bugs": ("zoo-4",),
    "catches": ("stale_engine_id", "reread_no_retry"),
    "topologies": ALL_SHAPES,
    "connectors": ("mooncake",),
    "transports": ("grpc",),
    "router": replace(SCALED_ROUTER, identity_check_interval_s=30.0),
    "engines": SCALED_ENGINES,
}
_READ_AT_PROMOTION_EXPECT = (*BASE_EXPECT, Expect("handoff", {"grace_s": 2.5}))


def _force_reread(at: float) -> tuple[Step, Step]:
    return (
        Step("slow_health", _SLOW_HEALTH, At(at)),
        Step("heal_health", Heal("prefill-0", "latency"), After("slow_health", 1.0)),
    )


SCENARIOS = [
    Scenario(
        name="metadata_wedged",
        tags=("default",),
        description="GetServerInfo/GetModelInfo hang while health answers. The re-read after the worker "
        "comes back must be bounded by the probe timeout: a read with no deadline holds the probe slot for "
        "good and the worker is never probed again.",
        bugs=("zoo-2",),
        catches=("metadata_no_deadline",),
        topologies=ALL_SHAPES,
        connectors=("mooncake",),
        transports=("grpc",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(
            Step("wedge_metadata", Wedge("prefill-0", "metadata"), At(1.0)),
            *_force_reread(1.2),
            Step("heal_metadata", Heal("prefill-0", "wedge"), At(5.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("probe_schedule", {"kinds": ["wedge"]}),
            Expect("handoff", {"grace_s": 2.5}),
        ),
    ),
    Scenario(
        name="partial_metadata_read",
        tags=("default",),
        description="GetServerInfo fails while GetModelInfo answers (a partial read) when the router "
        "re-reads the id. The engine did not restart, so the known id stays right: clearing it leaves the "
        "router unable to mint and every decode recomputes silently.",
        bugs=("zoo-3",),
        catches=("partial_read_clears_id",),
        topologies=ALL_SHAPES,
        connectors=("mooncake",),
        transports=("grpc",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(
            Step("partial", EngineFault("prefill-0", "fail_server_info"), At(1.0)),
            *_force_reread(1.2),
            Step("heal_partial", Heal("prefill-0", "fail_server_info"), At(4.5)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            # Only the health outage excuses anything: a partial read is no reason to hand off wrongly.
            Expect("handoff_strict", {"grace_s": 1.0, "excuse_kinds": ["latency"]}),
            Expect("transfer_timeout"),
        ),
    ),
    Scenario(
        name="reread_fails_at_promotion",
        tags=("default",),
        suite_topologies=("1p1d",),
        description="The prefill restarts between probes (identity checks off), then its health stalls so "
        "the router re-reads at promotion, and that read fails (GetServerInfo unavailable). The router must "
        "keep retrying on later probes and pick up the new id once the read succeeds; one failed read must "
        "not leave the dead id in force for life.",
        **_READ_AT_PROMOTION,
        workload=replace(SCALED_WORKLOAD, duration_s=8.0),
        timeline=(
            Step("restart", Restart("prefill-0", down_s=0.0), At(1.0)),
            Step("slow_health", _SLOW_HEALTH, At(1.3)),
            Step("partial", EngineFault("prefill-0", "fail_server_info"), At(1.5)),
            Step("heal_health", Heal("prefill-0", "latency"), After("slow_health", 1.0)),
            Step("heal_partial", Heal("prefill-0", "fail_server_info"), After("heal_health", 1.0)),
        ),
        expect=_READ_AT_PROMOTION_EXPECT,
    ),
    Scenario(
        name="reread_fails_after_restart",
        description="The prefill restarts and stays down long enough for the probes to take it out; when it "
        "is back, its GetServerInfo fails for a while, so the re-read at promotion fails. The router must "
        "retry the read on later probes and hand off to the new id once it succeeds. The two-fault form of "
        "reread_fails_at_promotion (no health stall needed: the probes see this restart).",
        **_READ_AT_PROMOTION,
        workload=replace(SCALED_WORKLOAD, duration_s=10.0),
        timeline=(
            Step("restart", Restart("prefill-0", down_s=1.5), At(1.0)),
            # The restart holds later steps back until it is done: this lands as the prefill comes back,
            # before the probes promote it.
            Step("partial", EngineFault("prefill-0", "fail_server_info"), At(2.5)),
            Step("heal_partial", Heal("prefill-0", "fail_server_info"), At(4.0)),
        ),
        # Once the read can succeed the prefill must serve again: a router that never takes the restarted
        # prefill back (smg 1.10.1: every request failed from the restart on) hands nothing off to check.
        expect=(*_READ_AT_PROMOTION_EXPECT,
                Expect("recovery", {"max_recovery_s": 2.0, "kinds": ["fail_server_info"]})),
    ),
    Scenario(
        name="engine_without_id",
        tags=("default",),
        description="The prefill stops reporting a kv_engine_id (complete reads, empty id). The router keeps "
        "the id it knows and treats such a read as final: it must not re-read on every probe.",
        bugs=("zoo-5",),
        catches=("reread_every_probe",),
        topologies=("1p1d",),
        connectors=("mooncake",),
        transports=("grpc",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(
            Step("no_id", EngineFault("prefill-0", "no_engine_id"), At(1.0)),
            *_force_reread(1.2),
            Step("heal_no_id", Heal("prefill-0", "no_engine_id"), At(5.5)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("metadata_reads", {"target": "prefill-0", "from_fault": "heal_health", "max_reads": 3}),
            Expect("handoff_strict", {"grace_s": 1.0, "excuse_kinds": ["latency"]}),
        ),
    ),
    Scenario(
        name="prefill_joins_without_id",
        # A contract workout (a handoff the router cannot mint): simulated suite.
        tags=("default",),
        suite_worlds=("sim",),
        description="A second prefill joins through the worker API while it reports no kv_engine_id, so the "
        "router cannot mint a Mooncake handoff for it: each request it prefills is recorded as a skipped "
        "mint (reason no_engine_id) and its decode computes the prompt itself, never a handoff naming a "
        "made-up id. Once the prefill reports its id, the router learns it and mints again.",
        bugs=("a handoff minted with no id", "skipped mints miscounted"),
        topologies=("2p1d",),
        connectors=("mooncake",),
        transports=("grpc",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=6.0),
        unregistered_engines=("prefill-1",),
        timeline=(
            Step("no_id", EngineFault("prefill-1", "no_engine_id"), At(0.5)),
            Step("add", AddWorker("prefill-1"), At(1.0)),
            Step("heal_no_id", Heal("prefill-1", "no_engine_id"), At(3.0)),
        ),
        expect=(
            *CORE_EXPECT,
            Expect("no_local_compute", {"excuse_kinds": ["no_engine_id"], "grace_s": 1.5}),
            Expect("handoff", {"grace_s": 1.5, "excuse_kinds": ["no_engine_id"]}),
        ),
    ),
]
