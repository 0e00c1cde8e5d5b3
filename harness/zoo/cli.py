"""`pdchaos zoo`: the detection matrix of the bug switches over a scenario set."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.cli_args import cell_filters, world_and_settings
from harness.jobs import JOBS_HELP, default_jobs, jobs_arg
from harness.usage_parser import UsageParser, seed_arg, seed_problem

_USAGE = """\
Run the scenario set (default: the default suite, as `pdchaos run` runs it) once with no bug switch (the
baseline, --baseline-runs times) and once per bug switch, on every cell where that bug can occur, and write
the detection matrix: per switch and cell, caught or not, which checkers caught it and the evidence line that
names the mechanism. Router switches go into the reference router, engine switches into the fake engines.

Simulated time (the default world) runs at production settings by default: minutes for the whole matrix.
Real time runs at scaled settings (each cell takes seconds: pick switches and scenarios).

Exit status: 0 every switch is caught on every transport it can occur on and no checker failed in a
baseline run; 1 a hole or a false alarm (listed in zoo.md); 2 interrupted, or planned runs left without a
history (the matrix is partial: unknown); 3 bad arguments.

examples:
  pdchaos zoo                                   # every switch, default suite, simulated, production
  pdchaos zoo --list                            # the switches: name, side, zoo entry, where, symptom
  pdchaos zoo --bug legs_joined --bug error_as_200 prefill_fails_requests --world real
