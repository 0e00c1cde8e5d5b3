"""Results of a zoo run from its cell histories: the verdicts of every run whose history is on disk, judged
again with its scenario's checkers (at the run's settings preset, with its switch on). This is how an
interrupted zoo still gives a matrix (`pdchaos zoo --rejudge DIR`), and how a finished one is re-read after a
checker changed."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.result import ScenarioResult
from harness.runner import Cell, saved_cell_result
from harness.scenario import Scenario
from harness.zoo.plan import ZooRun

PLAN_FILE = "plan.json"


def write_plan(out: Path, runs: Sequence[ZooRun], meta: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / PLAN_FILE
    rows = [{**asdict(r.cell), "scenario": r.scenario, "switch": r.switch, "repeat": r.repeat} for r in runs]
    body = {**meta, "runs": rows}
    path.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    return path


def read_plan(out: Path) -> tuple[list[ZooRun], dict[str, Any]]:
    body = json.loads((out / PLAN_FILE).read_text(encoding="utf-8"))
    runs = [
        ZooRun(r["scenario"], Cell(r["topology"], r["connector"], r["transport"]), r["switch"], r["repeat"])
        for r in body.pop("runs")
    ]
    return runs, body


def history_of(out: Path, run: ZooRun) -> Path:
    return out / "cells" / run.folder / "history.jsonl"


def finished(history: Path) -> bool:
    """Whether the run of this history ended and can be judged: the runner saved its result, or (a folder
    from before it did) the history's last record ends the run other than by an interruption."""
    if saved_cell_result(history) is not None:
        return True
    try:
        with open(history, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            last = fh.read().splitlines()[-1:]
        ended = json.loads(last[0]) if last else {}
    except (OSError, ValueError):
        return False
    return (isinstance(ended, dict) and ended.get("type") == "run_ended"
            and ended.get("reason") != "interrupted")


def rejudge(
    out: Path, runs: Sequence[ZooRun], scenarios: dict[str, Scenario], fresh: bool = True, jobs: int = 1
) -> tuple[list[ZooRun], list[ScenarioResult]]:
    """The finished runs with their results (a run not run yet, or cut short by an interruption, is left out:
    `pdchaos zoo --resume` runs it): judged again from the histories with today's checkers (`fresh`), else
    as the runner saved them. Judged again, a run keeps the verdicts no checker gives (`cell_result`).
    `jobs` processes judge at once (judging is pure CPU: a full matrix is about 1700 histories)."""
    kept = [r for r in runs if r.scenario in scenarios and finished(history_of(out, r))]
    paths = [history_of(out, r) for r in kept]
    if jobs <= 1 or not fresh or len(paths) < 2:
        return kept, [_judge(p, fresh) for p in paths]
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter: no event loop or fd of ours
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        results = list(pool.map(_judge, paths, [fresh] * len(paths), chunksize=8))
    return kept, results


def _judge(history: Path, fresh: bool) -> ScenarioResult:
    from harness.run_folder import cell_result

    return cell_result(history, recheck=fresh)
