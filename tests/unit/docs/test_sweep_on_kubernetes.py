"""The sweep the Kubernetes how-to runs (examples/sweeps/sweep-on-kubernetes.toml) plans as the guide says:
four cells, two left out with their reasons, a valid manifest for each cell (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sweep.dryrun import dry_run_document
from harness.sweep.plan import plan_sweep
from harness.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "sweeps" / "sweep-on-kubernetes.toml"
GUIDE = ROOT / "docs" / "howto" / "sweep-on-kubernetes.md"


def test_the_guide_s_sweep_plans_four_cells_and_says_why_two_are_left_out() -> None:
    spec = load_sweep(str(EXAMPLE))
    assert spec.name == "k8s-smoke"
    assert spec.backends["pods"].backend == "k8s"
    plan = plan_sweep(spec)
    assert sorted(c.key.label for c in plan.cells) == sorted([
        "prefill_restart_mooncake 1p1d-mooncake-http [reference, real, scaled, pods]",
        "prefill_restart_nixl 1p1d-nixl-http [reference, real, scaled, pods]",
        "decode_restart 1p1d-nixl-http [reference, real, scaled, pods]",
        "slow_side_channel 1p1d-nixl-http [reference, real, scaled, pods]",
    ])
    reasons = {s.key.label: s.reason for s in plan.skipped}
    assert "excluded by the sweep file" in reasons[
        "decode_restart 1p1d-mooncake-http [reference, real, scaled, pods]"]
    assert "Mooncake side channel" in reasons[
        "slow_side_channel 1p1d-mooncake-http [reference, real, scaled, pods]"]


def test_the_dry_run_plans_every_cell_on_the_cluster_and_its_manifests_are_valid() -> None:
    pytest.importorskip("kubernetes")
    doc = dry_run_document(plan_sweep(load_sweep(str(EXAMPLE))), jobs=1)
    assert len(doc["cluster"]) == 4
    assert doc["schema"]["manifests"] == 17 and doc["schema"]["problems"] == []


def test_the_guide_names_the_file_and_its_first_dry_run_line() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert "examples/sweeps/sweep-on-kubernetes.toml" in text
    first = "sweep k8s-smoke (examples/sweeps/sweep-on-kubernetes.toml): 4 cells, 2 left out; 1 at once"
    assert first in text
