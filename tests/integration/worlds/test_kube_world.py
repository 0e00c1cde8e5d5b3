"""The cluster world end to end: fake engines as pods (`--engines k8s:FILE`), against the fake API server
(`harness.kube.fake_cluster`: the official client over HTTP, pods as local processes on their own
loopback addresses). The reference router and the load run on this host and reach the engines through
their NodePort Services, as against a real cluster with the router outside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.runner import run_scenario
from harness.scenario import load_scenarios
from harness.worlds.real.backends import EngineChoiceError, parse_engines

pytest.importorskip("kubernetes")

from harness.kube.fake_cluster import running_fake_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Path]]:
    root = tmp_path_factory.mktemp("fake-cluster")
    with running_fake_cluster(root) as fc:
        kubeconfig = fc.write_kubeconfig(root / "kubeconfig")
        engines = root / "engines.toml"
        engines.write_text(
            'backend = "k8s"\npreset = "pdchaos-fake"\nrouter = "outside"\nservice_type = "NodePort"\n'
            f'namespace = "pdchaos"\nready_timeout_s = 30\nkubeconfig = "{kubeconfig}"\n', encoding="utf-8")
        yield fc, engines


@pytest.fixture
def kube(cluster: tuple[object, Path]) -> Iterator[tuple[object, Path]]:
    """The cluster; no pod of the test's cell may outlive it."""
    yield cluster
    fc = cluster[0]
    deadline = time.monotonic() + 5.0
    while fc.pod_processes() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.1)
    assert fc.pod_processes() == [], "the cell left pods running"  # type: ignore[attr-defined]


def _scenario(name: str, **router: object):
    (s,) = load_scenarios([name])
    return s.with_router(**router) if router else s


def _history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


async def test_a_prefill_pod_replaced_on_its_address_passes_on_the_reference_router(kube, tmp_path) -> None:
    res = await run_scenario(_scenario("prefill_process_restart"), "1p1d", "mooncake", "http", "reference",
                             tmp_path, engines=f"k8s:{kube[1]}")
    assert res.status == "pass", [(v.name, v.status, v.reason) for v in res.verdicts]
    events = _history(tmp_path)
    # The handoffs were real: the records were read from the pods, the decode pulled from the prefill.
    pulled = [e for e in events if e.get("outcome") == "pulled" and e.get("kind") == "decode"]
    assert pulled
    # The prefill's identity moved: a new pod, a new engine id behind the same Service address; both
    # incarnations pulled from.
    ids = {e["engine_id"] for e in events
           if e.get("type") == "engine_state" and e.get("engine") == "prefill-0"}
    assert len(ids) >= 2, ids
    assert {e.get("peer_engine_id") for e in pulled} >= ids
    assert (tmp_path / "engines" / "prefill-0.pod1.log").exists()
    assert (tmp_path / "engines" / "prefill-0.pod2.log").exists()


async def test_the_2491_bug_is_caught_with_engines_as_pods(kube, tmp_path) -> None:
    _, engines = kube
    res = await run_scenario(_scenario("prefill_process_restart", inject_bugs=("stale_engine_id",)), "1p1d",
                             "mooncake", "http", "reference", tmp_path, engines=f"k8s:{engines}")
    failed = {v.name for v in res.verdicts if v.status == "fail"}
    assert res.status == "fail" and "transfer_timeout" in failed, [(v.name, v.status, v.reason)
                                                                   for v in res.verdicts]


async def _passes_with_verified_faults(kube, out: Path, scenario: str, topology: str) -> list[dict]:
    """Run a NIXL cell on pods; it passes and every fault was verified. Its history."""
    res = await run_scenario(_scenario(scenario), topology, "nixl", "http", "reference", out,
                             engines=f"k8s:{kube[1]}")
    assert res.status == "pass", [(v.name, v.status, v.reason, v.evidence[:3]) for v in res.verdicts
                                  if v.status != "pass"]
    events = _history(out)
    verified = [e for e in events if e.get("type") == "fault_verified"]
    assert verified and all(e["ok"] for e in verified), verified
    return events


async def test_a_frozen_decode_is_stopped_through_exec(kube, tmp_path) -> None:
    events = await _passes_with_verified_faults(kube, tmp_path, "decode_process_frozen", "1p2d")
    applied = [e for e in events if e.get("type") == "fault_applied"]
    assert applied[0]["params"]["mode"] == "sigstop"


async def test_a_wedged_decode_link_goes_through_the_pods_toxiproxy_sidecar(kube, tmp_path) -> None:
    events = await _passes_with_verified_faults(kube, tmp_path, "decode_link_wedged", "1p2d")
    # Seen from outside, through the decode's node port: accepted, then nothing (the sidecar's toxic).
    (verified, *_) = [e for e in events if e.get("type") == "fault_verified"]
    assert verified["evidence"]["toxics"] and verified["evidence"]["probe"] == "silent"


async def test_a_slow_side_channel_reaches_the_decode_through_the_prefills_sidecar(kube, tmp_path) -> None:
    events = await _passes_with_verified_faults(kube, tmp_path, "slow_side_channel", "1p1d")
    # The decodes pulled from the prefill's proxy port (advertised by the prefill), not its own.
    peers = {e.get("peer", "").rsplit(":", 1)[-1] for e in events if e.get("outcome") == "pulled"}
    assert peers == {"15600"}, peers


async def test_a_side_channel_fault_a_sidecar_cannot_carry_says_why(kube, tmp_path) -> None:
    _, engines = kube
    res = await run_scenario(_scenario("slow_side_channel"), "1p1d", "mooncake", "http", "reference",
                             tmp_path, engines=f"k8s:{engines}")
    assert res.status == "unknown" and "NetworkPolicy" in res.reason, res.reason


def test_a_bad_engines_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "e.toml"
    bad.write_text('preset = "tpu"\n', encoding="utf-8")
    with pytest.raises(EngineChoiceError, match="preset must be one of"):
        parse_engines(f"k8s:{bad}")
    with pytest.raises(EngineChoiceError, match="no file"):
        parse_engines(f"k8s:{tmp_path / 'missing.toml'}")


def test_the_cli_runs_a_cell_on_the_cluster(kube, tmp_path: Path) -> None:
    _, engines = kube
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "decode_restart", "--topology", "1p1d",
         "--connector", "nixl", "--transport", "http", "--engines", f"k8s:{engines}", "--out", str(out)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PDCHAOS_FORKSERVER": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pass" in proc.stdout
