"""The router matrix: the same scenario cells against several routers (and releases), then the comparison.

Each router runs the cells into `<out>/<label>/` (a normal run folder: report.json, junit.xml, report.html,
one folder per cell); cells a router cannot run are skipped with the adapter's reason. `<out>/matrix.json`
says which router ran where, with what it skipped and which settings it took only approximately;
`reports.compare` turns that into compare.json / compare.html / compare.md.

`pdchaos matrix` (`main` below; its usage is `_USAGE`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cli_args import cell_filters, repeats, world_and_settings
from harness.jobs import JOBS_HELP, default_jobs, jobs_arg
from harness.parallel import run_suite
from harness.races import exit_code
from harness.routers import RouterAdapter, RouterAdapterError, make_router_adapter
from harness.routers.gateways.adapters import GatewayAdapter
from harness.routers.profiles import ProfileRouter
from harness.runner import Cell, expand_matrix
from harness.scenario import Scenario, apply_preset, preset
from harness.usage_parser import UsageParser, seed_arg
from harness.worlds.real.processes import mark_processes

_USAGE = """Run scenarios against several routers and write the comparison report.

    pdchaos matrix                                            default suite: reference, newest smg
    pdchaos matrix --router smg==latest                       newest smg only
    pdchaos matrix --router smg==1.13.0 --router smg==1.12.0 --router vllm-router
    pdchaos matrix --compare-only runs/compare-X              re-render compare.* of a matrix
    pdchaos matrix --router smg==1.13.0 --out runs/m --resume   go on with an interrupted matrix
    pdchaos matrix --router smg==1.13.0 --settings production   the gateway's own defaults (long cells)

