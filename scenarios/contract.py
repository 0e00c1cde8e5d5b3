"""Contract workouts: runs that take a router through the parts of its contract the outage scenarios seldom
reach (a circuit breaker's open, half-open and closed states; thresholds above one). What they check is
mostly the contract checkers' (every scenario's core expectations): any router move the contract does not
allow fails them. They are in the default suite in simulation, where they cost no wall time."""

from __future__ import annotations

from dataclasses import replace

from harness.scenario import (
    At,
    Die,
    EngineFault,
    Expect,
    Heal,
    PauseRouter,
    Respawn,
    Restart,
    Scenario,
    Step,
    Wedge,
)
from harness.scenario.defaults import (
    BASE_EXPECT,
    CORE_EXPECT,
    SCALED_ENGINES,
    SCALED_ROUTER,
    SCALED_WORKLOAD,
    STRICT_LOCAL,
)

SCENARIOS = [
    Scenario(
        name="breaker_trials",
        bugs=("breaker bookkeeping", "client mistake charged to an engine"),
        catches=("retry_failed_requests", "error_as_200"),
        tags=("default",),
        suite_worlds=("sim",),
        description="One of two decodes answers its next 12 requests with HTTP 500, each 0.4 s late, under "
        "a circuit breaker of 3 failures kept open 1 s. Its breaker opens when the third failure comes back "
        "(not when that request was sent), then lets one trial request through each time its open period "
        "ends; each failed trial opens it again, until a trial succeeds and closes it. Meanwhile "
        "the other decode serves everything else, and only the requests the breaker let through fail. One "
        "request in five names a model no engine serves (over HTTP the prefill answers 404): the client's "
        "mistake, relayed as such and never counted against an engine's breaker.",
        topologies=("1p2d",),
        connectors=("mooncake",),
        router=replace(SCALED_ROUTER, circuit_breaker_failures=3, circuit_breaker_open_s=1.0),
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=16.0, mistake_fraction=0.2),
        timeline=(
            Step("slow", EngineFault("decode-0", "latency", {"surface": "generate", "ms": 400}), At(1.0)),
            Step("fail", EngineFault("decode-0", "fail_requests", {"count": 12, "status": 500}), At(1.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("handoff"),
            Expect("availability", {"before": 0.95, "after": None, "kinds": ["fail_requests"]}),
        ),
    ),
    Scenario(
        name="thresholds_of_two",
        bugs=("threshold off-by-one", "zoo-6"),
        catches=("failed_terminal", "retry_failed_requests"),
        tags=("default",),
        suite_worlds=("sim",),
        description="Thresholds above one (2 failed probes take a worker out, 2 good ones bring it back): "
        "one decode's health check hangs for 1.2 s, then the other decode dies (health 503) and is started "
        "again 2 s later. Each goes out only after two failed probes and back only after two good ones, "
        "while the other decode carries the load.",
        topologies=("1p2d",),
        connectors=("mooncake",),
        router=replace(SCALED_ROUTER, failure_threshold=2, success_threshold=2),
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=9.0),
        timeline=(
            Step("stall", Wedge("decode-0", "health"), At(1.0)),
            Step("resume", Heal("decode-0", "wedge"), At(2.2)),
            Step("die", Die("decode-1", exit_after_s=0.8), At(3.5)),
            Step("respawn", Respawn("decode-1"), At(5.5)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("handoff", {"grace_s": 2.5}),
            Expect("recovery", {"kinds": ["die"], "max_recovery_s": 3.0}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["die"]}),
        ),
    ),
    Scenario(
        name="router_paused",
        bugs=("probe slot bookkeeping", "a stop of the gateway process"),
        tags=("default",),
        suite_worlds=("sim",),
        description="The router's process is stopped for 2.5 s (SIGSTOP, then SIGCONT: a long garbage "
        "collection, CPU throttling, a VM migration) while one decode's health check hangs, so a probe of "
        "it is in flight across the pause, longer than a probe may hold its slot (two probe timeouts). When "
        "the router resumes it must free that slot and count the probe failed, probe again on schedule, and "
        "serve the requests that waited for it through the healthy decode; the hung one rejoins once it "
        "answers.",
        topologies=("1p2d",),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=8.0),
        timeline=(
            Step("stall", Wedge("decode-1", "health"), At(1.0)),
            Step("pause", PauseRouter(2.5), At(2.0)),
            Step("resume", Heal("decode-1", "wedge"), At(5.5)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("probe_schedule", {"kinds": ["wedge"]}),
            Expect("handoff"),
            Expect("recovery", {"kinds": ["wedge"], "max_recovery_s": 3.0}),
        ),
    ),
    Scenario(
        name="router_paused_during_read",
        bugs=("probe slot bookkeeping", "a stop of the gateway process"),
        tags=("default",),
        suite_worlds=("sim",),
        description="The prefill's GetServerInfo hangs after its health stalled, so each probe of it carries "
        "a metadata re-read that only its timeout ends. The router's process is stopped for 2 s while such "
        "a read is on the way. When it resumes, the read has outlived its probe's slot: the router must free "
        "the slot and count the read timed out, go on probing on schedule, and keep serving on the id it "
        "knows (the engine did not restart).",
        topologies=("1p1d",),
        connectors=("mooncake",),
        transports=("grpc",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=8.0),
        timeline=(
            Step("wedge_metadata", Wedge("prefill-0", "metadata"), At(1.0)),
            Step("slow_health", EngineFault("prefill-0", "latency", {"surface": "health", "ms": 8000}),
                 At(1.2)),
            Step("heal_health", Heal("prefill-0", "latency"), At(2.2)),
            Step("pause", PauseRouter(2.0), At(3.0)),
            Step("heal_metadata", Heal("prefill-0", "wedge"), At(6.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("probe_schedule", {"kinds": ["wedge"]}),
            Expect("handoff", {"grace_s": 2.5}),
        ),
    ),
    Scenario(
        name="probe_slots_kept",
        bugs=("probe slot bookkeeping", "a probe limit not kept"),
        tags=("default",),
        suite_worlds=("sim",),
        description="The router may have one health probe or engine-id read open at a time "
        "(max_concurrent_health_checks 1), with thresholds of 2. Every engine answers its health check in "
        "60 ms and the prefill its id reads in 150 ms, so probes that should wait their turn would overlap. "
        "A decode restarts in the middle: the router takes it out after two failed probes and back after two "
        "good ones, probing one engine at a time throughout.",
        topologies=("1p2d",),
        connectors=("mooncake",),
        router=replace(SCALED_ROUTER, max_concurrent_health_checks=1, failure_threshold=2,
                       success_threshold=2),
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=8.0),
        timeline=(
            *(Step(f"slow_health_{e}", EngineFault(e, "latency", {"surface": "health", "ms": 60}), At(0.5))
              for e in ("prefill-0", "decode-0", "decode-1")),
            Step("slow_reads", EngineFault("prefill-0", "latency", {"surface": "metadata", "ms": 150}),
                 At(0.5)),
            Step("restart", Restart("decode-1", down_s=1.5), At(3.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("handoff"),
        ),
    ),
    Scenario(
        name="regular_mode_restart",
        bugs=("regular mode: a request path PD scenarios never take",),
        tags=("default",),
        suite_worlds=("sim",),
        description="The router in regular mode (no PD: each request runs whole on one engine, with the "
        "client's own parameters and no handoff parameters) in front of two engines. One is restarted "
        "under load and comes back after 1.5 s: the router takes it out, the other serves every request "
        "meanwhile, and it rejoins once Ready. One request in five names a model no engine serves: the "
        "client's mistake, relayed as such. Gateways run their PD mode here; this runs on the reference "
        "router.",
        topologies=("2r",),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=7.0, mistake_fraction=0.2),
        timeline=(Step("restart", Restart("regular-1", down_s=1.5), At(2.0)),),
        expect=(
            *CORE_EXPECT,
            Expect("recovery", {"kinds": ["restart"], "max_recovery_s": 3.0}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["restart"]}),
        ),
    ),
    Scenario(
        name="client_stop_strings",
        bugs=("a prefill leg that keeps the client's stop strings",
              "a prefill leg not told to ignore end of sequence"),
        # Both worlds: a real gateway is judged in real time only, and this costs two 3-second cells.
        tags=("default",),
        description="No fault. A third of the requests carry a stop string: half the first word of their "
        "own answer, so the answer ends before it (vLLM cuts the text where a stop string begins), half one "
        "the answer never holds. A fifth get an empty answer: their seed makes the model's first token end "
        "of sequence. The prefill leg must carry no stop string and must ignore end of sequence: a prefill "
        "that either ends short of its one-token length cap frees its KV at once, as vLLM's connectors do "
        "(vLLM checks end of sequence before the cap). A Mooncake decode sent to pull it then waits out its "
        "transfer timeout (480 s in production); a NIXL one gets no params and computes the prompt again. "
        "The decode leg keeps the stop strings, and every answer is cut where they begin (over gRPC by the "
        "router, which builds the text from the token ids and holds back what may start a stop string).",
        topologies=("1p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=3.0, stop_fraction=0.34, eos_fraction=0.2),
        timeline=(),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("handoff_strict"),
            Expect("transfer_timeout"),
        ),
    ),
]
