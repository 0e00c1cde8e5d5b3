"""Report renderers: report.json (schema `pdchaos.report/1`), junit.xml, report.html.

`write_reports(run_dir, results)` writes all three into the run folder (each independently: one failing
renderer does not stop the others); `report_from_run_dir(run_dir)` re-renders a finished or crashed run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.result import ScenarioResult, summarize
from reports.collect import collect_results, result_from_history
from reports.html import REPORT_HTML, write_html
from reports.json_report import REPORT_JSON, SCHEMA, read_json, write_json
from reports.junit import JUNIT_XML, write_junit

__all__ = [
    "JUNIT_XML",
    "REPORT_HTML",
    "REPORT_JSON",
    "SCHEMA",
    "ScenarioResult",
    "collect_results",
    "read_json",
    "report_from_run_dir",
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


def write_reports(
    run_dir: PathLike | Iterable[ScenarioResult],
    results: Iterable[ScenarioResult] | PathLike,
    *,
    plots: bool = True,
) -> dict[str, Path]:
    """Write report.json, junit.xml and report.html into the run folder; returns their paths by kind.

    Accepts `(run_dir, results)` or `(results, run_dir)`. A renderer that fails leaves its file out, its
    error goes to `report-errors.txt` (key `errors`), and the others are still written. `plots=False`
    leaves the timeline plots out of report.html (about 0.2 s per cell).
    """
    folder, items = _order(run_dir, results)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    errors: list[str] = []
    writers: tuple[tuple[str, Callable[[list[ScenarioResult], Path], Path]], ...] = (
        ("json", write_json),
        ("junit", write_junit),
        ("html", lambda items, folder: write_html(items, folder, plots=plots)),
    )
    for kind, writer in writers:
        try:
            written[kind] = writer(items, folder)
        except Exception as e:  # one broken renderer must not cost the other reports
            errors.append(f"{kind}: {type(e).__name__}: {e}")
    if errors:
        err = folder / "report-errors.txt"
        err.write_text("\n".join(errors) + "\n", encoding="utf-8")
        written["errors"] = err
    return written


def report_from_run_dir(
    run_dir: PathLike, recheck: bool = False, *, plots: bool = True
) -> list[ScenarioResult]:
    """Re-render the reports of a run folder from its saved results and histories; returns the results.

    Cells whose result was never saved (the suite crashed) are judged from their history; a truncated
    history gives an unknown verdict. `recheck`: judge every history afresh with the current checkers.
    Raises FileNotFoundError when the folder does not exist.
    """
    folder = Path(run_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"no run folder {folder}")
    results = collect_results(folder, recheck=recheck)
    write_reports(folder, results, plots=plots)
    return results
