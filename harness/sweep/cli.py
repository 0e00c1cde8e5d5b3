"""`pdchaos sweep`: run a sweep file, compare it with a baseline run, or show what it would do.

Exit codes as `pdchaos run` (0 pass, 1 fail, 2 unknown, 3 usage or configuration error), except with
`--fail-on`: then 1 when the comparison with the baseline finds what it names, else 0 (a cell that failed
in the baseline too is not news to a regression gate).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.jobs import JOBS_HELP, default_jobs, jobs_arg
from harness.races import EXIT_BY_STATUS
from harness.usage_parser import EXIT_USAGE, UsageParser

FAIL_ON = ("regression", "verdict", "change")

_USAGE = """Run a sweep: scenarios x topologies x connectors x transports x routers x worlds x settings x
engine backends, less its exclusions (the file format: harness/sweep/spec.py; shipped sweeps in
scenarios/sweeps/, found by name).

    pdchaos sweep ci-regression --jobs 4                      the CI sweep, 4 cells at once
    pdchaos sweep ci-regression --baseline runs/base --fail-on regression
    pdchaos sweep gpu-cluster --dry-run                        pods, services and fault actions
    KUBECONFIG=... pdchaos sweep fake-cluster                  fake engines as pods, router outside
    pdchaos sweep --compare-only runs/sweep-X --baseline runs/base

Cells of a k8s engine backend run on the cluster of the table's kubeconfig/context (or $KUBECONFIG) when
they can (the pdchaos-fake preset, router = "outside"); the others are left out with the reason. No
cluster? `python -m harness.kube.fake_cluster --root DIR --kubeconfig DIR/kubeconfig` serves a fake one.