"""


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="pdchaos zoo", description=_USAGE,
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    parents=[cell_filters(), world_and_settings("sim")])
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help="scenario names or files (FILE.py::NAME: one of a file; none: the default suite, "
                   "cut to its suite cells)")
    p.add_argument("--bug", action="append", metavar="NAME",
                   help="a switch to include (repeatable; default: all of them)")
    p.add_argument("--baseline-runs", type=int, default=1, metavar="N",
                   help="baseline runs per cell (no switch); 3 shows flaky verdicts (default 1)")
    p.add_argument("--jobs", type=jobs_arg, default=None, metavar="N", help=JOBS_HELP)
    p.add_argument("--seed", type=seed_arg, default=0, metavar="N", help="workload seed, 0 to 2**32-1")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: runs/zoo-<timestamp-id>")
    p.add_argument("--list", action="store_true", help="list the switches and exit")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--rejudge", type=Path, metavar="ZOO_DIR",
                   help="rebuild zoo.json/zoo.md of a finished or interrupted zoo folder from its cell "
                   "histories (judged again with today's checkers)")
    again.add_argument("--resume", type=Path, metavar="ZOO_DIR",
                   help="run what an interrupted zoo folder has not run yet (its plan.json), then write its "
                   "matrix")
    p.add_argument("--no-progress", action="store_true")
    return p


def _switches(names: Sequence[str] | None) -> dict[str, Any]:
    from harness.scenario.bugs import SWITCHES, unknown_bugs
    from harness.suite import UsageError

    if not names:
        return dict(SWITCHES)
    bad = unknown_bugs(names)
    if bad:
        raise UsageError(f"unknown bug {', '.join(bad)} (known: {', '.join(sorted(SWITCHES))})")
    return {n: SWITCHES[n] for n in dict.fromkeys(names)}


def _restrict(scenarios: list[Any], args: argparse.Namespace) -> list[Any]:
    from dataclasses import replace

    from harness.suite import split_topologies

    tops = split_topologies(args.topology)
    out = []
    for s in scenarios:
        cut = replace(
            s,
            topologies=tuple(t for t in s.topologies if tops is None or t in tops),
            connectors=tuple(c for c in s.connectors if args.connector in (None, c)),
            transports=tuple(t for t in s.transports if args.transport in (None, t)),
        )
        if cut.matrix():
            out.append(cut)
    return out


class _Progress:
    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.done, self.quiet = total, 0, quiet

    def finish(self, out: Any, status: str) -> None:
        self.done += 1
        if not self.quiet:
            print(f"[{self.done}/{self.total}] {status:7s} {Path(out).parent.name}/{Path(out).name}",
                  file=sys.stderr, flush=True)


async def run_zoo(
    scenarios: Sequence[Any], switches: dict[str, Any], out: Path, world: str, settings: str,
    baseline_runs: int, jobs: int, seed: int, quiet: bool,
) -> Any:
    from harness.runner import scenario_reference
    from harness.zoo.matrix import build_matrix
    from harness.zoo.plan import zoo_plan
    from harness.zoo.rejudge import write_plan

    by_name = {s.name: s for s in scenarios}
    runs = zoo_plan(scenarios, list(switches.values()), baseline_runs)
    named = [scenario_reference(s) or s.name for s in scenarios]
    write_plan(out, runs, {"world": world, "settings": settings, "seed": seed,
                           "scenarios": list(dict.fromkeys(named))})
    results = await _execute(runs, by_name, out, world, settings, seed, jobs, quiet)
    return build_matrix(runs, results, switches, world, settings)


async def _execute(
    runs: Sequence[Any], by_name: dict[str, Any], out: Path, world: str, settings: str, seed: int, jobs: int,
    quiet: bool,
) -> list[Any]:
    from harness.parallel import CellJob, run_cells
    from harness.scenario.bugs import with_bugs
    from harness.worlds.real.processes import mark_processes

    mark_processes(out)

    cell_jobs = [
        CellJob(
            scenario=with_bugs(by_name[r.scenario], [r.switch]) if r.switch else by_name[r.scenario],
            cell=r.cell, out_dir=out / "cells" / r.folder, seed=seed, world=world, settings=settings,
        )
        for r in runs
    ]
    return await run_cells(cell_jobs, jobs, _Progress(len(cell_jobs), quiet))


def _check_named_switches_occur(switches: Any, scenarios: Any) -> None:
    """A switch named with --bug that can occur in none of the selected cells would be listed as a hole,
    though never run: say so instead."""
    from harness.scenario.bugs import absent_bug
    from harness.suite import UsageError

    absent = absent_bug([sw.name for sw in switches], [(c, tr) for s in scenarios for _, c, tr in s.matrix()],
                        "selected cells")
    if absent is not None:
        raise UsageError(f"--bug {absent}")


def _resume(out: Path, jobs: int, quiet: bool) -> int:
    """Run the planned runs of a zoo folder that were not judged yet (no history, or one an interruption cut
    short: the runner saves a cell's result only once judged), then judge them all."""
    from harness.suite import UsageError, load_named
    from harness.zoo.rejudge import finished, history_of, read_plan

    try:
        runs, meta = read_plan(out)
        by_name = {s.name: s for s in load_named(meta["scenarios"])}
    except (OSError, KeyError, ValueError, UsageError) as e:
        print(f"pdchaos: error: {out}: {e}", file=sys.stderr)
        return 3
    seed = meta.get("seed", 0)
    if (problem := seed_problem(seed)) is not None:
        print(f"pdchaos: error: {out / 'plan.json'}: {problem}", file=sys.stderr)
        return 3
    todo = [r for r in runs if not finished(history_of(out, r))]
    done = len(runs) - len(todo)
    print(f"pdchaos zoo: {done} of {len(runs)} runs done; running {len(todo)}", file=sys.stderr)
    try:
        asyncio.run(_execute(todo, by_name, out, meta["world"], meta["settings"], seed, jobs, quiet))
    except KeyboardInterrupt:
        return _interrupted(out)
    return _rejudge(out, jobs=jobs)


def _interrupted(out: Path) -> int:
    """Ctrl-C: the partial matrix of what finished (unknown, exit 2)."""
    from harness.zoo.rejudge import PLAN_FILE

    print(f"pdchaos: interrupted; partial matrix below; go on with: pdchaos zoo --resume {out}",
          file=sys.stderr)
    if (out / PLAN_FILE).is_file():
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: no matrix, at once
            _rejudge(out, fresh=False)
    return 2


def _rejudge(out: Path, fresh: bool = True, jobs: int = 1) -> int:
    """The matrix of a zoo folder: its runs judged again (`fresh`), else as the runner saved them."""
    from harness.scenario.bugs import SWITCHES
    from harness.suite import UsageError, load_named
    from harness.zoo.matrix import build_matrix
    from harness.zoo.rejudge import read_plan, rejudge
    from harness.zoo.report import markdown, write_zoo

    try:
        runs, meta = read_plan(out)
        scenarios = {s.name: s for s in load_named(meta["scenarios"])}
    except (OSError, KeyError, ValueError, UsageError) as e:
        print(f"pdchaos: error: {out}: {e}", file=sys.stderr)
        return 3
    kept, results = rejudge(out, runs, scenarios, fresh, jobs)
    names = {r.switch for r in kept if r.switch}
    matrix = build_matrix(kept, results, {n: SWITCHES[n] for n in sorted(names) if n in SWITCHES},
                          meta["world"], meta["settings"])
    matrix.unjudged = len(runs) - len(kept)
    js, md = write_zoo(out, matrix)
    print(markdown(matrix))
    print(f"pdchaos zoo: {len(kept)} of {len(runs)} runs had a history; {md} and {js}", file=sys.stderr)
    return 0 if matrix.ok else 2 if matrix.unjudged else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from harness.suite import UsageError, default_suite, load_named, out_folder_problem
    from harness.zoo.report import markdown, write_zoo
    from pdchaos.bugs import list_text

    if args.rejudge is not None:
        return _rejudge(args.rejudge, jobs=args.jobs or default_jobs())
    if args.resume is not None:
        return _resume(args.resume, args.jobs or default_jobs(), args.no_progress)
    try:
        switches = _switches(args.bug)
        if args.list:
            print(list_text(switches.values()))
            return 0
        if args.baseline_runs < 1:
            raise UsageError("--baseline-runs must be at least 1")
        loaded = load_named(args.scenarios)
        scenarios = loaded if args.scenarios else default_suite(loaded, args.world)
        if args.world == "sim":
            scenarios = [s for s in scenarios if "sim" in s.worlds]
        scenarios = _restrict(scenarios, args)
        if not scenarios:
            raise UsageError("no scenario cells to run")
        if args.bug:
            _check_named_switches_occur(switches.values(), scenarios)
    except (UsageError, ValueError) as e:
        print(f"pdchaos: error: {e}", file=sys.stderr)
        return 3
    settings = args.settings or ("production" if args.world == "sim" else "scaled")
    out = args.out or Path("runs") / ("zoo-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
                                      + "-" + uuid.uuid4().hex[:6])
    problem = out_folder_problem(out, "zoo folder")
    if problem:
        print(f"pdchaos: error: {problem}", file=sys.stderr)
        return 3
    started = time.monotonic()
    try:
        matrix = asyncio.run(run_zoo(scenarios, switches, out, args.world, settings, args.baseline_runs,
                                     args.jobs or default_jobs(), args.seed, args.no_progress))
    except KeyboardInterrupt:
        return _interrupted(out)
    js, md = write_zoo(out, matrix)
    print(markdown(matrix))
    print(f"pdchaos zoo: {time.monotonic() - started:.0f} s wall; {md} and {js}", file=sys.stderr)
    return 0 if matrix.ok else 1
