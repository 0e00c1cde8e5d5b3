"""What a scenario file starts from: the scaled settings every shipped scenario uses, and the expectations
every scenario checks. Public: import them in your own scenario files.

    from harness.scenario import At, Restart, Scenario, Step
    from harness.scenario.defaults import BASE_EXPECT, SCALED_ENGINES, SCALED_ROUTER, SCALED_WORKLOAD

Scaled settings keep each run a few seconds long while keeping the ratios of a real deployment (probe
timeout above the interval, a transfer timeout much longer than a handoff). A settings preset
(`--settings production`) maps them to its own values (`harness.scenario.presets`)."""

from __future__ import annotations

from harness.checkers import CONTRACT_CHECKS
from harness.scenario.model import Expect
from harness.scenario.presets import SCALED_ENGINES, SCALED_ROUTER
from harness.scenario.settings import Workload

__all__ = [
    "ALL_SHAPES",
    "BASE_EXPECT",
    "CONTRACT_EXPECT",
    "CORE_EXPECT",
    "SCALED_ENGINES",
    "SCALED_ROUTER",
    "SCALED_WORKLOAD",
    "STRICT_LOCAL",
]

# The three shapes most scenarios run on.
ALL_SHAPES = ("1p1d", "1p2d", "2p1d")

# A closed-loop client: 3 requests in flight for 6 s, some streamed, some chat, each with a 6 s deadline.
SCALED_WORKLOAD = Workload(
    mode="closed", concurrency=3, duration_s=6.0, stream_fraction=0.3, chat_fraction=0.2, max_tokens=6,
    deadline_s=6.0,
)

# The router's contract, judged on every leg, probe and worker status the engines saw (docs/DESIGN.md §2):
# whatever a scenario is about, a router that breaks it anywhere fails.
CONTRACT_EXPECT = tuple(Expect(name) for name in CONTRACT_CHECKS)
# Every request ends before its deadline with the right text, and runs once: a leg is run again only where
# its engine never saw it. Plus the contract.
CORE_EXPECT = (Expect("nothing_lost"), Expect("output"), Expect("legs_once"), *CONTRACT_EXPECT)
# CORE_EXPECT, and every PD request is handed off: only restarts and crashes excuse a local prefill.
BASE_EXPECT = (*CORE_EXPECT, Expect("no_local_compute", {"grace_s": 2.5}))
# For faults that give no reason at all for a request to skip the handoff.
STRICT_LOCAL = Expect("no_local_compute", {"excuse_kinds": []})
