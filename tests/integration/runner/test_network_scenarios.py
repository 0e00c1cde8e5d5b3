"""Network scenarios end to end against the reference router, through the embedded Toxiproxy.

Real processes (fake engines, `pdchaos-router`) on loopback through the runner, proxies on the links.
Two runs go side by side (they share the process's Toxiproxy) to halve the wait. The CLI runs one scenario as
a user would (`pdchaos run <network scenario>`). The flapping scenario and the full matrix are `slow`
(PDCHAOS_SLOW=1).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT

from harness.history import load_history
from harness.runner import expand_matrix, run_scenario
from harness.scenario import Scenario, load_scenarios

slow = pytest.mark.skipif(os.environ.get("PDCHAOS_SLOW") != "1", reason="slow: set PDCHAOS_SLOW=1")
NETWORK = ["prefill_link_partitioned", "decode_link_wedged", "side_channel_reset_during_pull",
           "slow_side_channel", "side_channel_bandwidth_cap", "prefill_link_flapping"]


def _scenario(name: str) -> Scenario:
    s = load_scenarios([name])[0]
    # Fewer clients keep two runs side by side light on a small machine; the timeline is unchanged.
    return replace(s, workload=replace(s.workload, concurrency=2))


def _explain(result: Any) -> str:
    lines = [f"{v.status} {v.name}: {v.reason}"
             + "".join(f"\n    {e}" for e in v.evidence[:5] if v.status != "pass") for v in result.verdicts]
    return f"{result.run_reason}\n" + "\n".join(lines)


def _records(result: Any, kind: str) -> list[dict[str, Any]]:
    lines = Path(result.history_path).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def _window(result: Any) -> tuple[float, float]:
    applied = _records(result, "fault_applied")[0]["t"]
    healed = _records(result, "fault_healed")[0]["t"]
    return applied, healed


async def test_wedged_decode_link_and_side_channel_reset(tmp_path: Path) -> None:
    wedged, reset = await asyncio.gather(
        run_scenario(_scenario("decode_link_wedged"), "1p2d", "mooncake", "grpc", "reference",
                     tmp_path / "wedged", seed=5),
        run_scenario(_scenario("side_channel_reset_during_pull"), "1p1d", "nixl", "http", "reference",
                     tmp_path / "reset", seed=5),
    )
    assert wedged.status == "pass", _explain(wedged)
    assert reset.status == "pass", _explain(reset)

    # Wedge: verified silent with both toxics listed; requests caught on the link end at the router's
    # request deadline (2 s) with a clear error (504, or an error chunk on a stream that had started), and the
    # link's worker was taken out of rotation.
    ev = _records(wedged, "fault_verified")[0]["evidence"]
    assert ev["probe"] == "silent" and len(ev["toxics"]) == 2
    errors = [r for r in _records(wedged, "request_completed") if not r["ok"]]
    assert errors and all(r["status"] in (200, 504) and r["error"] and 1.9 < r["latency_s"] < 3.0
                          for r in errors), errors
    seen = {(r["engine"], r["status"]) for r in _records(wedged, "router_status")}
    assert ("decode-1", "not_ready") in seen

    # Reset: the NIXL decode failed its pulls (policy fail), clients got an HTTP answer at once.
    h = load_history(Path(reset.history_path))
    failed = [ho for ho in h.handoffs if ho.kind == "decode" and ho.outcome == "failed"]
    assert failed and all("Reset" in (ho.error or "") for ho in failed)
    start, end = _window(reset)
    hit = [r for r in _records(reset, "request_completed") if not r["ok"]]
    assert hit and all(r["status"] in (200, 502) and r["latency_s"] < 1.0 for r in hit), hit
    # Caught by the reset: each failed request overlapped it (sent before the heal, ended after the reset
    # began), however long a loaded machine took to finish it.
    assert all(r["t"] >= start and r["t"] - r["latency_s"] <= end for r in hit), (start, end, hit)


async def test_slow_side_channel_shows_in_ttft_and_cli_runs_a_network_scenario(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harness.cli", "run", "prefill_link_partitioned", "--topology", "2p1d",
        "--connector", "nixl", "--transport", "http", "--out", str(out), "--no-progress",
        cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        slow_run, (stdout, stderr) = await asyncio.gather(
            run_scenario(_scenario("slow_side_channel"), "1p1d", "mooncake", "http", "reference",
                         tmp_path / "slow", seed=5),
            asyncio.wait_for(cli.communicate(), 120),
        )
    finally:
        if cli.returncode is None:
            cli.kill()
            await cli.wait()
    assert slow_run.status == "pass", _explain(slow_run)
    start, end = _window(slow_run)
    invoked = {r["req"]: r["t"] for r in _records(slow_run, "request_invoked")}
    done = [r for r in _records(slow_run, "request_completed") if r["ok"] and r["ttft_s"] is not None]
    before = [r["ttft_s"] for r in done if invoked[r["req"]] < start]
    during = [r["ttft_s"] for r in done if start + 0.1 < invoked[r["req"]] and r["t"] < end]
    assert before and during
    # 400 ms on the side channel: every handoff in the window paid it, none before.
    assert statistics.median(during) >= statistics.median(before) + 0.3, (before, during)
    assert min(during) >= 0.35

    assert cli.returncode == 0, (stdout.decode(), stderr.decode())
    assert "PASS     prefill_link_partitioned 2p1d/nixl/http" in stdout.decode()
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["status"] == "pass"
    cell = next(p for p in out.iterdir() if p.is_dir())
    kinds = [json.loads(line) for line in (cell / "history.jsonl").read_text().splitlines()]
    faults = [(r["type"], r.get("kind")) for r in kinds if r["type"].startswith("fault_")]
    assert faults == [("fault_applied", "link_down"), ("fault_verified", None), ("fault_healed", "link_down")]
    assert "--prefill" in " ".join(next(r["argv"] for r in kinds if r.get("message") == "router launch"))


def test_cli_lists_the_network_scenarios() -> None:
    out = subprocess.run([sys.executable, "-m", "harness.cli", "list", "--json"], cwd=ROOT, text=True,
                         capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    names = {d["name"] for d in json.loads(out.stdout)}
    assert set(NETWORK) <= names


@slow
async def test_flapping_prefill_link(tmp_path: Path) -> None:
    r = await run_scenario(_scenario("prefill_link_flapping"), "2p1d", "mooncake", "http", "reference",
                           tmp_path / "flap", seed=5)
    assert r.status == "pass", _explain(r)
    notes = [n["message"] for n in _records(r, "note") if n["message"].startswith("flap ")]
    assert len(notes) == 7  # 4 cycles: down at apply, then up/down/up/down/up/down/up


@slow
@pytest.mark.parametrize(
    ("scenario", "cell"),
    [(s.name, c) for s, c in expand_matrix(load_scenarios(NETWORK))],
    ids=lambda x: x.label if hasattr(x, "label") else str(x),
)
async def test_network_matrix(scenario: str, cell: Any, tmp_path: Path) -> None:
    r = await run_scenario(load_scenarios([scenario])[0], cell.topology, cell.connector, cell.transport,
                           "reference", tmp_path / "cell", seed=1)
    assert r.status == "pass", _explain(r)