`--settings production` runs every router at the settings its users have (60 s probes, 3 failures / 2
successes, breaker 10 failures / 60 s open, vLLM's 480 s KV transfer timeout) and stretches each scenario's
timeline to match (x600): cells take tens of minutes each. `--resume` reruns a matrix into its own folder
and runs only the cells that have no verdict there yet.

Exit codes as `pdchaos run`: 0 every cell passed, 1 a cell failed, 2 unknown, 3 usage error. Skipped cells
(a router that cannot run them) are neither.
"""

MATRIX_JSON = "matrix.json"
MATRIX_SCHEMA = "pdchaos.matrix/1"


def router_dir_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label) or "router"


def skip_reason(adapter: RouterAdapter, scenario: Scenario, cell: Cell) -> str | None:
    """Why this router cannot run that cell (None: it runs)."""
    if problem := adapter.mode_problem(cell.topology):
        return problem
    if isinstance(adapter, GatewayAdapter):
        return adapter.cannot_run(scenario, cell.topology, cell.connector, cell.transport)
    if isinstance(adapter, ProfileRouter) and (problem := adapter.transport_problem(cell.transport)):
        return problem
    if scenario.router.inject_bugs and not adapter.supports_inject_bug:
        return f"injects bug(s) {', '.join(scenario.router.inject_bugs)} into the reference router"
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
    spec: str | RouterAdapter, pairs: Sequence[tuple[Scenario, Cell]], label: str | None = None,
    settings: str | None = None,
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
            router = s.router if settings is None else apply_preset(s, preset(settings)).router
            for a in adapter.adjustments(router):
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
    jobs: int = 1,
    settings: str | None = None,
    resume: bool = False,
    repeat: int = 1,
) -> dict[str, list[Any]]:
    """Run every cell against every router, `jobs` cells at once (one router after the other: two gateway
    releases never share the machine's attention in one comparison); returns results by router label and
    writes matrix.json and the comparison report into out_dir. `settings`: a preset for every cell (None:
    scaled). `resume`: cells already judged in out_dir are taken as they are."""
    from harness.races import fold_repeats
    from reports import write_reports
    from reports.compare import write_comparison

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local folder, once per matrix
    started = time.time()
    pairs = expand_matrix(scenarios, topologies, connectors, transports)
    plans = [plan_router(r, pairs, settings=settings) for r in routers]
    unique_labels(plans)
    extra = {"scenarios": [s.name for s in scenarios], "seed": seed, "settings": settings or "scaled",
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
            progress=_Lines(p.label, len(p.run) * repeat) if progress else None, jobs=jobs,
            settings=settings, reuse=resume, repeat=repeat, report_parts=True,
        )
        results[p.label] = fold_repeats(results[p.label], repeat)
        write_reports(results[p.label], sub)
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



def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="pdchaos matrix", description=_USAGE,
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    parents=[cell_filters(), world_and_settings(None), repeats()])
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help="scenario names or files (FILE.py::NAME: one of a file; none: the default suite)")
    p.add_argument("--router", action="append", metavar="SPEC",
                   help="repeatable: reference, smg, smg==X.Y.Z, smg==latest, vllm-router[==X.Y.Z], "
                   "cmd:<template> (default: reference and smg==latest)")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: runs/compare-<timestamp-id>")
    p.add_argument("--seed", type=seed_arg, default=0, metavar="N", help="workload seed, 0 to 2**32-1")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--jobs", type=jobs_arg, default=None, metavar="N", help=JOBS_HELP)
    p.set_defaults(settings="scaled")  # real time only: its default preset
    p.add_argument("--resume", action="store_true",
                   help="go on with the matrix in --out: cells already judged there are not run again")
    p.add_argument("--compare-only", type=Path, metavar="MATRIX_DIR",
                   help="only re-render compare.json/html/md of a finished (or partial) matrix folder")
    return p


def _out_problem(out: Path, args: argparse.Namespace) -> str | None:
    """Why the matrix cannot write into `out` (None: it can)."""
    from harness.suite import out_folder_problem

    if args.resume:
        if args.out is None:
            return "--resume needs --out: the folder of the matrix to go on with"
        try:
            doc = json.loads((out / MATRIX_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return f"--resume: {out} holds no readable {MATRIX_JSON} ({type(e).__name__})"
        for key, value in (("seed", args.seed), ("settings", args.settings)):
            if doc.get(key, "scaled" if key == "settings" else None) != value:
                return (f"--resume: {out} was run with {key} {doc.get(key)!r}, not {value!r}: its cells "
                        "would not be comparable")
        return None
    return out_folder_problem(out, "matrix folder", resume=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from reports.compare import findings_lines, load_comparison, markdown_table, write_comparison

    if args.compare_only is not None:
        try:
            write_comparison(args.compare_only)
        except (OSError, ValueError) as e:
            print(f"pdchaos: error: {e}", file=sys.stderr)
            return 3
        comp = load_comparison(args.compare_only)
        print(markdown_table(comp))
        print("\n".join(findings_lines(comp)))
        return exit_code(comp.status, args.fail_on)
    from harness.routers import router_profile
    from harness.routers.gateways.spec import parse_router_spec
    from harness.suite import UsageError, select_suite

    routers = args.router or ["reference", "smg==latest"]
    try:
        for spec in routers:
            if router_profile(spec) is None:  # a profile: the reference router with a release's switches
                parse_router_spec(spec)
        topologies, scenarios = select_suite(args)
    except (UsageError, RouterAdapterError) as e:
        print(f"pdchaos: error: {e}", file=sys.stderr)
        return 3
    out = args.out or Path("runs") / ("compare-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
                                      + "-" + uuid.uuid4().hex[:6])
    problem = _out_problem(out, args)
    if problem:
        print(f"pdchaos: error: {problem}", file=sys.stderr)
        return 3
    mark_processes(out)
    try:
        asyncio.run(run_matrix(
            scenarios, routers, out, topologies,
            [args.connector] if args.connector else None,
            [args.transport] if args.transport else None,
            seed=args.seed, progress=not args.no_progress, jobs=args.jobs or default_jobs(),
            settings=None if args.settings == "scaled" else args.settings, resume=args.resume,
            repeat=args.repeat,
        ))
    except RouterAdapterError as e:
        print(f"pdchaos: error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        if (out / MATRIX_JSON).is_file():
            write_comparison(out)
            print(markdown_table(load_comparison(out)))
        print(f"pdchaos: interrupted: partial comparison, verdict UNKNOWN; go on with the same command and "
              f"--out {out} --resume", file=sys.stderr)
        return 2
    comp = load_comparison(out)
    print(markdown_table(comp))
    print("\n".join(findings_lines(comp)))
    print(f"pdchaos: comparison: {out / 'compare.html'} ({out / 'compare.md'}, {out / 'compare.json'})")
    return exit_code(comp.status, args.fail_on)


if __name__ == "__main__":
    sys.exit(main())
