"""Outages: engines that load slowly, crash, or wedge; worker property updates through the router's API."""

from __future__ import annotations

from dataclasses import replace

from harness.scenario import (
    AddWorker,
    After,
    At,
    Crash,
    Die,
    EngineFault,
    EngineSettings,
    Expect,
    Heal,
    PatchWorker,
    RemoveWorker,
    Respawn,
    Scenario,
    Step,
    Wedge,
    WorkerStatus,
)
from harness.scenario.defaults import (
    ALL_SHAPES,
    BASE_EXPECT,
    CORE_EXPECT,
    SCALED_ENGINES,
    SCALED_ROUTER,
    SCALED_WORKLOAD,
    STRICT_LOCAL,
)

_LOADING = EngineSettings(
    transfer_timeout_s=SCALED_ENGINES.transfer_timeout_s,
    kv_abort_timeout_s=SCALED_ENGINES.kv_abort_timeout_s,
    handshake_timeout_s=SCALED_ENGINES.handshake_timeout_s,
    per_engine={"decode-0": {"load_time_s": 4.0}},
)

# A circuit breaker that the refused legs of a crash open (2 failures) and that stays open past the run unless
# the worker's recovery re-admits it.
# One refused leg opens the breaker: with two, a leg refused before the suspect probe takes the worker out is
# sometimes the only one in real time, and a breaker that never opened shows no re-admission (a race).
_BREAKER_ROUTER = replace(SCALED_ROUTER, circuit_breaker_failures=1, circuit_breaker_open_s=30.0)
_GOLD = {"tier": "gold"}
# A respawned engine takes ~2 s to start: leave time after it to judge recovery and availability.
_LONGER = replace(SCALED_WORKLOAD, duration_s=8.0)



# Open-loop load over two workers of a role, for the policy workouts.
_OPEN_LOAD = replace(SCALED_WORKLOAD, mode="open", rate_rps=40.0, duration_s=3.0)


def _spread_expect(max_skew: float) -> tuple[Expect, ...]:
    """No fault: every request handed off correctly, each worker of a role within `max_skew` of its share."""
    return (*CORE_EXPECT, STRICT_LOCAL, Expect("balance", {"max_skew": max_skew}), Expect("handoff_strict"),
            Expect("availability", {"before": 1.0}))


# One of two prefills down (crashed, respawned): only the legs on it when it died may fail (at most the
# workload's concurrency, 3): those are counted apart; every request sent after the crash must succeed.
_ONE_PREFILL_DOWN_EXPECT = (
    *BASE_EXPECT,
    Expect("availability", {"during": 1.0, "after": 0.95, "settle_s": 1.0, "kinds": ["crash"],
                            "exclude_in_flight_at_fault": True}),
    Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["crash"]}),
    Expect("handoff", {"grace_s": 2.5}),
    Expect("transfer_timeout"),
)


# Registrations the reference router's worker API refuses (CONTRACTS §2), one field wrong in each: the field
# at fault and the wrong fields laid over a right body. Each reaches another of its checks.
_WRONG_REGISTRATIONS: tuple[tuple[str, dict[str, object]], ...] = (
    ("url", {"url": "ftp://127.0.0.1:8000"}),
    ("url", {"url": "grpc://127.0.0.1"}),
    ("url", {"url": "http://:8000"}),
    ("url", {"url": "http://user:secret@127.0.0.1:8000"}),
    ("bootstrap_port", {"bootstrap_port": "8998"}),
    ("bootstrap_port", {"bootstrap_port": 65536}),
    ("role", {"role": "mixer"}),
    ("connector", {"connector": "rdma"}),
    ("labels", {"labels": {"tier": 1}}),
    ("dp_size", {"dp_size": 0}),
    ("dp_size", {"dp_size": "2"}),
    ("engine_id", {"engine_id": ""}),
    ("kv_role", {"kv_role": 5}),
    ("shard", {"shard": 1}),
)


def _wrong_registrations(engine: str, start_s: float) -> tuple[Step, ...]:
    """Each of _WRONG_REGISTRATIONS as a call 10 ms after the one before it."""
    return tuple(
        Step(f"wrong_{i}_{field}", AddWorker(engine, wrong, refused=field), At(round(start_s + i / 100, 3)))
        for i, (field, wrong) in enumerate(_WRONG_REGISTRATIONS))


def _crash_and_respawn(engine: str) -> tuple[Step, ...]:
    """SIGKILL at 1.5 s, started again on the same address at 3.5 s (marked Failed by then)."""
    return (Step("crash", Crash(engine), At(1.5)), Step("respawn", Respawn(engine), At(3.5)))


