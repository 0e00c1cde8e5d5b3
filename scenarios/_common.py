"""Shared settings for the shipped scenarios: short probe intervals and scaled timeouts keep each run a few
seconds long while keeping the ratios of a real deployment (probe timeout > interval, transfer timeout much
longer than a handoff)."""

from __future__ import annotations

from harness.scenario import EngineSettings, Expect, RouterSettings, Workload

ALL_SHAPES = ("1p1d", "1p2d", "2p1d")

ROUTER = RouterSettings(
    health_interval_s=0.3,
    health_timeout_s=0.5,
    failure_threshold=1,
    success_threshold=1,
    identity_check_interval_s=1.0,
    request_timeout_s=8.0,
)

ENGINES = EngineSettings(transfer_timeout_s=2.0, kv_abort_timeout_s=30.0, handshake_timeout_s=1.0)

WORKLOAD = Workload(
    mode="closed", concurrency=3, duration_s=6.0, stream_fraction=0.3, chat_fraction=0.2, max_tokens=6,
    deadline_s=6.0,
)

# What every scenario checks besides its own expectations.
CORE_EXPECT = (Expect("nothing_lost"), Expect("output"))
BASE_EXPECT = (
    *CORE_EXPECT,
    # Every PD request is handed off; only restarts and crashes excuse a local prefill on a decode.
    Expect("no_local_compute", {"grace_s": 2.5}),
)
# Faults that give no reason at all for a request to skip the handoff.
STRICT_LOCAL = Expect("no_local_compute", {"excuse_kinds": []})
