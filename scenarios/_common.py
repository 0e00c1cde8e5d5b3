"""Shared settings for the shipped scenarios: short probe intervals and scaled timeouts keep each run a few
seconds long while keeping the ratios of a real deployment (probe timeout > interval, transfer timeout much
longer than a handoff)."""

from __future__ import annotations

from harness.checkers import CONTRACT_CHECKS
from harness.scenario import Expect, Workload
from harness.scenario.presets import SCALED_ENGINES, SCALED_ROUTER

ALL_SHAPES = ("1p1d", "1p2d", "2p1d")

# The scaled reference settings (harness.scenario.presets): a preset maps them to its own values.
ROUTER = SCALED_ROUTER

ENGINES = SCALED_ENGINES

WORKLOAD = Workload(
    mode="closed", concurrency=3, duration_s=6.0, stream_fraction=0.3, chat_fraction=0.2, max_tokens=6,
    deadline_s=6.0,
)

# The router's contract, judged on every leg, probe and worker status the engines saw (docs/DESIGN.md §2):
# whatever a scenario is about, a router that breaks it anywhere fails.
CONTRACT_EXPECT = tuple(Expect(name) for name in CONTRACT_CHECKS)
# What every scenario checks besides its own expectations.
# Every request ends before its deadline with the right text, and runs once: a leg is run again only where
# its engine never saw it.
CORE_EXPECT = (Expect("nothing_lost"), Expect("output"), Expect("legs_once"), *CONTRACT_EXPECT)
BASE_EXPECT = (
    *CORE_EXPECT,
    # Every PD request is handed off; only restarts and crashes excuse a local prefill on a decode.
    Expect("no_local_compute", {"grace_s": 2.5}),
)
# Faults that give no reason at all for a request to skip the handoff.
STRICT_LOCAL = Expect("no_local_compute", {"excuse_kinds": []})
