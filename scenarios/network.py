"""Network faults through Toxiproxy: links cut, wedged, reset and slowed between the router, the engines and
the decode -> prefill KV side channel (`harness.netlinks`)."""

from __future__ import annotations

from dataclasses import replace

from harness.scenario import (
    At,
    EngineSettings,
    Expect,
    HealLink,
    LinkBandwidth,
    LinkFlap,
    LinkLatency,
    LinkReset,
    Partition,
    Scenario,
    Step,
)
from harness.scenario.defaults import (
    CORE_EXPECT,
    SCALED_ENGINES,
    SCALED_ROUTER,
    SCALED_WORKLOAD,
    STRICT_LOCAL,
)

# Short runs: a few seconds of load around each fault.
_LOAD = replace(SCALED_WORKLOAD, duration_s=6.0)
_SLOW_LINK_MS = 400
_KV_RATE_KB_S = 8
# A cut link costs only the prefill legs on the wire at the instant of the cut: they may have reached the
# engine (the fake prefill's records show it computing some), so a correct router never runs them twice.
# Those requests (in flight at a cut) are only counted (`exclude_in_flight_at_fault`); every request sent
# after a cut must succeed: a refused leg is retried on the other prefill. A router that does not retry it
# loses every request sent before its next probe (~0.9).
_CUT_AVAILABILITY = {"before": 0.95, "during": 1.0, "after": 0.95, "settle_s": 1.0,
                     "exclude_in_flight_at_fault": True}



def _prefill_1_cut(names: tuple[str, str], down_at: float, back_at: float) -> tuple[Step, Step]:
    """The router's link to prefill-1 refuses connections from `down_at` to `back_at`."""
    return (Step(names[0], Partition("prefill-1", "serve", "down"), At(down_at)),
            Step(names[1], HealLink("prefill-1", "serve"), At(back_at)))


def _cut_expect(max_recovery_s: float, *more: Expect) -> tuple[Expect, ...]:
    """What a cut prefill link may cost (only legs on the wire at the cut), and the worker back taking
    handoffs within `max_recovery_s` of the heal."""
    return (*CORE_EXPECT, STRICT_LOCAL, Expect("availability", _CUT_AVAILABILITY),
            Expect("recovery", {"max_recovery_s": max_recovery_s, "kinds": ["link_down"]}), *more,
            Expect("transfer_timeout"))