--fail-on: regression (a verdict got worse, a number got worse beyond its noise threshold, or a new cell
does not pass), verdict (verdicts only), change (any difference, new and gone cells included).
"""


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="pdchaos sweep", description=_USAGE,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", nargs="?", metavar="FILE", help="a sweep file, or the name of a shipped one")
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="a previous run or sweep folder (its report.json) to compare with")
    p.add_argument("--fail-on", choices=FAIL_ON, default=None,
                   help="exit 1 when the comparison finds this, else 0 (needs a baseline)")
    p.add_argument("--jobs", type=jobs_arg, default=None, metavar="N", help=JOBS_HELP)
    p.add_argument("--dry-run", action="store_true",
                   help="print the cells, the cells left out and why, and every cluster manifest and action")
    p.add_argument("--json", action="store_true", help="with --dry-run: one JSON document")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: runs/sweep-<name>-<timestamp-id>")
    p.add_argument("--resume", action="store_true",
                   help="go on with the sweep in --out: cells already judged there are not run again")
    p.add_argument("--compare-only", type=Path, metavar="SWEEP_DIR",
                   help="compare a finished run or sweep folder with --baseline; run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from harness.suite import UsageError
    from harness.sweep.cells import BaselineError
    from harness.sweep.spec import SweepError

    try:
        return _main(args)
    except (SweepError, UsageError, BaselineError) as e:
        print(f"pdchaos: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _main(args: argparse.Namespace) -> int:
    from harness.suite import UsageError, out_folder_problem
    from harness.sweep.spec import LOCAL_ENGINES, load_sweep

    if args.compare_only is not None:
        if args.baseline is None:
            raise UsageError("--compare-only needs --baseline")
        return _compare_only(args)
    if args.sweep is None:
        raise UsageError("name a sweep file (or --compare-only DIR --baseline DIR)")
    spec = load_sweep(args.sweep)
    from harness.sweep.plan import plan_sweep

    plan = plan_sweep(spec)
    real_local = set(spec.worlds) == {"real"} and set(spec.engines) == {LOCAL_ENGINES}
    jobs = args.jobs or spec.jobs or default_jobs(real_time=real_local)
    if args.dry_run:
        return _dry_run(plan, jobs, args.json)
    if args.json:
        raise UsageError("--json goes with --dry-run (a run's documents are its report.json and sweep.json)")
    baseline = args.baseline or (spec.relative(spec.baseline) if spec.baseline else None)
    if args.fail_on and baseline is None:
        raise UsageError("--fail-on needs --baseline (or [sweep] baseline in the file)")
    if baseline is not None and not (Path(baseline) / "report.json").is_file():
        raise UsageError(f"baseline {baseline} has no report.json")
    if not plan.cells:
        raise UsageError(f"sweep {spec.name} has no cell to run ({len(plan.skipped)} left out)")
    _check_clusters(plan)
    out = args.out or Path("runs") / f"sweep-{spec.name}-{_stamp()}"
    if args.resume and args.out is None:
        raise UsageError("--resume needs --out: the folder of the sweep to go on with")
    if args.resume and not out.is_dir():
        raise UsageError(f"--resume: no sweep folder at {out}")
    if args.resume and (problem := resume_problem(out, spec.name)):
        raise UsageError(f"--resume: {problem}")
    problem = None if args.resume else out_folder_problem(out, "sweep folder", resume=True)
    if problem:
        raise UsageError(problem)
    out.mkdir(parents=True, exist_ok=True)
    return _run(plan, out, jobs, baseline, args)


def resume_problem(out: Path, name: str) -> str | None:
    """Why `out` is not a folder of the sweep `name` to go on with (None: it is, or it is one that was
    stopped before it wrote anything): a resumed sweep rewrites the folder's reports."""
    from harness.sweep.cells import SWEEP_JSON

    path = out / SWEEP_JSON
    if path.is_file():
        try:
            held = json.loads(path.read_text(encoding="utf-8")).get("name")
        except (OSError, ValueError, AttributeError) as e:
            return f"{path} is unreadable ({e})"
        return None if held == name else f"{out} holds the sweep {held!r}, not {name!r}"
    if (out / "report.json").is_file():
        return f"{out} holds a run, not a sweep (it has no {SWEEP_JSON})"
    return None


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def _check_clusters(plan: Any) -> None:
    """Each cluster the sweep's engine backends name can be reached (its kubeconfig read): one line before
    anything starts, rather than every cell of that backend unknown."""
    from harness.suite import UsageError
    from harness.sweep.run import backends_used
    from harness.worlds.real.kube_engines import cluster_problem

    for name, backend in backends_used(plan).items():
        if (problem := cluster_problem(backend.options)) is not None:
            raise UsageError(f"[engines.{name}]: {problem}")


def _dry_run(plan: Any, jobs: int, as_json: bool) -> int:
    from harness.sweep.dryrun import dry_run_document, print_dry_run

    doc = dry_run_document(plan, jobs)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        print_dry_run(doc, sys.stdout)
    return 1 if doc["schema"]["problems"] else 0


def _run(plan: Any, out: Path, jobs: int, baseline: Path | None, args: argparse.Namespace) -> int:
    from harness.progress import ProgressReporter
    from harness.runner import update_latest
    from harness.sweep.run import partial_sweep, run_sweep, write_sweep_json
    from harness.worlds.real.processes import mark_processes

    mark_processes(out)
    update_latest(out)
    print(f"pdchaos: sweep {plan.spec.name}: {len(plan.cells)} cells ({len(plan.skipped)} left out), "
          f"{jobs} at once -> {out}", file=sys.stderr, flush=True)

    async def go() -> Any:
        progress = None if args.no_progress else ProgressReporter(out, total=len(plan.cells))
        if progress is not None:
            progress.start()
        try:
            return await run_sweep(plan, out, jobs, progress, reuse=args.resume)
        finally:
            if progress is not None:
                await progress.stop()

    try:
        run = asyncio.run(go())
    except KeyboardInterrupt:
        run = partial_sweep(plan, out, jobs)
        write_sweep_json(run)
        _write_reports(run)
        _report(out, baseline, plan.spec.thresholds, None, run.results)
        print(f"pdchaos: interrupted: partial report of {len(run.ran)} of {len(plan.cells)} cells, verdict "
              f"UNKNOWN (go on with the same command and --out {out} --resume)", file=sys.stderr)
        return EXIT_BY_STATUS["unknown"]
    write_sweep_json(run)
    _write_reports(run)
    return _report(out, baseline, plan.spec.thresholds, args.fail_on, run.results)


