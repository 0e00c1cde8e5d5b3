"""report.json: versioned, machine-readable results of a run (schema `pdchaos.report/2`): the summary, the
findings (each distinct problem once, `harness.findings`), and every cell's result."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from harness.findings import compute_findings
from harness.result import ScenarioResult, summarize
from harness.run_folder import REPORT_JSON, SCHEMA
from pdchaos import __version__


def report_document(results: list[ScenarioResult], run_dir: Path) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "generated_at": time.time(),
        "pdchaos_version": __version__,
        "run_dir": run_dir.name,
        "summary": summarize(results),
        "findings": [f.to_dict() for f in compute_findings(results)],
        "results": [r.to_dict(base=run_dir) for r in results],
    }


def write_json(results: list[ScenarioResult], run_dir: Path, name: str = REPORT_JSON) -> Path:
    """Write atomically (a reader never sees half a report)."""
    path = run_dir / name
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report_document(results, run_dir), indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path
