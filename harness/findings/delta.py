"""Findings of one run against another's: new, gone or unchanged (matched by finding id).

A sweep lines its run up with a baseline run; a release matrix lines each router up with the one before it,
so each release's row says which problems it brought and which it fixed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.findings.group import Finding, compute_findings
from harness.result import ScenarioResult
from harness.run_folder import REPORT_JSON, read_results

KINDS = ("new", "gone", "unchanged")


@dataclass(frozen=True)
class FindingChange:
    kind: str  # new | gone | unchanged
    finding: Finding  # the current one (the baseline's when gone)
    baseline_cells: int
    current_cells: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "baseline_cells": self.baseline_cells, "current_cells": self.current_cells,
                **self.finding.to_dict()}


def findings_delta(baseline: Sequence[Finding], current: Sequence[Finding]) -> list[FindingChange]:
    """New first, then gone, then unchanged; each group in the order its run listed them."""
    before = {f.id: f for f in baseline}
    now = {f.id: f for f in current}
    new = [FindingChange("new", f, 0, len(f.cells)) for f in current if f.id not in before]
    gone = [FindingChange("gone", f, len(f.cells), 0) for f in baseline if f.id not in now]
    same = [FindingChange("unchanged", f, len(before[f.id].cells), len(f.cells)) for f in current
            if f.id in before]
    return new + gone + same


def findings_of(doc: Mapping[str, Any], results: Sequence[ScenarioResult]) -> list[Finding]:
    """A report's findings: as it wrote them (`pdchaos.report/2`), else computed from its results (/1)."""
    listed = doc.get("findings")
    if isinstance(listed, list):
        return [Finding.from_dict(f) for f in listed if isinstance(f, Mapping)]
    return compute_findings(results)


def findings_of_folder(folder: Path) -> list[Finding]:
    """The findings of a run or sweep folder's report.json; ValueError when it has none to read."""
    path = Path(folder) / REPORT_JSON
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable ({e})") from None
    return findings_of(doc if isinstance(doc, Mapping) else {}, read_results(path))


def cells_by_signature(findings: Sequence[Finding]) -> dict[str, list[str]]:
    """Each signature the findings show, as their lead or as a consequence -> the cells of the findings that
    show it (a search's failure is looked up here to tell a known problem from a new one)."""
    out: dict[str, list[str]] = {}
    for f in findings:
        for sig in (f.signature, *f.consequences):
            cells = out.setdefault(sig, [])
            cells.extend(c for c in f.cells if c not in cells)
    return out


def delta_lines(changes: Sequence[FindingChange], against: str, whose: str = "") -> list[str]:
    """Terminal lines: the counts, then each new and gone finding (`whose`: the router they are of)."""
    head = f"pdchaos: {whose}: findings" if whose else "pdchaos: findings"
    if not changes:
        return [f"{head} against {against}: none in either"]
    counts = {k: sum(1 for c in changes if c.kind == k) for k in KINDS}
    lines = [f"{head} against {against}: " + ", ".join(f"{n} {k}" for k, n in counts.items())]
    for c in changes:
        if c.kind != "unchanged":
            lines.append(f"  {c.kind.upper():5} {c.finding.title} ({max(c.baseline_cells, c.current_cells)} "
                         "cell(s))")
    return lines