def _write_reports(run: Any) -> None:
    from reports import write_reports
    from reports.json_report import write_json
    from reports.junit import write_junit

    for group, results in run.groups().items():
        write_reports(results, run.out / group)
    write_json(run.results, run.out)
    write_junit(run.results, run.out)


def _compare_only(args: argparse.Namespace) -> int:
    from harness.sweep.spec import Thresholds, load_sweep

    thresholds = load_sweep(args.sweep).thresholds if args.sweep else Thresholds()
    return _report(args.compare_only, args.baseline, thresholds, args.fail_on, None)


def _report(out: Path, baseline: Path | None, thresholds: Any, fail_on: str | None,
            results: Sequence[Any] | None) -> int:
    from harness.findings import findings_delta, findings_of_folder
    from harness.sweep.cells import SWEEP_JSON, load_cells
    from harness.sweep.compare import compare
    from harness.sweep.run import status_of
    from reports.sweep import write_sweep_report

    current = load_cells(out)
    comparison = None
    if baseline is not None:
        comparison = compare(load_cells(baseline), current, thresholds, baseline, out)
        comparison.findings = findings_delta(findings_of_folder(baseline), findings_of_folder(out))
    sweep_doc: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        sweep_doc = json.loads((out / SWEEP_JSON).read_text(encoding="utf-8"))
    written = write_sweep_report(out, sweep_doc or {"name": out.name}, current, comparison)
    for line in summary_lines(current, comparison):
        print(line)
    print(f"pdchaos: sweep report: {written['html']}" + (f" ({written['comparison']})"
                                                         if "comparison" in written else ""))
    status = status_of(r.status for r in (current.values() if results is None else results))
    if fail_on is None:
        return EXIT_BY_STATUS.get(status, 2)
    assert comparison is not None
    return 1 if gate(comparison, fail_on) else 0


def gate(comparison: Any, fail_on: str) -> bool:
    """Whether `--fail-on` finds what it names."""
    if fail_on == "change":
        return bool(comparison.differences())
    if fail_on == "verdict":
        return any(r.kind == "regression" and (r.verdict_change or r.baseline is None)
                   for r in comparison.rows)
    return bool(comparison.regressions)


def summary_lines(current: Any, comparison: Any) -> list[str]:
    from harness.findings import delta_lines
    from harness.text import clip

    lines = []
    counts = {s: sum(1 for r in current.values() if r.status == s) for s in ("pass", "fail", "unknown")}
    for key in sorted(current):
        rec = current[key]
        if rec.status != "pass":
            lines.append(f"  {rec.status.upper():8} {key.label}  {clip(rec.reason, 150)}")
            if rec.replay:
                lines.append(f"           replay: {rec.replay}")
    lines.append(f"pdchaos: {len(current)} cells: {counts['pass']} pass, {counts['fail']} fail, "
                 f"{counts['unknown']} unknown")
    if comparison is None:
        return lines
    c = comparison.counts()
    lines.append(f"pdchaos: against {comparison.baseline_dir}: "
                 + ", ".join(f"{n} {k}" for k, n in c.items()))
    for row in comparison.differences():
        lines.append(f"  {row.kind.upper():11} {row.key.label}")
        for why in row.why:
            lines.append(f"              {clip(why, 200)}")
        for v in (row.current.failing if row.kind == "regression" and row.current is not None else []):
            reason = clip(str(v.get('reason')), 160)
            lines.append(f"              {v.get('status')} {v.get('name')}: {reason}")
    return lines + delta_lines(comparison.findings, str(comparison.baseline_dir))
