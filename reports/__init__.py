"""Report renderers: report.json (schema `pdchaos.report/2`), junit.xml, report.html.

`write_reports(run_dir, results)` writes all three into the run folder (each independently: one failing
renderer does not stop the others); `report_from_run_dir(run_dir)` re-renders a finished or crashed run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.result import ScenarioResult, summarize
from harness.run_folder import REPORT_JSON, SCHEMA, collect_results, read_results, result_from_history
from reports.html import REPORT_HTML, write_html
from reports.json_report import write_json
from reports.junit import JUNIT_XML, write_junit

__all__ = [
    "JUNIT_XML",
    "RECHECK",
    "REPORT_HTML",
    "REPORT_JSON",
    "SCHEMA",
    "ScenarioResult",
    "collect_results",
    "read_results",
    "report_from_run_dir",
    "report_names",
    "rerender",
    "result_from_history",
    "summarize",
    "write_reports",
]

PathLike = str | os.PathLike[str]


def _order(a: Any, b: Any) -> tuple[Path, list[ScenarioResult]]:
    # Both argument orders are accepted: the runner and the CLI grew up with different habits.
    if isinstance(a, str | os.PathLike):
        return Path(a), list(b)
    if isinstance(b, str | os.PathLike):
        return Path(b), list(a)
    raise TypeError("write_reports needs a run folder (str or PathLike) and a list of ScenarioResult")


def report_names(infix: str = "") -> dict[str, str]:
    """File names of one set of reports: `report.json`..., or with an infix `report.recheck.json`..."""
    if not infix:
        return {"json": REPORT_JSON, "junit": JUNIT_XML, "html": REPORT_HTML}
    return {"json": f"report.{infix}.json", "junit": f"junit.{infix}.xml", "html": f"report.{infix}.html"}


def write_reports(
    run_dir: PathLike | Iterable[ScenarioResult],
    results: Iterable[ScenarioResult] | PathLike,
    *,
    plots: bool = True,
    infix: str = "",
    kinds: Iterable[str] = ("json", "junit", "html"),
) -> dict[str, Path]:
    """Write report.json, junit.xml and report.html into the run folder; returns their paths by kind.

    Accepts `(run_dir, results)` or `(results, run_dir)`. A renderer that fails leaves its file out, its
    error goes to `report-errors.txt` (key `errors`), and the others are still written. `plots=False`
    leaves the timeline plots out of report.html (about 0.2 s per cell). `infix` names another set beside
    the run's own (`report.<infix>.json`...); `kinds` writes only some of them.
    """
    folder, items = _order(run_dir, results)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    errors: list[str] = []
    names = report_names(infix)
    writers: tuple[tuple[str, Callable[[list[ScenarioResult], Path], Path]], ...] = (
        ("json", lambda items, folder: write_json(items, folder, names["json"])),
        ("junit", lambda items, folder: write_junit(items, folder, names["junit"])),
        ("html", lambda items, folder: write_html(items, folder, plots=plots, name=names["html"])),
    )
    wanted = set(kinds)
    for kind, writer in writers:
        if kind not in wanted:
            continue
        try:
            written[kind] = writer(items, folder)
        except Exception as e:  # one broken renderer must not cost the other reports
            errors.append(f"{kind}: {type(e).__name__}: {e}")
    if errors:
        err = folder / "report-errors.txt"
        err.write_text("\n".join(errors) + "\n", encoding="utf-8")
        written["errors"] = err
    return written


RECHECK = "recheck"


def report_from_run_dir(
    run_dir: PathLike, recheck: bool = False, *, plots: bool = True
) -> list[ScenarioResult]:
    """Re-render the reports of a run folder from its saved results and histories; returns the results
    (`rerender` also says which files it wrote)."""
    return rerender(run_dir, recheck, plots=plots)[0]


def rerender(
    run_dir: PathLike, recheck: bool = False, *, plots: bool = True
) -> tuple[list[ScenarioResult], dict[str, Path]]:
    """The reports of a run folder, from its saved results and its histories.

    Cells whose result was never saved (the suite crashed) are judged from their history; a truncated or
    damaged history gives an unknown verdict. The run's own report.json is the record of what the run
    judged and is never rewritten: it is written only when the folder has none (a run cut short), and
    junit.xml and report.html are re-rendered. `recheck` judges every history afresh with the current
    checkers and writes the new set beside the originals (`report.recheck.json`, `junit.recheck.xml`,
    `report.recheck.html`). Raises FileNotFoundError when the folder does not exist.
    """
    folder = Path(run_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"no run folder {folder}")
    results = collect_results(folder, recheck=recheck)
    original = (folder / REPORT_JSON).exists()
    if recheck and original:
        written = write_reports(folder, results, plots=plots, infix=RECHECK)
    elif original:
        written = write_reports(folder, results, plots=plots, kinds=("junit", "html"))
    else:
        written = write_reports(folder, results, plots=plots)
    return results, written
