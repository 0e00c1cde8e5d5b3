"""Results from a run folder: the saved ones (report.json, each cell's result.json) and ones judged from
histories (a suite that crashed, or `--recheck`). Judging is the harness's: the renderers in `reports` get
results from here and only render them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.checkers import run_checks
from harness.history import load_history
from harness.races import fold_adjacent
from harness.result import ScenarioResult
from harness.runner import saved_cell_result
from harness.verdict import Verdict

HISTORY_NAME = "history.jsonl"
REPORT_JSON = "report.json"
SCHEMA = "pdchaos.report/2"
# /2 added `findings`; a /1 report (no findings) is still read, and its findings computed from its results.
READABLE_SCHEMAS = frozenset({"pdchaos.report/1", SCHEMA})


def read_results(path: Path) -> list[ScenarioResult]:
    """Results from a report.json; raises ValueError for another schema or a damaged file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not UTF-8 text
        raise ValueError(f"{path}: not JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("schema") not in READABLE_SCHEMAS:
        raise ValueError(f"{path}: not a {SCHEMA} document")
    base = path.parent
    return [ScenarioResult.from_dict(r, base) for r in doc.get("results") or [] if isinstance(r, dict)]


def _expects(settings: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The checkers a run asked for, as the runner saved them in `run_started.settings["expect"]`."""
    return [(str(item["checker"]), dict(item.get("params") or {}))
            for item in settings.get("expect") or [] if isinstance(item, Mapping) and item.get("checker")]


def result_from_history(path: str | os.PathLike[str]) -> ScenarioResult:
    """Judge one history file afresh. A missing, empty or truncated history gives an unknown verdict."""
    p = Path(path)
    folder = p.parent
    logs = folder / "logs"
    common: dict[str, Any] = {
        "history_path": p,
        "cell_dir": folder,
        "log_dir": logs if logs.is_dir() else None,
    }
    try:
        h = load_history(p)
    except OSError as e:
        why = Verdict.unknown_("run_complete", f"history unreadable: {e}")
        return ScenarioResult(scenario=folder.name, topology="", connector="", verdicts=[why], **common)
    run = h.run or {}
    verdicts = run_checks(h, _expects(h.settings))
    world = str(run.get("world") or "real")
    # A simulated history's clock is virtual: its times say nothing of when the run took place or how long.
    real = world == "real"
    return ScenarioResult(
        scenario=str(run.get("scenario") or folder.name),
        topology=str(run.get("topology") or ""),
        connector=str(run.get("connector") or ""),
        transport=str(run.get("transport") or ""),
        router=str(run.get("router") or ""),
        verdicts=verdicts,
        bugs=[str(b) for b in run.get("bugs") or h.settings.get("bugs") or []],
        description=str(run.get("description") or ""),
        replay=str(run.get("replay") or ""),
        seed=run.get("seed"),
        world=world,
        settings=str(h.settings.get("preset") or "scaled"),
        run_reason=str((h.ended or {}).get("reason") or "no run_ended"),
        duration_s=round(h.end_t, 3) if real else None,
        started_at=h.wall_start if real else None,
        ended_at=None if h.wall_start is None or not real else h.wall_start + h.end_t,
        **common,
    )


def cell_result(history: Path, recheck: bool, saved: ScenarioResult | None = None) -> ScenarioResult:
    """One cell's result from its folder: the one the runner saved beside the history (else `saved`, e.g.
    from the run's report.json), judged again from the history when `recheck`, else one judged afresh.
    Judged again (the history says what ran), it keeps what only the run knew: its wall times and notes, and
    the verdicts no checker gives from a history (the session's `timeline`, `faults` and `router`, the
    replay's `determinism`): without them a run that missed a step or could not apply a fault would pass."""
    saved = saved_cell_result(history) or saved
    if saved is None:
        return result_from_history(history)
    if not recheck:
        return saved
    fresh = result_from_history(history)
    judged = {v.name for v in fresh.verdicts}
    kept = [v for v in saved.verdicts if v.name not in judged]
    return replace(fresh, verdicts=fresh.verdicts + kept, verdict=None, status=None,
                   description=fresh.description or saved.description, replay=fresh.replay or saved.replay,
                   duration_s=saved.duration_s, started_at=saved.started_at, ended_at=saved.ended_at,
                   notes=saved.notes)


RUN_MARKERS = (REPORT_JSON, "run.json")


def is_run_folder(folder: Path) -> bool:
    """A folder one `pdchaos run` (or one router of a matrix) wrote: its run.json or report.json."""
    return any((folder / name).is_file() for name in RUN_MARKERS)


def run_folders_in(folder: Path) -> list[Path]:
    """The run folders right inside `folder` (e.g. `runs/`, a matrix's folder)."""
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and is_run_folder(p))
    except OSError:
        return []


def find_histories(run_dir: Path) -> list[Path]:
    return sorted(run_dir.rglob(HISTORY_NAME))


def collect_results(run_dir: Path, recheck: bool = False) -> list[ScenarioResult]:
    """Saved results from report.json, plus one for every history file that report.json does not name (a
    suite interrupted or crashed before writing it): the cell's own saved result where the runner wrote one,
    else judged from the history. `recheck`: every history judged again (`cell_result`)."""
    saved: list[ScenarioResult] = []
    report = run_dir / REPORT_JSON
    if report.is_file():
        try:
            saved = read_results(report)
        except (ValueError, OSError):
            saved = []
    by_history = {os.path.abspath(r.history_path): r for r in saved if r.history_path is not None}
    # A repeated cell's other runs are named by its `runs` (their folders): not cells of their own.
    folded = {os.path.abspath(Path(run["cell_dir"]) / HISTORY_NAME) for r in saved for run in r.runs
              if run.get("cell_dir")}
    if recheck:
        judged = [cell_result(p, True, by_history.get(os.path.abspath(p))) for p in find_histories(run_dir)]
        return fold_adjacent(judged) if folded else judged
    derived = [cell_result(p, False) for p in find_histories(run_dir)
               if os.path.abspath(p) not in by_history and os.path.abspath(p) not in folded]
    return saved + derived
