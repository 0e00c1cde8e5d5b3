"""Each engine bug switch in simulated time: its catching scenario passes with correct engines and fails with
the switch on, with the expected checker blaming the engine side (the router told the truth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runner import run_scenario
from harness.scenario import load_scenarios
from harness.scenario.bugs import with_bugs

SCENARIOS = {s.name: s for s in load_scenarios()}

# (switch, its scenario, cell, the checker that must fail, words its engine-side reason must hold)
CASES = [
    ("kv_freed_while_read", "late_pull_after_kv_abort", ("1p1d", "nixl", "http"), "output",
     "past the KV abort timeout"),
    ("kv_freed_while_read", "late_pull_after_kv_abort", ("1p1d", "mooncake", "grpc"), "handoff",
     "got another prompt's KV"),
    ("shutdown_drops_pulls", "prefill_graceful_stop", ("2p1d", "mooncake", "http"), "handoff_strict",
     "stopped gracefully"),
    ("shutdown_drops_pulls", "prefill_graceful_stop", ("2p1d", "nixl", "grpc"), "handoff_strict",
     "without waiting for decode-0's pull"),
    ("stale_peer_handshake", "prefill_replaced_same_address", ("1p1d", "mooncake", "http"),
     "transfer_timeout", "pulled from the peer it had cached"),
    ("stale_peer_handshake", "prefill_replaced_same_address", ("1p1d", "nixl", "grpc"), "handoff",
     "an earlier start of prefill-0"),
]


@pytest.mark.parametrize(("bug", "name", "cell", "checker", "words"), CASES,
                         ids=[f"{c[0]}-{c[2][1]}-{c[2][2]}" for c in CASES])
async def test_the_catching_scenario_fails_with_the_switch_and_blames_the_engine(
    bug: str, name: str, cell: tuple[str, str, str], checker: str, words: str, tmp_path: Path
) -> None:
    s = SCENARIOS[name]
    assert bug in s.bugs and bug in s.catches
    good = await run_scenario(s, *cell, "reference", tmp_path / "good", world="sim", settings="scaled")
    assert good.status == "pass", good.reason
    bad = await run_scenario(with_bugs(s, [bug]), *cell, "reference", tmp_path / "bad", world="sim",
                             settings="scaled")
    verdict = {v.name: v for v in bad.verdicts}[checker]
    assert verdict.status == "fail", bad.reason
    assert "engine side:" in verdict.reason and "router side" not in verdict.reason
    assert words in verdict.reason
    sides = {e["side"] for e in verdict.evidence if isinstance(e, dict)} or {
        "engine" for e in verdict.evidence if "engine side:" in str(e)}
    assert sides == {"engine"}, verdict.evidence[:3]


async def test_a_router_bug_is_still_blamed_on_the_router(tmp_path: Path) -> None:
    """The same attribution on a router bug: the stale engine id the router mints is the router's."""
    s = with_bugs(SCENARIOS["prefill_restart_mooncake"], ["stale_engine_id"])
    bad = await run_scenario(s, "1p1d", "mooncake", "http", "reference", tmp_path, world="sim",
                             settings="scaled")
    verdict = {v.name: v for v in bad.verdicts}["handoff"]
    assert verdict.status == "fail" and "router side:" in verdict.reason, verdict.reason
    assert {e["side"] for e in verdict.evidence if isinstance(e, dict)} == {"router"}