SCENARIOS = [
    Scenario(
        name="prefill_link_partitioned",
        tags=("default",),
        description="The router loses its link to one of two prefills (proxy down: connections refused) for "
        "2 s. Traffic moves to the other prefill with no client error: a leg refused before the router's "
        "probes see the link down is retried on the other prefill. Only a prefill leg on the wire at the cut "
        "itself may fail (it may have reached the engine, so it is never run twice: 0-2 of the ~65 requests "
        "of the window). Once the link is back the worker rejoins within the recovery bound and "
        "takes handoffs again.",
        bugs=("zoo-6", "zoo-8"),
        catches=("no_prefill_retry",),
        topologies=("2p1d",),
        connectors=("mooncake", "nixl"),
        # Three failed probes to NotReady: a refused leg marks the worker suspect and its probe fails, but it
        # stays Ready for a while and keeps being picked, so several legs are refused: each must be retried.
        router=replace(SCALED_ROUTER, failure_threshold=3),
        engines=SCALED_ENGINES,
        # The load goes on past the recovery bound after the mend: on a machine running several cells at once
        # the router can take seconds to see the prefill Ready again, and a prefill still out at the bound is
        # a failure, not an unknown (a gateway whose breaker keeps it out for a minute).
        workload=replace(_LOAD, after_heal_s=6.5),
        timeline=_prefill_1_cut(("cut", "mend"), 1.5, 3.5),
        # Recovery nominally under 1 s (probes every 0.3 s); the bound leaves room for a machine running
        # several cells at once (`--jobs`), where the router's probes queue behind other cells' work.
        expect=_cut_expect(5.0, Expect("handoff", {"grace_s": 1.0})),
    ),
    Scenario(
        name="prefill_link_blip",
        tags=("default",),
        description="The router's link to one of two prefills drops for 0.4 s (connections refused), less "
        "than one probe interval (0.5 s; 3 failed probes take a worker out), under a circuit breaker of 6 "
        "failures kept open 30 s. Refused legs must make the router probe that prefill at once and steer "
        "requests away from it: its probes then take it out after a few refused legs, before they open its "
        "breaker, and it rejoins right after the link is back. A router that keeps picking it until its "
        "regular probes fail charges every refused leg to the breaker, which opens while the probes still "
        "see a healthy worker, so no recovery re-admits it and it stays out for the whole open period.",
        bugs=("zoo-6",),
        catches=("no_suspect_probe",),
        topologies=("2p1d",),
        connectors=("mooncake", "nixl"),
        router=replace(SCALED_ROUTER, health_interval_s=0.5, failure_threshold=3, circuit_breaker_failures=6,
                       circuit_breaker_open_s=30.0),
        engines=SCALED_ENGINES,
        # Long enough after the mend for the recovery bound to pass: a held-out prefill is a failure, not
        # an unknown.
        workload=replace(_LOAD, after_heal_s=6.0),
        timeline=_prefill_1_cut(("blip", "back"), 1.5, 1.9),
        expect=_cut_expect(3.0),
    ),
    Scenario(
        name="decode_link_wedged",
        description="The link to one of two decodes is wedged (timeout toxic: connections accepted, nothing "
        "gets through) for 3 s. Requests caught on it end at the router's request deadline with a clear "
        "error (never a hang), the probe times out, and the router keeps serving through the other decode.",
        bugs=("zoo-12",),
        topologies=("1p2d",),
        connectors=("mooncake", "nixl"),
        router=replace(SCALED_ROUTER, request_timeout_s=2.0),
        engines=SCALED_ENGINES,
        workload=replace(_LOAD, deadline_s=5.0),
        timeline=(
            Step("wedge", Partition("decode-1", "serve", "timeout"), At(1.5)),
            Step("unwedge", HealLink("decode-1"), At(4.5)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0}),
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["link_timeout"]}),
        ),
    ),
    Scenario(
        name="side_channel_reset_during_pull",
        tags=("default",),
        description="Every KV pull from the prefill is reset (TCP RST) while its answer is on the way back, "
        "for 1.5 s. The NIXL decode fails each such load at once (policy `fail`), the client gets a clear "
        "error (never a hang, never a wait for the transfer timeout), and handoffs resume after the heal. "
        "These failures are the path's, not the decode's: its circuit breaker (3 failures) must not take the "
        "healthy sole decode out.",
        bugs=("#2491",),
        catches=("breaker_charges_kv_failure", "nixl_not_relayed", "retry_failed_requests"),
        topologies=("1p1d",),
        connectors=("nixl",),
        router=replace(SCALED_ROUTER, circuit_breaker_failures=3, circuit_breaker_open_s=5.0),
        engines=SCALED_ENGINES,
        workload=_LOAD,
        timeline=(
            Step("reset", LinkReset("prefill-0", "side_channel"), At(1.5)),
            Step("mend", HealLink("prefill-0", "side_channel"), At(3.0)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("handoff", {"grace_s": 0.5, "allow_failed": True}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 0.5}),
            Expect("transfer_timeout"),
        ),
    ),
    Scenario(
        name="slow_side_channel",
        description=f"The KV side channel gets {_SLOW_LINK_MS} ms of latency for 3 s. Handoffs still succeed "
        "(no error, no recompute, no transfer timeout): the delay shows in time to first token only. Guards "
        "a handoff path that takes a slow pull for a dead one (#2491's transfer-timeout path).",
        bugs=("#2491",),
        topologies=("1p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=EngineSettings(transfer_timeout_s=2.0, kv_abort_timeout_s=30.0, handshake_timeout_s=1.0),
        workload=_LOAD,
        timeline=(
            Step("slow", LinkLatency("prefill-0", "side_channel", latency_ms=_SLOW_LINK_MS), At(1.5)),
            Step("mend", HealLink("prefill-0", "side_channel"), At(4.5)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("handoff_strict", {"excuse_kinds": []}),
            Expect("availability", {"before": 0.95, "during": 1.0, "after": 0.95, "settle_s": 0.5}),
            Expect("transfer_timeout"),
        ),
    ),
    Scenario(
        name="side_channel_bandwidth_cap",
        description=f"The KV side channel is capped at {_KV_RATE_KB_S} KB/s for 3 s (a pull of the fakes' 64 "
        "bytes per prompt token then takes up to ~1 s). Handoffs slow down but all succeed: a bandwidth "
        "cap well inside the transfer timeout must not turn into timeouts, failures or recomputes.",
        bugs=("#2491",),
        topologies=("1p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=_LOAD,
        timeline=(
            Step("cap", LinkBandwidth("prefill-0", "side_channel", rate_kb_s=_KV_RATE_KB_S), At(1.5)),
            Step("uncap", HealLink("prefill-0", "side_channel"), At(4.5)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("handoff_strict", {"excuse_kinds": []}),
            Expect("availability", {"before": 0.95, "during": 1.0, "after": 0.95, "settle_s": 0.5}),
            Expect("transfer_timeout"),
        ),
    ),
    Scenario(
        name="prefill_link_flapping",
        tags=("slow",),
        description="The router's link to one of two prefills flaps (0.6 s down, 0.6 s up, 4 times). The "
        "router follows it (refused legs retried on the other prefill; only legs on the wire at a cut may "
        "fail, as in prefill_link_partitioned) and ends with the worker Ready and taking handoffs.",
        bugs=("zoo-6",),
        topologies=("2p1d",),
        connectors=("mooncake",),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        workload=replace(_LOAD, duration_s=8.0),
        timeline=(Step("flap", LinkFlap("prefill-1", "serve", down_s=0.6, up_s=0.6, cycles=4), At(1.5)),),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            Expect("availability", _CUT_AVAILABILITY),
            Expect("recovery", {"max_recovery_s": 3.0, "kinds": ["link_flap"]}),
            Expect("transfer_timeout"),
        ),
    ),
]
