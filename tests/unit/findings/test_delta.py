"""A run's findings against a baseline's: new, gone, unchanged; and how a sweep shows them."""

from __future__ import annotations

from pathlib import Path

from harness.findings import compute_findings, delta_lines, findings_delta, findings_of_folder
from harness.result import ScenarioResult
from harness.sweep.cli import summary_lines
from harness.sweep.compare import compare
from harness.verdict import Verdict
from reports import write_reports


def _cell(scenario: str, *verdicts: Verdict) -> ScenarioResult:
    return ScenarioResult(scenario, "1p1d", "mooncake", "http", replay=f"pdchaos run {scenario}",
                          verdicts=[Verdict.ok("run_complete"), *verdicts])


LEGS = Verdict.fail("legs_once", "2 request leg(s) ran more than once on an engine",
                    evidence=["router side: [x:1] reached the decodes 2 times"])
STALE = Verdict.fail("handoff", "bad handoffs: 1 stale_engine_id", {"problems": {"stale_engine_id": 1}})
SLOW = Verdict.fail("recovery", "cut: no correct handoff through prefill-1 within 5.0s of heal")


def test_new_gone_and_unchanged_are_matched_by_id() -> None:
    before = compute_findings([_cell("a", LEGS), _cell("b", STALE)], known={})
    after = compute_findings([_cell("a", LEGS), _cell("c", LEGS), _cell("d", SLOW)], known={})
    changes = findings_delta(before, after)
    assert [(c.kind, c.finding.checker, c.baseline_cells, c.current_cells) for c in changes] == [
        ("new", "recovery", 0, 1), ("gone", "handoff", 1, 0), ("unchanged", "legs_once", 1, 2)]
    lines = delta_lines(changes, "runs/base")
    assert lines[0] == "pdchaos: findings against runs/base: 1 new, 1 gone, 1 unchanged"
    assert lines[1].startswith("  NEW   a worker was kept out") and lines[2].startswith("  GONE")
    assert delta_lines([], "x") == ["pdchaos: findings against x: none in either"]


def test_a_sweep_comparison_carries_the_findings_of_both_folders(tmp_path: Path) -> None:
    from harness.sweep.cells import load_cells

    base, now = tmp_path / "base", tmp_path / "now"
    write_reports(base, [_cell("a", LEGS), _cell("b", STALE)], plots=False)
    write_reports(now, [_cell("a", LEGS), _cell("b")], plots=False)
    comp = compare(load_cells(base), load_cells(now), baseline_dir=base, current_dir=now)
    comp.findings = findings_delta(findings_of_folder(base), findings_of_folder(now))
    assert [c["kind"] for c in comp.to_dict()["findings"]] == ["gone", "unchanged"]
    assert summary_lines(load_cells(now), comp)[-1].startswith("  GONE  decodes were told")
