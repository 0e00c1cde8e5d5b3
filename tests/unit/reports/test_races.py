"""Repeated runs of a cell: per checker pass, fail or race, and how reports, findings and the exit status
say so."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from harness.findings import compute_findings
from harness.races import exit_code, fold_repeats, fold_runs, fold_verdicts
from harness.result import ScenarioResult
from harness.run_folder import collect_results
from harness.verdict import Verdict
from reports import write_reports

OK = Verdict.ok("legs_once", "no leg twice")
TWICE = Verdict.fail("legs_once", "1 request leg(s) ran more than once on an engine",
                     evidence=["router side: [x:3] reached the decodes 2 times"])
LOST = Verdict.unknown_("legs_once", "no handoff records with a request tag")


def _run(i: int, folder: Path, *verdicts: Verdict) -> ScenarioResult:
    return ScenarioResult("blip", "2p1d", "mooncake", "http", replay="pdchaos run blip", duration_s=2.0,
                          verdicts=[Verdict.ok("run_complete"), *verdicts],
                          cell_dir=folder / f"blip__2p1d-mooncake-http__run{i}")


def test_a_checker_folds_to_pass_fail_race_or_unknown() -> None:
    assert fold_verdicts("legs_once", [OK, OK]).status == "pass"
    both = fold_verdicts("legs_once", [TWICE, TWICE, TWICE])
    assert both.status == "fail" and both.reason.endswith("(in all 3 runs)")
    assert both.evidence == TWICE.evidence
    split = fold_verdicts("legs_once", [OK, TWICE, OK])
    assert split.status == "race" and split.reason.endswith("(failed in 1 of 3 runs: run 2)")
    assert split.evidence == ["run 2 failed: router side: [x:3] reached the decodes 2 times",
                              "run 1 passed: no leg twice", "run 3 passed: no leg twice"]
    assert split.numbers["runs"] == ["pass", "fail", "pass"]
    assert fold_verdicts("legs_once", [TWICE, LOST]).status == "fail"  # failed wherever it could tell
    assert fold_verdicts("legs_once", [OK, LOST]).status == "unknown"
    assert fold_verdicts("legs_once", [OK, None]).status == "unknown"  # no verdict in a run: not a pass


def test_a_cell_races_when_a_checker_split_and_fails_when_one_failed_every_time(tmp_path: Path) -> None:
    raced = fold_runs([_run(1, tmp_path, OK), _run(2, tmp_path, TWICE)])
    assert raced.status == "race" and [r["status"] for r in raced.runs] == ["pass", "fail"]
    assert raced.duration_s == 4.0 and raced.cell_dir == tmp_path / "blip__2p1d-mooncake-http__run1"
    stale = Verdict.fail("handoff", "bad handoffs: 2 stale_engine_id")
    failed = fold_runs([_run(1, tmp_path, stale, OK), _run(2, tmp_path, stale, TWICE)])
    assert failed.status == "fail"  # handoff failed in every run; legs_once split: the fail decides
    assert {v.name: v.status for v in failed.verdicts}["legs_once"] == "race"
    cells = fold_repeats([_run(1, tmp_path, OK), _run(2, tmp_path, TWICE),
                          ScenarioResult("other", "1p1d", "nixl", "grpc", verdicts=[OK]),
                          ScenarioResult("other", "1p1d", "nixl", "grpc", verdicts=[OK])], 2)
    assert [(c.scenario, c.status) for c in cells] == [("blip", "race"), ("other", "pass")]


@pytest.mark.parametrize(("status", "fail_on", "code"), [
    ("race", "race", EXIT_FAIL), ("race", "fail", EXIT_PASS), ("fail", "fail", EXIT_FAIL),
    ("unknown", "fail", EXIT_UNKNOWN), ("pass", "race", EXIT_PASS),
])
def test_the_exit_status_makes_a_race_red_unless_told_otherwise(status: str, fail_on: str, code: int) -> None:
    assert exit_code(status, fail_on) == code


def test_a_race_is_a_finding_of_its_own_kind(tmp_path: Path) -> None:
    [f] = compute_findings([fold_runs([_run(1, tmp_path, OK), _run(2, tmp_path, TWICE)])], known={})
    assert f.status == "race" and f.checker == "legs_once"
    assert f.reason_class == "# request leg ran more than once on an engine"  # as a plain failure's
    [g] = compute_findings([fold_runs([_run(1, tmp_path, TWICE), _run(2, tmp_path, TWICE)])], known={})
    assert g.status == "fail" and g.id == f.id


def test_reports_show_the_split_and_the_runs_stay_one_cell(tmp_path: Path) -> None:
    cell = fold_runs([_run(1, tmp_path, OK), _run(2, tmp_path, TWICE)])
    write_reports(tmp_path, [cell], plots=False)
    case = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite/testcase")
    assert case is not None and case.find("failure") is None and case.find("error") is None
    flaky = case.findall("flakyFailure")
    assert len(flaky) == 1 and flaky[0].get("message", "").startswith("run 2: legs_once")
    page = (tmp_path / "report.html").read_text()
    assert "Runs (2)" in page and "[race]" in page and "1 race" in page
    # The runs' folders are the one cell's: re-reading the folder does not make each run a cell.
    for run in cell.runs:
        Path(run["cell_dir"]).mkdir(parents=True)
        (Path(run["cell_dir"]) / "history.jsonl").write_text("")
    assert [r.status for r in collect_results(tmp_path)] == ["race"]


def test_a_junit_reader_reads_a_race_as_flaky(tmp_path: Path) -> None:
    """junitparser (PyPI, in the test extra) reads Surefire's flaky form as CI tools do."""
    from junitparser import xunit2
    write_reports(tmp_path, [fold_runs([_run(1, tmp_path, OK), _run(2, tmp_path, TWICE)])], plots=False)
    suite = next(iter(xunit2.JUnitXml.fromfile(str(tmp_path / "junit.xml"))))
    [case] = list(suite)
    assert case.is_flaky and case.is_passed and not case.is_rerun


def test_a_matrix_takes_repeat_and_its_status_counts_a_race() -> None:
    from harness.matrix import build_parser
    from reports.compare import CellOutcomes, Outcome, RouterComparison, RouterInfo

    args = build_parser().parse_args(["--repeat", "3", "--fail-on", "fail"])
    assert (args.repeat, args.fail_on) == (3, "fail")
    routers = [RouterInfo("smg-1.13.0", spec="smg==1.13.0", dir="smg-1.13.0")]
    outcomes = {"smg-1.13.0": Outcome("race", "legs_once split")}
    row = CellOutcomes("blip", "2p1d-mooncake-http", outcomes, False)
    comp = RouterComparison(routers, [row])
    assert comp.status == "race" and comp.summary()["smg-1.13.0"]["race"] == 1
    assert exit_code(comp.status, args.fail_on) == EXIT_PASS
