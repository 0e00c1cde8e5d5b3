"""The detection matrix from a zoo run's results: per switch and cell, caught or not, by which checkers, with
the evidence line that names the mechanism; the baseline's false alarms; and the holes (a transport a switch
can occur on where no scenario of the set catches it).

Caught means: some checker failed with the switch on in a cell where that checker passed in every baseline
run of the same cell. A checker that failed in a baseline run is a false alarm there and proves nothing for
that cell; unknown is never caught.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.findings import Finding, compute_findings, evidence_text, sided_first, verdict_signature
from harness.result import ScenarioResult
from harness.zoo.plan import ZooRun
from pdchaos.bugs import BugSwitch

FAIL = "fail"
PASS = "pass"


@dataclass
class CellOutcome:
    """One switch in one cell."""

    caught: bool
    checkers: list[str] = field(default_factory=list)  # the checkers that caught it
    evidence: str = ""  # the first evidence line of the first of them (or its reason)
    status: str = "unknown"  # the cell's overall status with the switch on
    replay: str = ""
    signatures: list[str] = field(default_factory=list)  # the catching verdicts as findings key them

    def as_dict(self) -> dict[str, Any]:
        return {"caught": self.caught, "checkers": self.checkers, "evidence": self.evidence,
                "status": self.status, "replay": self.replay, "signatures": self.signatures}


@dataclass
class ZooMatrix:
    world: str
    settings: str
    baseline_runs: int
    switches: dict[str, BugSwitch]
    cells: list[str]  # cell keys in plan order
    outcomes: dict[str, dict[str, CellOutcome]]  # switch -> cell key -> outcome
    false_alarms: dict[str, list[str]]  # cell key -> "checker (run i): reason"
    baseline_status: dict[str, list[str]]  # cell key -> status per baseline run
    cell_transport: dict[str, str]
    # An interrupted zoo's matrix: `unjudged` planned runs have no verdict (`pdchaos zoo --resume` runs them).
    unjudged: int = 0
    # Per switch, the findings its catching cells give (one is the goal: one problem, named once).
    findings: dict[str, list[Finding]] = field(default_factory=dict)

    def caught_by(self, switch: str) -> list[str]:
        return [k for k, o in self.outcomes.get(switch, {}).items() if o.caught]

    def missing_transports(self, switch: str) -> list[str]:
        """Transports the switch can occur on, among those of the cells it ran in (or, when it ran in none,
        all of its own), where no cell caught it."""
        sw = self.switches[switch]
        ran = {self.cell_transport[k] for k in self.outcomes.get(switch, {})}
        caught = {self.cell_transport[k] for k in self.caught_by(switch)}
        return [t for t in sw.transports if (t in ran or not ran) and t not in caught]

    def holes(self) -> dict[str, list[str]]:
        return {name: miss for name in self.switches if (miss := self.missing_transports(name))}

    @property
    def ok(self) -> bool:
        return not self.holes() and not self.false_alarms and not self.unjudged

    def as_dict(self) -> dict[str, Any]:
        switches: dict[str, Any] = {}
        for name, sw in self.switches.items():
            switches[name] = {
                "side": sw.side, "zoo": sw.zoo, "reference": sw.reference, "symptom": sw.symptom,
                "transports": list(sw.transports), "connectors": list(sw.connectors),
                "caught_by": self.caught_by(name), "missing_transports": self.missing_transports(name),
                "cells": {k: o.as_dict() for k, o in self.outcomes.get(name, {}).items()},
                "findings": [{"id": f.id, "signature": f.signature, "statement": f.title,
                              "cells": len(f.cells)} for f in self.findings.get(name, [])],
            }
        return {
            "world": self.world, "settings": self.settings, "baseline_runs": self.baseline_runs,
            "ok": self.ok, "unjudged": self.unjudged, "cells": self.cells, "baseline": self.baseline_status,
            "false_alarms": self.false_alarms, "holes": self.holes(), "switches": switches,
        }


def _evidence(verdicts: Sequence[Any]) -> str:
    """The line that names the mechanism: one that says which side is at fault if any checker has one, else
    the first evidence line, else the first reason."""
    lines = sided_first([line for v in verdicts for item in v.evidence if (line := evidence_text(item))])
    return lines[0] if lines else (verdicts[0].reason if verdicts else "")


def build_matrix(
    runs: Sequence[ZooRun],
    results: Sequence[ScenarioResult],
    switches: Mapping[str, BugSwitch],
    world: str,
    settings: str,
) -> ZooMatrix:
    if len(runs) != len(results):
        raise ValueError("one result per run")
    cells: list[str] = []
    transport: dict[str, str] = {}
    # Per cell, the checkers that passed in every baseline run, and every verdict any baseline run gave.
    # Only a checker that passed every time, or a verdict no baseline gave at all (one the harness adds only
    # when it has something to say, e.g. `engine_conduct`), can catch a switch there.
    baseline_pass: dict[str, set[str]] = {}
    baseline_seen: dict[str, set[str]] = {}
    baseline_status: dict[str, list[str]] = {}
    false_alarms: dict[str, list[str]] = {}
    baseline_runs = 0
    for run, res in zip(runs, results, strict=True):
        if run.cell_key not in transport:
            cells.append(run.cell_key)
            transport[run.cell_key] = run.cell.transport
        if run.switch is not None:
            continue
        baseline_runs = max(baseline_runs, run.repeat + 1)
        baseline_status.setdefault(run.cell_key, []).append(res.status or "unknown")
        passed = {v.name for v in res.verdicts if v.status == PASS}
        baseline_pass[run.cell_key] = baseline_pass.get(run.cell_key, passed) & passed
        baseline_seen.setdefault(run.cell_key, set()).update(v.name for v in res.verdicts)
        for v in res.verdicts:
            if v.status == FAIL:
                false_alarms.setdefault(run.cell_key, []).append(f"{v.name} (run {run.repeat}): {v.reason}")
    outcomes: dict[str, dict[str, CellOutcome]] = {name: {} for name in switches}
    caught_results: dict[str, list[ScenarioResult]] = {}
    for run, res in zip(runs, results, strict=True):
        if run.switch is None:
            continue
        trusted = baseline_pass.get(run.cell_key, set())
        seen = baseline_seen.get(run.cell_key)
        fresh = [v for v in res.verdicts if v.status == FAIL
                 and (v.name in trusted or (seen is not None and v.name not in seen))]
        outcome = CellOutcome(
            caught=bool(fresh), checkers=[v.name for v in fresh],
            evidence=_evidence(fresh), status=res.status or "unknown",
            replay=res.replay, signatures=[s for v in fresh if (s := verdict_signature(v))],
        )
        outcomes.setdefault(run.switch, {})[run.cell_key] = outcome
        if fresh:
            caught_results.setdefault(run.switch, []).append(_only(res, fresh))
    findings = {name: compute_findings(rs, known={}) for name, rs in caught_results.items()}
    return ZooMatrix(world, settings, baseline_runs, dict(switches), cells, outcomes, false_alarms,
                     baseline_status, transport, findings=findings)


def _only(res: ScenarioResult, fresh: Sequence[Any]) -> ScenarioResult:
    """The result as the switch made it: its catching verdicts failed, the rest as passes."""
    kept = [v for v in res.verdicts if v.status != FAIL or v in fresh]
    return dataclasses.replace(res, verdict=None, verdicts=kept)
