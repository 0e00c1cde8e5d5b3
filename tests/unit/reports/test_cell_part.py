"""A cell's report part, rendered where the cell ran: used while it describes the history, ignored after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_checkers_builders import HB, restart_run
from test_reports import make_cell

from harness.history import load_history
from reports import ScenarioResult, write_reports
from reports.cell_part import CELL_PART, cell_part, render_part, write_cell_part


def _report(run_dir: Path, results: list[ScenarioResult], plots: bool = True) -> str:
    write_reports(run_dir, results, plots=plots)
    return (run_dir / "report.html").read_text()


def test_a_saved_part_gives_the_same_page_as_rendering_from_the_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = make_cell(run_dir, "prefill_restart", ["recovery", "nothing_lost"])
    fresh = _report(run_dir, [r])
    assert r.history_path is not None
    write_cell_part(r, load_history(r.history_path))
    assert (r.history_path.parent / CELL_PART).exists()
    assert _report(run_dir, [r]) == fresh
    # The page does not link the part: it is a cache of the page, not a file of the run.
    assert CELL_PART not in fresh


def _marked_part(run_dir: Path) -> tuple[ScenarioResult, Path, dict[str, Any]]:
    """A cell whose saved part has a handoff table no rendering gives: (its result, the part's file, the
    part as saved)."""
    r = make_cell(run_dir, "prefill_restart", ["recovery"])
    assert r.history_path is not None
    write_cell_part(r, load_history(r.history_path))
    path = r.history_path.parent / CELL_PART
    saved = json.loads(path.read_text())
    saved["handoffs"] = "<p>MARKED</p>"
    path.write_text(json.dumps(saved))
    return r, path, saved


def test_the_saved_part_is_what_the_report_shows(tmp_path: Path) -> None:
    r, _, _ = _marked_part(tmp_path / "run")
    assert "MARKED" in _report(tmp_path / "run", [r])


def test_a_part_of_another_history_or_setting_is_ignored(tmp_path: Path) -> None:
    r, path, saved = _marked_part(tmp_path / "run")
    assert r.history_path is not None
    # Asked without plots, a part rendered with them is not used.
    assert "MARKED" not in cell_part(r, plots=False).handoffs
    # The history changed after the part was written (a longer run written over it): rendered afresh.
    with open(r.history_path, "a") as fh:
        fh.write("\n")
    assert "MARKED" not in cell_part(r, plots=True).handoffs
    for broken in ("{", "[]", json.dumps({**saved, "format": 0}), json.dumps({"format": 1})):
        path.write_text(broken)
        assert "MARKED" not in cell_part(r, plots=True).handoffs


def test_a_part_written_from_the_live_view_matches_one_from_the_file(tmp_path: Path) -> None:
    hb: HB = restart_run(path=tmp_path / "history.jsonl", settings={"transfer_timeout_s": 3.0})
    hb.flush().close()
    r = ScenarioResult(scenario="s", topology="1p1d", connector="mooncake", transport="http",
                       router="reference", history_path=tmp_path / "history.jsonl")
    from_file = load_history(tmp_path / "history.jsonl")
    assert render_part(r, hb.history(), True) == render_part(r, from_file, True)