SCENARIOS = [
    Scenario(
        name="worker_registered_while_loading",
        # A contract workout (Pending, Failed, back to Ready): in the simulated default suite.
        tags=("default",),
        suite_worlds=("sim",),
        suite_topologies=("1p1d",),
        description="The router is started with a decode that is still loading (connections refused for 4 "
        "s): it goes Pending, then Failed after 10 probes, and must still become Ready once the engine "
        "serves.",
        bugs=("zoo-6",),
        topologies=ALL_SHAPES,
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=_LOADING,
        workload=replace(SCALED_WORKLOAD, duration_s=3.0),
        ready_timeout_s=15.0,
        expect=(*BASE_EXPECT, Expect("handoff"), Expect("availability", {"before": 0.95})),
    ),
    Scenario(
        name="one_of_two_prefills_down",
        tags=("default",),
        suite_connectors=("mooncake",),
        description="One of two prefills crashes and is respawned 2 s later. The other prefill carries the "
        "load with no client error: a leg refused before the router's probes see the crash is retried on the "
        "other prefill. Only legs the dead engine had already received fail (never run twice: 0-2 of the "
        "~90 requests of the window).",
        bugs=("zoo-6",),
        topologies=("2p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=_crash_and_respawn("prefill-1"),
        expect=_ONE_PREFILL_DOWN_EXPECT,
    ),
    Scenario(
        name="sole_prefill_down",
        tags=("default",),
        suite_topologies=("1p1d",),
        description="The only prefill crashes: requests get a prompt 503 (not 404/500, not a hang, not a "
        "decode running them alone) while it is down; it is respawned on the same address 2 s later (marked "
        "Failed by then) and must rejoin at once, its circuit breaker (opened by the refused legs) "
        "re-admitting it with its probes.",
        bugs=("zoo-8", "zoo-6"),
        catches=("failed_terminal", "no_worker_404", "breaker_no_readmit", "prefill_on_decode",
                 "error_as_200"),
        topologies=("1p1d", "1p2d"),
        connectors=("mooncake", "nixl"),
        router=_BREAKER_ROUTER,
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=_crash_and_respawn("prefill-0"),
        expect=(
            *CORE_EXPECT,
            # The outage is no reason for a local prefill: a request either gets a 503 or is handed off.
            STRICT_LOCAL,
            Expect("prompt_503", {"max_503_latency_s": 1.0, "kinds": ["crash"]}),
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["crash"]}),
            Expect("handoff", {"grace_s": 2.5}),
            Expect("transfer_timeout"),
        ),
    ),
    Scenario(
        name="sole_decode_down",
        # The decode side of sole_prefill_down (a contract workout: no Ready decode while prefills are up).
        tags=("default",),
        suite_worlds=("sim",),
        suite_topologies=("2p1d",),
        suite_connectors=("mooncake",),
        description="The only decode crashes while the prefills stay up: requests get a prompt 503 (not a "
        "prefill leg whose KV nobody pulls, not a hang) while it is down; it is respawned on the same "
        "address 2 s later and must rejoin at once, its circuit breaker re-admitting it with its probes.",
        bugs=("zoo-8", "zoo-6"),
        catches=("failed_terminal", "no_worker_404", "breaker_no_readmit"),
        topologies=("1p1d", "2p1d"),
        connectors=("mooncake", "nixl"),
        router=_BREAKER_ROUTER,
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=_crash_and_respawn("decode-0"),
        expect=(
            *CORE_EXPECT,
            Expect("prompt_503", {"max_503_latency_s": 1.0, "kinds": ["crash"]}),
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["crash"]}),
            Expect("handoff", {"grace_s": 2.5}),
        ),
    ),
    Scenario(
        name="last_decode_removed",
        # A contract workout (a role left without workers through the API): simulated suite.
        tags=("default",),
        suite_worlds=("sim",),
        description="The only decode is removed through the worker API mid-traffic, then registered again "
        "2 s later. With no decode left the router must answer at once with a 503 (a role with no worker "
        "at all, not a crash and not a hang), and serve through the decode again once it is back and Ready.",
        bugs=("a role with no worker left", "a drained worker never removed"),
        topologies=("1p1d",),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=(
            Step("remove", RemoveWorker("decode-0"), At(1.0)),
            Step("add", AddWorker("decode-0"), After("remove", 2.0)),
        ),
        expect=(
            # request_contract (in CORE_EXPECT) holds each 503 of the gap to a refusal decided at once.
            *CORE_EXPECT,
            Expect("handoff", {"grace_s": 2.5}),
        ),
    ),
    Scenario(
        name="property_update_keeps_handoff",
        tags=("default",),
        suite_topologies=("1p1d",),
        description="Labels and priority of the prefill and the decode are updated through the worker API "
        "mid-traffic. The update must keep the KV transfer config (connector, bootstrap port, engine id): "
        "handoffs go on without a single recompute. Three mistaken updates (a priority that is not an "
        "integer, labels that are not text, a connector no update may change) must each be refused with "
        "a 4xx naming the field, and change nothing.",
        bugs=("zoo-7",),
        catches=("patch_drops_kv_config",),
        topologies=ALL_SHAPES,
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(
            Step("patch_prefill", PatchWorker("prefill-0", {"labels": _GOLD, "priority": 7}), At(1.5)),
            Step("bad_priority", PatchWorker("decode-0", {"priority": "high"}, refused="priority"), At(1.8)),
            Step("bad_labels", PatchWorker("prefill-0", {"labels": {"tier": 1}}, refused="labels"), At(2.0)),
            Step("bad_field", PatchWorker("prefill-0", {"connector": "nixl"}, refused="connector"), At(2.2)),
            Step("patch_decode", PatchWorker("decode-0", {"labels": _GOLD, "priority": 3}), At(2.5)),
        ),
        expect=(
            *CORE_EXPECT,
            Expect("worker_api"),
            STRICT_LOCAL,
            Expect("handoff_strict", {"excuse_kinds": []}),
            Expect("transfer_timeout"),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 0.0}),
        ),
    ),
    Scenario(
        name="wedged_decode_generate",
        tags=("default",),
        suite_topologies=("1p2d",),
        description="A decode accepts generate requests and never answers (2.5 s). The router's request "
        "timeout must answer those requests with an error before the client gives up, without stalling "
        "requests to other workers or the health loop.",
        bugs=("zoo-12",),
        catches=("no_request_timeout",),
        topologies=("1p1d", "1p2d"),
        connectors=("mooncake",),
        router=replace(SCALED_ROUTER, request_timeout_s=2.0),
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(
            Step("wedge_generate", Wedge("decode-0", "generate"), At(1.5)),
            Step("heal_generate", Heal("decode-0", "wedge"), At(4.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("probe_schedule", {"kinds": ["wedge"]}),
            Expect("availability", {"before": 0.95, "after": 0.9, "settle_s": 1.0, "kinds": ["wedge"]}),
            Expect("handoff", {"grace_s": 3.0}),
        ),
    ),
    Scenario(
        name="hung_decode_ejected",
        tags=("default",),
        description="One of two decodes hangs on generate for 5 s while its health check still answers 200 "
        "(an engine core stuck behind a live API server). Probes cannot see it, so the router must take it "
        "out on its request timeouts (circuit breaker: 2 timeouts open it for 10 s): after the first few "
        "requests caught on it, the other decode serves everything. Requests for the healthy decode are "
        "never held up by the hung one.",
        bugs=("zoo-12",),
        catches=("no_outlier_ejection", "wedged_stalls_all", "retry_transport_failures"),
        topologies=("1p2d",),
        connectors=("mooncake",),
        router=replace(
            SCALED_ROUTER, request_timeout_s=1.0, circuit_breaker_failures=2, circuit_breaker_open_s=10.0
        ),
        engines=SCALED_ENGINES,
        workload=replace(SCALED_WORKLOAD, duration_s=8.0, deadline_s=2.5),
        timeline=(
            Step("hang", Wedge("decode-0", "generate"), At(1.0)),
            Step("unhang", Heal("decode-0", "wedge"), At(6.0)),
        ),
        expect=(
            *CORE_EXPECT,
            # Only the requests sent to the hung decode before its breaker opened fail (a few: at most one per
            # client before the second timeout): 9 in 10 of the window's requests succeed.
            Expect("availability", {"before": 0.95, "during": 0.9, "after": 0.95, "settle_s": 0.3,
                                    "kinds": ["wedge"]}),
            # Those that succeed went to the healthy decode and were not held up behind the hung one.
            Expect("latency", {"max_latency_s": 0.6, "kinds": ["wedge"]}),
            Expect("handoff", {"grace_s": 1.5}),
        ),
    ),
    Scenario(
        name="decode_process_frozen",
        description="A decode process is frozen (SIGSTOP: its sockets accept, nothing answers) for 2.5 s, "
        "then resumed. Probes of it time out without holding the health loop; requests caught on it end with "
        "the router's request timeout; the other decode keeps serving.",
        bugs=("zoo-12", "zoo-2"),
        topologies=("1p2d",),
        connectors=("mooncake", "nixl"),
        router=replace(SCALED_ROUTER, request_timeout_s=2.0),
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(
            Step("freeze", Wedge("decode-0", mode="sigstop"), At(1.5)),
            Step("thaw", Heal("decode-0"), At(4.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("probe_schedule", {"kinds": ["wedge"]}),
            Expect("availability", {"before": 0.95, "after": 0.9, "settle_s": 1.0, "kinds": ["wedge"]}),
            Expect("handoff", {"grace_s": 3.0}),
        ),
    ),
    Scenario(
        name="prefill_process_frozen",
        description="The only prefill's process is frozen (SIGSTOP: its sockets accept, nothing answers) for "
        "2.5 s, then resumed, as a stuck host or a debugger would do. Requests caught on it end with the "
        "router's request timeout, a prompt 503 or, for a pull already on its way, the decode's transfer "
        "timeout (never a hang); its probes time out without holding the health loop, and it takes handoffs "
        "again once resumed.",
        bugs=("zoo-12", "zoo-2"),
        topologies=("1p1d",),
        connectors=("mooncake", "nixl"),
        router=replace(SCALED_ROUTER, request_timeout_s=2.0),
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=(
            Step("freeze", Wedge("prefill-0", mode="sigstop"), At(1.5)),
            Step("thaw", Heal("prefill-0"), At(4.0)),
        ),
        expect=(
            *CORE_EXPECT,
            Expect("probe_schedule", {"kinds": ["wedge"]}),
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["wedge"]}),
            # No `transfer_timeout`: a pull already on its way to the frozen prefill can only end at the
            # decode's transfer timeout, which is that bound doing its job (nothing_lost still holds the
            # request to its deadline).
            Expect("handoff", {"grace_s": 3.0}),
        ),
    ),
    Scenario(
        name="decode_crash",
        description="The only decode is killed (SIGKILL) and started again on the same address 2 s later. "
        "While it is down requests end with a clear error or a prompt 503 (never a hang, never a prefill "
        "leg run twice); it rejoins once it serves (Failed is not terminal) and handoffs resume.",
        bugs=("zoo-6", "zoo-8"),
        topologies=("1p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=_crash_and_respawn("decode-0"),
        expect=(
            *CORE_EXPECT,
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["crash"]}),
            Expect("handoff", {"grace_s": 2.5}),
            Expect("transfer_timeout"),
        ),
    ),
    Scenario(
        name="decode_dies",
        description="A decode's engine dies (health 503, then the process exits 1 s later) and is respawned "
        "on the same address. The router stops routing to it on the first failed probe and takes it back "
        "once it serves again.",
        bugs=("zoo-6", "zoo-8"),
        topologies=("1p1d", "1p2d"),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=(
            Step("die", Die("decode-0", exit_after_s=1.0), At(1.5)),
            Step("respawn", Respawn("decode-0"), At(3.0)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["die"]}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["die"]}),
            Expect("handoff", {"grace_s": 2.5}),
            Expect("transfer_timeout"),
        ),
    ),
    Scenario(
        name="steady_round_robin",
        tags=("default",),
        suite_topologies=("1p2d",),
        suite_connectors=("mooncake",),
        description="No fault, open-loop load (40 requests/s): round robin over two workers of a role must "
        "spread requests evenly (a policy shared by both legs skews it to every other worker), with every "
        "request handed off correctly.",
        bugs=("zoo-10",),
        catches=("shared_policy",),
        topologies=("1p2d", "2p1d"),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=_OPEN_LOAD,
        expect=_spread_expect(0.3),
    ),
    Scenario(
        name="steady_load_aware",
        # A contract workout for the other policies (the rest of the suite runs round robin): simulated suite.
        tags=("default",),
        suite_worlds=("sim",),
        suite_connectors=("mooncake",),
        description="No fault, open-loop load (40 requests/s) over two workers of a role, picked by the "
        "load-aware policies: power of two for prefills, least load for decodes (ties go round robin). "
        "Both must spread requests evenly among Ready workers, with every request handed off correctly.",
        bugs=("zoo-10",),
        topologies=("1p2d", "2p1d"),
        connectors=("mooncake", "nixl"),
        router=replace(SCALED_ROUTER, prefill_policy="power_of_two", decode_policy="least_load"),
        engines=SCALED_ENGINES,
        # Half the chat requests cap their length as current OpenAI clients do (max_completion_tokens).
        workload=replace(_OPEN_LOAD, completion_tokens_fraction=0.5),
        expect=_spread_expect(0.3),
    ),
    Scenario(
        name="steady_random",
        # A contract workout for the random policy (the rest of the suite runs round robin): simulated suite.
        tags=("default",),
        suite_worlds=("sim",),
        suite_connectors=("mooncake",),
        description="No fault, open-loop load (40 requests/s) over two workers of a role, picked at "
        "random on both legs. Random picks must still reach every Ready worker (each within 50% of its fair "
        "share), with every request handed off correctly.",
        bugs=("zoo-10",),
        topologies=("1p2d", "2p1d"),
        connectors=("mooncake", "nixl"),
        router=replace(SCALED_ROUTER, prefill_policy="random", decode_policy="random"),
        engines=SCALED_ENGINES,
        workload=_OPEN_LOAD,
        expect=_spread_expect(0.5),
    ),
    Scenario(
        name="random_prefill_down",
        # one_of_two_prefills_down under the random policy: a random pick must skip a worker that is not
        # Ready, and a retry must go to the other prefill. Simulated suite.
        tags=("default",),
        suite_worlds=("sim",),
        suite_connectors=("mooncake",),
        description="One of two prefills crashes and is respawned 2 s later, with both legs picked at "
        "random. The other prefill carries the load with no client error: a leg refused before the probes "
        "see the crash is retried on the other prefill, and no leg goes to the dead one once it is out.",
        bugs=("zoo-6",),
        topologies=("2p1d",),
        connectors=("mooncake", "nixl"),
        router=replace(SCALED_ROUTER, prefill_policy="random", decode_policy="random"),
        engines=SCALED_ENGINES,
        workload=_LONGER,
        timeline=_crash_and_respawn("prefill-1"),
        expect=_ONE_PREFILL_DOWN_EXPECT,
    ),
    Scenario(
        name="worker_api_add_remove",
        # A contract workout (a worker joining and leaving through the API under load): simulated suite.
        tags=("default",),
        suite_worlds=("sim",),
        suite_connectors=("mooncake",),
        description="A second prefill is registered through the worker API mid-traffic (with its connector "
        "and bootstrap port), then the first one is removed once the new one is Ready. The added worker must "
        "hand off like a configured one, and the removal must drain without a client error. Before that, "
        "mistaken registrations (a url with a port out of range, with a path, of another scheme, without "
        "a host, with credentials; a bootstrap port out of range (by one, or more) or given as text; an "
        "unknown role, connector or field; labels, dp size (also as text), engine id or KV role of the "
        "wrong kind) must be refused with a 4xx naming the field, adding nothing; so must the added "
        "engine registered again under another spelling of its url.",
        bugs=("zoo-7",),
        topologies=("2p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        unregistered_engines=("prefill-1",),
        timeline=(
            Step("bad_url", AddWorker("prefill-1", {"url": "http://127.0.0.1:99999"}, refused="url"),
                 At(0.6)),
            Step("url_path", AddWorker("prefill-1", {"url": "http://127.0.0.1:8000/v1"}, refused="url"),
                 At(0.7)),
            Step("bad_port", AddWorker("prefill-1", {"bootstrap_port": 70000}, refused="bootstrap_port"),
                 At(0.8)),
            *_wrong_registrations("prefill-1", 0.81),
            Step("add", AddWorker("prefill-1"), At(1.0)),
            # The same engine again, its url spelt with a trailing slash: one engine, one worker (409).
            Step("again", AddWorker("prefill-1", {"url": "{url}/"}, refused="url"), After("add", 0.1)),
            Step("remove", RemoveWorker("prefill-0"), WorkerStatus("prefill-1", "ready"), deadline_s=4.0),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("handoff_strict"),
            Expect("transfer_timeout"),
            Expect("worker_api"),
            Expect(
                "availability", {"before": 0.95, "after": 0.95, "settle_s": 0.5, "kinds": ["remove_worker"]}
            ),
        ),
    ),
    Scenario(
        name="prefill_fails_requests",
        tags=("default",),
        suite_topologies=("1p1d",),
        description="The prefill answers its next 5 requests with HTTP 500. Legs are sequential: each "
        "failure must reach the client at once as a clear error, not after the decode waited out its KV "
        "transfer timeout for KV that was never computed.",
        bugs=("zoo-9",),
        catches=("legs_joined", "error_as_200"),
        topologies=("1p1d", "1p2d"),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=SCALED_WORKLOAD,
        timeline=(
            Step("fail_5", EngineFault("prefill-0", "fail_requests", {"count": 5, "status": 500}), At(1.5)),
            Step("heal", Heal("prefill-0", "fail_requests"), At(2.5)),
        ),
        expect=(
            *BASE_EXPECT,
            Expect("transfer_timeout"),
            Expect("legs_sequenced"),
            Expect("handoff", {"grace_s": 1.0}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 0.5}),
        ),
    ),
]
