"""Engine-side field bugs (the fake engines' `--inject-bug` switches, `fake_engines.core.bugs`): each scenario
passes with correct engines and fails with its switch on, and its checkers say the fault is the engine's, not
the router's (the router minted or relayed the right parameters). Both connectors and both transports: the
bugs live in the engines, whatever the router speaks (`pdchaos run scenarios/engine_bugs.py --inject-bug NAME`
shows each one).

A late pull is made with a wedge of the decode's generate surface (its requests park, then pull when it is
healed), not with added latency: a wedge is a stretch of the timeline, so every preset scales it with the
abort timeout and the stop it races against, and the scenarios catch their bugs at production settings too."""

from __future__ import annotations

from dataclasses import replace

from harness.scenario import (
    At,
    Expect,
    GracefulStop,
    Heal,
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

# The prefill's KV abort timeout in the late-pull scenario: far above a normal pull, under the decode's stall.
_SHORT_ABORT_S = 0.3

SCENARIOS = [
    Scenario(
        name="late_pull_after_kv_abort",
        tags=("default",),
        description=f"The decode stalls for 0.8 s (its generate surface wedged: decode legs park), then "
        f"resumes: its parked requests reach KV the prefill computed up to 0.8 s earlier, past the prefill's "
        f"KV abort timeout ({_SHORT_ABORT_S} s). The prefill has given that KV up, so the decode must fail "
        "the load cleanly (an error), never answer 200 with another request's KV. Open-loop arrivals keep "
        "new prefills coming during the stall (a freed block gets reused).",
        bugs=("kv_freed_while_read",),
        catches=("kv_freed_while_read",),
        topologies=("1p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=replace(SCALED_ENGINES, kv_abort_timeout_s=_SHORT_ABORT_S),
        workload=replace(SCALED_WORKLOAD, mode="open", rate_rps=10.0, duration_s=3.0),
        timeline=(
            Step("stall", Wedge("decode-0", "generate"), At(0.5)),
            Step("resume", Heal("decode-0", "wedge"), At(1.3)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            # Failed loads of KV given up are the correct answer; KV of another prompt never is. No
            # transfer_timeout expectation: a late Mooncake pull is parked by vLLM's prefill until its abort
            # timeout (mooncake_connector.py:1564-1607), so the decode rightly waits out its own.
            Expect("handoff", {"grace_s": 0.5, "excuse_kinds": ["wedge"]}),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 0.5}),
        ),
    ),
    Scenario(
        name="prefill_graceful_stop",
        tags=("default",),
        description="One of two prefills is stopped gracefully (SIGTERM, as an orchestrator scaling down "
        "does) while its decodes still have KV to pull (the decode is stalled from 0.3 s before the stop to "
        "0.3 s after it: its requests park), then comes back. A graceful stop finishes what it started: "
        "every pull of KV it computed before the stop succeeds; only new requests move to the other prefill.",
        bugs=("shutdown_drops_pulls",),
        catches=("shutdown_drops_pulls", "healthy_while_draining"),
        topologies=("2p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        # Six clients: about three parked requests hold KV on prefill-0 when the stop comes. The load goes on
        # 3 s past the respawn, which a loaded machine can delay by seconds, so the availability checker
        # always has requests after it.
        workload=replace(SCALED_WORKLOAD, concurrency=6, duration_s=5.0, after_heal_s=3.0),
        timeline=(
            Step("stall", Wedge("decode-0", "generate"), At(0.7)),
            Step("sigterm", GracefulStop("prefill-0", grace_s=3.0), At(1.0)),
            Step("resume", Heal("decode-0", "wedge"), At(1.3)),
            Step("back", Respawn("prefill-0"), At(2.0)),
        ),
        expect=(
            *CORE_EXPECT,
            STRICT_LOCAL,
            # No fault excuses a lost pull here: a graceful stop promises to drain, and the router told the
            # truth. Only the respawn (a new engine id) may leave a handoff briefly stale.
            Expect("handoff_strict",
                   {"excuse_kinds": ["respawn"], "grace_s": 1.0, "excuse_in_flight": False}),
            Expect("transfer_timeout", {"excuse_in_flight": False}),
            # During the stop, requests sent to the draining prefill before a probe sees it get a 503.
            Expect("availability",
                   {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["graceful_stop"]}),
        ),
    ),
    Scenario(
        name="prefill_replaced_same_address",
        # Not in the default suite: there `prefill_graceful_stop` (its respawn replaces the prefill on the
        # same address) already catches this switch on every cell; this one shows it alone.
        description="The prefill is replaced on the same address (restart: new engine id, Mooncake: new "
        "side-channel port, NIXL: same port). The router sends the new engine id; the decode must look the "
        "new engine up (its handshake and bootstrap caches are per engine id, not per address), so handoffs "
        "resume right after the restart's grace window.",
        bugs=("stale_peer_handshake",),
        catches=("stale_peer_handshake",),
        topologies=("1p1d",),
        connectors=("mooncake", "nixl"),
        router=SCALED_ROUTER,
        engines=SCALED_ENGINES,
        # A decode pulling from the dead peer fails at once (NIXL) or waits out the 2 s transfer timeout
        # (Mooncake): long enough that, either way, such pulls go on well past the grace window whatever the
        # timing of the restart (`handoff` then fails in both worlds, not by luck).
        workload=replace(SCALED_WORKLOAD, duration_s=7.0),
        timeline=(Step("replace", Restart("prefill-0", down_s=0.6), At(1.0)),),
        expect=(
            *BASE_EXPECT,
            Expect("handoff", {"grace_s": 2.5}),
            Expect("transfer_timeout"),
            Expect("availability", {"before": 0.95, "after": 0.95, "settle_s": 1.0, "kinds": ["restart"]}),
        ),
    ),
]
