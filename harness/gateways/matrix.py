"""The router matrix: the same scenario cells against several routers (and releases), then the comparison.

Each router runs the cells into `<out>/<label>/` (a normal run folder: report.json, junit.xml, report.html,
one folder per cell); cells a router cannot run are skipped with the adapter's reason. `<out>/matrix.json`
says which router ran where, with what it skipped and which settings it took only approximately;
`reports.compare` turns that into compare.json / compare.html / compare.md.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.gateways.adapters import GatewayAdapter
from harness.routers import RouterAdapter, make_router_adapter
from harness.runner import Cell, expand_matrix, run_suite
from harness.scenario import Scenario

MATRIX_JSON = "matrix.json"
MATRIX_SCHEMA = "pdchaos.matrix/1"


def router_dir_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label) or "router"


def skip_reason(adapter: RouterAdapter, scenario: Scenario, cell: Cell) -> str | None:
    """Why this router cannot run that cell (None: it runs)."""
    if isinstance(adapter, GatewayAdapter):
        return adapter.cannot_run(scenario, cell.topology, cell.connector, cell.transport)
    if scenario.router.inject_bug and not adapter.supports_inject_bug:
        return f"injects bug {scenario.router.inject_bug!r} into the reference router"
    return None


@dataclass
class RouterPlan:
    spec: str
    adapter: RouterAdapter
    label: str
    run: list[tuple[Scenario, Cell]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    adjustments: list[str] = field(default_factory=list)

    def entry(self, out: Path) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "label": self.label,
            "dir": router_dir_name(self.label),
            "executable": getattr(self.adapter, "executable", None),
            "version": getattr(self.adapter, "version", None),
            "cells": len(self.run),
            "skipped": self.skipped,
            "adjustments": self.adjustments,
        }


def plan_router(
    spec: str | RouterAdapter, pairs: Sequence[tuple[Scenario, Cell]], label: str | None = None
) -> RouterPlan:
    adapter = make_router_adapter(spec)
    plan = RouterPlan(spec if isinstance(spec, str) else adapter.name, adapter, label or adapter.name)
    adjust: dict[str, None] = {}
    for s, cell in pairs:
        why = skip_reason(adapter, s, cell)
        if why is not None:
            plan.skipped.append({"scenario": s.name, "cell": cell.label, "topology": cell.topology,
                                 "connector": cell.connector, "transport": cell.transport, "reason": why})
            continue
        plan.run.append((s, cell))
        if isinstance(adapter, GatewayAdapter):
            for a in adapter.adjustments(s.router):
                adjust.setdefault(a, None)
    plan.adjustments = list(adjust)
    return plan


def unique_labels(plans: Sequence[RouterPlan]) -> None:
    """Two specs resolving to the same release (`smg`, `smg==1.13.0`) get distinct folder names."""
    seen: dict[str, int] = {}
    for p in plans:
        n = seen.get(p.label, 0)
        seen[p.label] = n + 1
        if n:
            p.label = f"{p.label}.{n + 1}"


def write_matrix(out: Path, plans: Sequence[RouterPlan], started: float, extra: dict[str, Any]) -> Path:
    doc = {
        "schema": MATRIX_SCHEMA,
        "started_at": started,
        "ended_at": time.time(),
        "routers": [p.entry(out) for p in plans],
        **extra,
    }
    path = out / MATRIX_JSON
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


class _Lines:
    """Minimal progress: one line per finished cell on stderr."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.done = 0

    def finish(self, out: Any, status: str) -> None:
        self.done += 1
        print(f"  [{self.label} {self.done}/{self.total}] {status.upper():7} {Path(str(out)).name}",
              file=sys.stderr, flush=True)


async def run_matrix(
    scenarios: Sequence[Scenario],
    routers: Sequence[str | RouterAdapter],
    out_dir: str | Path,
    topologies: Sequence[str] | None = None,
    connectors: Sequence[str] | None = None,
    transports: Sequence[str] | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, list[Any]]:
    """Run every cell against every router; returns results by router label and writes matrix.json and the
    comparison report into out_dir."""
    from reports.compare import write_comparison

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local folder, once per matrix
    started = time.time()
    pairs = expand_matrix(scenarios, topologies, connectors, transports)
    plans = [plan_router(r, pairs) for r in routers]
    unique_labels(plans)
    extra = {"scenarios": [s.name for s in scenarios], "seed": seed,
             "cells": [{"scenario": s.name, "cell": c.label} for s, c in pairs]}
    write_matrix(out, plans, started, extra)
    results: dict[str, list[Any]] = {}
    for p in plans:
        if progress:
            print(f"pdchaos: router {p.label}: {len(p.run)} cells, {len(p.skipped)} skipped",
                  file=sys.stderr, flush=True)
        sub = out / router_dir_name(p.label)
        results[p.label] = await run_suite(
            [s for s, _ in p.run], p.run, sub, router=p.adapter, seed=seed,
            progress=_Lines(p.label, len(p.run)) if progress else None,
        )
        write_matrix(out, plans, started, extra)
    write_comparison(out)
    return results


def drop_skipped(
    router: str | RouterAdapter, cells: Sequence[tuple[Scenario, Cell]]
) -> list[tuple[Scenario, Cell]]:
    """The cells this router can run; each one left out is said on stderr with its reason (`pdchaos run`)."""
    adapter = make_router_adapter(router)
    kept = []
    for s, cell in cells:
        why = skip_reason(adapter, s, cell)
        if why is None:
            kept.append((s, cell))
        else:
            print(f"pdchaos: skipping {s.name} {cell.label} on {adapter.name}: {why}", file=sys.stderr)
    return kept
