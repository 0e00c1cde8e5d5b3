"""A run folder without report.json (a suite interrupted or crashed before writing it): each cell's result
comes from what the runner saved beside its history, so the report keeps what only the run knew (the replay
command, the description, wall times), and a simulated history alone never passes its virtual clock off as
wall time."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.runner import CELL_RESULT, run_scenario
from harness.scenario import load_scenarios
from reports import ScenarioResult, read_results, report_from_run_dir, write_reports

SCENARIO = next(s for s in load_scenarios() if s.name == "prefill_restart_mooncake")


@pytest.fixture
async def sim_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run folder holding one judged simulated cell, as an interrupted `pdchaos run` leaves it."""
    run_dir = tmp_path / "run"
    cell = run_dir / "cell"
    await run_scenario(SCENARIO.with_router(inject_bugs=("stale_engine_id",)), "1p1d", "mooncake", "http",
                       "reference", cell, world="sim")
    assert not (run_dir / "report.json").exists()
    return run_dir, cell


def _saved(cell: Path) -> dict:
    return json.loads((cell / CELL_RESULT).read_text())


async def test_the_report_keeps_the_replay_command_and_wall_times_of_each_cell(
    sim_run: tuple[Path, Path],
) -> None:
    run_dir, cell = sim_run
    saved = _saved(cell)
    assert saved["replay"] and saved["duration_s"] < 60 and saved["log_dir"] is None  # a sim cell has no logs
    [r] = report_from_run_dir(run_dir, plots=False)
    assert (r.status, r.replay, r.duration_s, r.started_at) == (
        "fail", saved["replay"], saved["duration_s"], saved["started_at"])
    assert r.description == SCENARIO.description
    [again] = read_results(run_dir / "report.json")
    assert again.replay == saved["replay"]
    props = {p.get("name"): p.get("value") for p in ET.parse(run_dir / "junit.xml").iter("property")}
    assert props["replay"] == saved["replay"]
    # The unit of the verdicts' times, in every report.
    assert props["time_unit"] == "simulated seconds" == saved["time_unit"]
    assert json.loads((run_dir / "report.json").read_text())["results"][0]["time_unit"] == "simulated seconds"
    assert "times in simulated seconds" in (run_dir / "report.html").read_text()
    assert saved["replay"] in (run_dir / "report.html").read_text().replace("&#x27;", "'")


async def test_recheck_judges_the_history_again_and_keeps_the_cell_record(sim_run: tuple[Path, Path]) -> None:
    run_dir, cell = sim_run
    saved = _saved(cell)
    forged = dict(saved, status="pass", reason="", verdict={"name": "x", "status": "pass", "reason": ""},
                  verdicts=[{"name": "output", "status": "pass", "reason": ""}])
    (cell / CELL_RESULT).write_text(json.dumps(forged))
    [kept] = report_from_run_dir(run_dir, plots=False)
    assert kept.status == "pass"  # the saved judgement, as saved
    [r] = report_from_run_dir(run_dir, recheck=True, plots=False)
    assert r.status == "fail" and {v.name for v in r.verdicts} >= {"transfer_timeout", "output"}
    assert (r.replay, r.duration_s, r.started_at) == (
        saved["replay"], saved["duration_s"], saved["started_at"])


async def test_a_simulated_history_alone_gives_no_wall_times(sim_run: tuple[Path, Path]) -> None:
    run_dir, cell = sim_run
    (cell / CELL_RESULT).unlink()
    [r] = report_from_run_dir(run_dir, plots=False)
    assert r.status == "fail" and r.world == "sim"
    assert (r.duration_s, r.started_at, r.ended_at) == (None, None, None)
    # What the run knew at its start is in the history: a killed run's report still names its replay.
    assert r.replay.startswith("pdchaos run prefill_restart_mooncake")
    assert r.description == SCENARIO.description
    page = (run_dir / "report.html").read_text()
    virtual_start = time.strftime("%Y-%m-%d", time.gmtime(1767225600.0))
    assert virtual_start not in page
    suite = ET.parse(run_dir / "junit.xml").getroot().find("testsuite")
    assert suite is not None and float(suite.get("time") or 0) == 0.0


async def test_a_result_saved_for_another_history_is_not_taken(sim_run: tuple[Path, Path]) -> None:
    run_dir, cell = sim_run
    saved = _saved(cell)
    (cell / CELL_RESULT).write_text(json.dumps(dict(saved, history="elsewhere/history.jsonl")))
    [r] = report_from_run_dir(run_dir, plots=False)
    assert r.duration_s is None  # judged from the history, nothing borrowed
    assert r.replay == saved["replay"]  # the history's own record of it


async def test_recheck_keeps_the_verdicts_no_checker_gives(tmp_path: Path) -> None:
    """A step that never happened is the session's `timeline` verdict, not a checker's: judged again from
    the history, the run must stay unknown, never turn into a pass."""
    cell = tmp_path / "run" / "cell"
    res = await run_scenario(SCENARIO, "1p1d", "mooncake", "http", "reference", cell, world="sim")
    assert res.status == "pass"
    saved = _saved(cell)
    missed = {"name": "timeline", "status": "unknown", "reason": "steps missed (condition never held): ['x']"}
    saved["verdicts"] = [v for v in saved["verdicts"] if v["name"] != "timeline"] + [missed]
    (cell / CELL_RESULT).write_text(json.dumps(saved))
    for saved_where in ("result.json", "report.json"):
        if saved_where == "report.json":  # a run from before result.json: its report.json says it
            write_reports(tmp_path / "run", [ScenarioResult.from_dict(saved, base=cell)], plots=False)
            (cell / CELL_RESULT).unlink()
        [r] = report_from_run_dir(tmp_path / "run", recheck=True, plots=False)
        assert r.status == "unknown" and "steps missed" in r.overall.reason, saved_where
