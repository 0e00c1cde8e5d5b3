"""What each field of report.json means (schema `pdchaos.report/2`). The reference page is generated from
this and from a document the writer really makes, so a field added without its meaning fails a test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOP = {
    "schema": "`pdchaos.report/2` (a /1 report, without findings, is still read)",
    "generated_at": "when the report was written (wall seconds)",
    "pdchaos_version": "the pdchaos that wrote it",
    "run_dir": "the run folder's name",
    "summary": "counts of the cells (`total`, `pass`, `fail`, `unknown`, `race`) and the run's `status`",
    "findings": "each distinct problem once (below), most cells first",
    "results": "one result per scenario cell (below)",
}
RESULT = {
    "scenario": "the scenario's name", "description": "what the scenario does",
    "bugs": "the bug ids and switches the scenario is about", "topology": "NpMd shape of the cell",
    "connector": "mooncake or nixl", "transport": "http or grpc", "router": "the router under test",
    "seed": "the workload seed", "world": "real or sim", "settings": "the settings preset",
    "time_unit": "the unit of every time in the verdicts (seconds or simulated seconds)",
    "replay": "the one command that runs this cell again", "status": "pass, fail, unknown or race",
    "reason": "why it did not pass (empty on a pass)", "run_reason": "how the run ended",
    "verdict": "the combined verdict (a verdict object)", "verdicts": "one verdict per checker",
    "duration_s": "wall seconds the cell took", "started_at": "wall start", "ended_at": "wall end",
    "history": "the cell's history.jsonl, relative to the run folder", "cell_dir": "the cell's folder",
    "log_dir": "the cell's process logs", "logs": "each log file", "notes": "what the run noted for a reader",
    "runs": "with `--repeat`: each run's `status`, `reason` and `cell_dir` (empty for a cell run once)",
}
VERDICT = {
    "name": "the checker", "status": "pass, fail, unknown, or race (failed in some repeated runs)",
    "reason": "required for fail and unknown",
    "numbers": "what it measured", "evidence": "the lines a reader follows up (request ids, times, sides)",
}
FINDING = {
    "id": "stable across runs: a hash of checker, reason class and side",
    "statement": "the problem in a user's words, with the side to blame",
    "checker": "the checker that leads it", "reason_class": "its reason with counts, times and names dropped",
    "side": "router, engine, or null when no evidence line named one",
    "cells": "the cells that show it (`scenario[topology/connector/transport]`)",
    "clean_cells": "the cells of the same scenarios that do not",
    "consequences": "the other checkers' signatures that failed with it",
    "evidence": "up to three evidence lines of its smallest cell",
    "switches": "the bug switches whose known symptom it matches",
    "replay": "the replay line of its smallest cell",
    "status": "fail, or race when it was seen only in checks that split over repeated runs",
}
SECTIONS = (("The document", TOP, ()), ("A result", RESULT, ("results",)),
            ("A verdict", VERDICT, ("results", "verdicts")), ("A finding", FINDING, ("findings",)))


def sample_document() -> dict[str, Any]:
    """A report.json the writer makes for one failing cell: the fields every section documents."""
    from harness.result import ScenarioResult
    from harness.verdict import Verdict
    from reports.json_report import report_document

    failing = Verdict.fail("legs_once", "1 request leg(s) ran more than once on an engine",
                           evidence=["router side: [pdchaos:s0:1] reached the decodes 2 times"])
    result = ScenarioResult("example", "1p1d", "mooncake", "http", verdicts=[failing], replay="pdchaos run x")
    return report_document([result], Path("run"))


def undocumented(doc: dict[str, Any]) -> list[str]:
    """Fields the writer makes that no section documents (`results.verdicts.X`...), and documented ones it
    no longer makes (`gone: ...`)."""
    out = []
    for _title, fields, path in SECTIONS:
        node: Any = doc
        for key in path:
            node = node[key][0]
        out += [".".join((*path, k)) for k in node if k not in fields]
        out += ["gone: " + ".".join((*path, k)) for k in fields if k not in node]
    return out
