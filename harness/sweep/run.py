"""Running a planned sweep: every cell through the concurrent pool, into one folder.

Folder: `<out>/<group>/` is a normal run folder for each router x world x settings x engines group
(report.json, junit.xml, report.html, one folder per cell), `<out>/report.json` and `<out>/junit.xml` hold
every cell (so the folder is itself a baseline for the next sweep), and `<out>/sweep.json` (schema
`pdchaos.sweep/1`) says which cell is which (its key) and which cells were left out and why. Rendering
the reports is the entry point's (`harness.sweep.cli`): harness modules do not import `reports`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.parallel import CellJob, run_cells
from harness.result import ScenarioResult
from harness.routers import RouterAdapter, RouterAdapterError, make_router_adapter
from harness.runner import cell_dir_name
from harness.sweep.cells import SWEEP_JSON, SWEEP_SCHEMA
from harness.sweep.plan import Skipped, SweepCell, SweepPlan
from harness.sweep.spec import EngineBackend
from harness.worlds.real.backends import EngineChoice
from harness.worlds.real.kube_engines import not_runnable


@dataclass
class SweepRun:
    plan: SweepPlan
    out: Path
    jobs: int
    ran: list[tuple[SweepCell, ScenarioResult]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None

    @property
    def results(self) -> list[ScenarioResult]:
        return [r for _, r in self.ran]

    def groups(self) -> dict[str, list[ScenarioResult]]:
        out: dict[str, list[ScenarioResult]] = {}
        for cell, res in self.ran:
            out.setdefault(cell.key.group, []).append(res)
        return out


def cell_folder(out: Path, cell: SweepCell) -> Path:
    return out / cell.key.group / cell_dir_name(cell.key.scenario, cell.cell)


async def run_sweep(plan: SweepPlan, out: Path, jobs: int, progress: Any = None,
                    reuse: bool = False) -> SweepRun:
    run = SweepRun(plan, out, jobs, skipped=list(plan.skipped))
    runnable, adapters = _runnable(plan, run.skipped)
    rid = re.sub(r"[^A-Za-z0-9_-]", "", out.name[-12:]) or "sweep"
    backends = write_backend_files(plan, out)
    work = [CellJob(c.scenario, c.cell, cell_folder(out, c),
                    router=adapters.get(c.router.spec, c.router.spec), seed=plan.spec.seed, run_id=rid,
                    world=c.key.world, settings=c.key.settings, engines=_engines(c, backends))
            for c in runnable]
    results = await run_cells(work, jobs, progress, reuse=reuse)
    run.ran = list(zip(runnable, results, strict=True))
    run.ended_at = time.time()
    return run


def _runnable(plan: SweepPlan, skipped: list[Skipped]) -> tuple[list[SweepCell], dict[str, RouterAdapter]]:
    """The cells that can run here, now; the others join `skipped` with their reason. A gateway release
    is resolved (installed on first use) once, and says itself which cells it cannot run."""
    from harness.matrix import skip_reason

    adapters: dict[str, RouterAdapter] = {}
    broken: dict[str, str] = {}
    out = []
    for c in plan.cells:
        if c.backend is not None:
            why = not_runnable(c.backend.options, c.scenario, c.cell.connector, c.cell.transport)
            if why is not None:
                skipped.append(Skipped(c.key, why))
                continue
        if c.key.world == "sim":
            out.append(c)
            continue
        spec = c.router.spec
        if spec not in adapters and spec not in broken:
            try:
                adapters[spec] = make_router_adapter(spec)
            except (RouterAdapterError, OSError) as e:
                broken[spec] = f"router {spec!r} unavailable: {e}"
        if spec in broken:
            skipped.append(Skipped(c.key, broken[spec]))
            continue
        why = skip_reason(adapters[spec], c.scenario, c.cell)
        if why is not None:
            skipped.append(Skipped(c.key, why))
            continue
        out.append(c)
    return out, adapters


# The sweep's engine backends, each a file of its own in the sweep folder: `--engines k8s:FILE` in a cell's
# replay command names it.
BACKENDS_DIR = "engines"


def partial_sweep(plan: SweepPlan, out: Path, jobs: int) -> SweepRun:
    """An interrupted sweep as its folder holds it: every cell that has a history, with the result the runner
    saved once it judged the cell, else one judged from the history (cut short: unknown)."""
    from harness.run_folder import cell_result

    run = SweepRun(plan, out, jobs, skipped=list(plan.skipped))
    for c in plan.cells:
        history = cell_folder(out, c) / "history.jsonl"
        if history.is_file():
            run.ran.append((c, cell_result(history, recheck=False)))
    run.ended_at = time.time()
    return run


def backends_used(plan: SweepPlan) -> dict[str, EngineBackend]:
    """The engine backends the sweep's cells run on, by name (sorted)."""
    return dict(sorted({c.backend.name: c.backend for c in plan.cells if c.backend is not None}.items()))


def write_backend_files(plan: SweepPlan, out: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for name, backend in backends_used(plan).items():
        path = (out / BACKENDS_DIR / f"{name}.json").resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"backend": backend.backend, **backend.options}, indent=1) + "\n",
                        encoding="utf-8")
        files[name] = path
    return files


def _engines(c: SweepCell, files: Mapping[str, Path]) -> str | EngineChoice:
    if c.backend is None:
        return "fake"
    return EngineChoice.kube(c.backend.options, files.get(c.backend.name))


def sweep_document(run: SweepRun) -> dict[str, Any]:
    spec = run.plan.spec
    cells = []
    for c, res in run.ran:
        cells.append({**c.key.to_dict(), "label": c.key.label, "group": c.key.group,
                      "dir": cell_folder(run.out, c).relative_to(run.out).as_posix(),
                      "router_spec": c.router.spec, "router_name": res.router, "bugs": list(c.bugs),
                      "status": res.status, "reason": res.reason})
    return {
        "schema": SWEEP_SCHEMA,
        "name": spec.name,
        "description": spec.description,
        "file": str(spec.path) if spec.path else None,
        "seed": spec.seed,
        "jobs": run.jobs,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "groups": sorted({c.key.group for c, _ in run.ran}),
        "cells": cells,
        "skipped": [s.to_dict() for s in run.skipped],
    }


def write_sweep_json(run: SweepRun) -> Path:
    path = run.out / SWEEP_JSON
    path.write_text(json.dumps(sweep_document(run), indent=2) + "\n", encoding="utf-8")
    return path


def status_of(statuses: Iterable[str | None]) -> str:
    """fail > unknown > pass over the cells that ran (none ran: unknown)."""
    seen = set(statuses)
    if "fail" in seen:
        return "fail"
    if "unknown" in seen or not seen:
        return "unknown"
    return "pass"
