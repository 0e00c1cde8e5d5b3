"""The search driver: seeds handed to worker processes or a Ray cluster (a `concurrent.futures` executor from
`harness.search.executors`, one seed per task: seeds are independent), results gathered into the summary and
every failure written as a scenario file.

In real time (`SearchOptions.world == "real"`) a seed's failures are confirmed by replay and on the reference
router (`harness.search.realtime`), the shifted schedules are not run, and each finding also gets its bug
report (`harness.search.report`).

Only the driver reads the clock: the budget decides when no new seed starts and when each seed stops
generating (then shrinking) cases; nothing a run sees depends on it.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from dataclasses import dataclass, field
from pathlib import Path

from harness.findings.group import known_as, search_signature_as_finding
from harness.search import DEFAULT_EXAMPLES, DEFAULT_SHIFTS_S
from harness.search.execute import RunOutcome
from harness.search.executors import RayExecutor, open_executor
from harness.search.found import failing_reason, write_found
from harness.search.report import Finding, write_report
from harness.search.seedrun import INTERRUPTED, SeedJob, SeedResult, search_seed
from harness.search.signature import Signature
from harness.search.strategies import Space
from harness.search.summary import FoundEntry, Summary


@dataclass(frozen=True)
class SearchOptions:
    out: Path
    bugs: tuple[str, ...] = ()
    router: str = "reference"
    budget_s: float = 60.0
    shrink_s: float = 60.0
    seeds: int | None = None
    first_seed: int = 0
    jobs: int = 1
    examples: int = DEFAULT_EXAMPLES
    shifts: tuple[float, ...] = DEFAULT_SHIFTS_S
    space: Space = field(default_factory=Space)
    settings_label: str = "scaled"
    # Stop generating once any seed finds a failure (it is still shrunk): time to first failure without
    # spending the rest of the budget.
    stop_at_first: bool = False
    # Run the seeds on Ray (`local`, `auto`, `ray://HOST:PORT`; see harness.search.executors) rather than in
    # this machine's worker processes.
    ray: str | None = None
    # With `ray`: as many seeds at once as the cluster has CPUs, rather than `jobs`.
    jobs_from_cluster: bool = False
    # "sim", or "real": real time at scaled settings, `router` any spec `pdchaos run --router` takes.
    world: str = "sim"
    # --known RUN: the signatures a run of the shipped scenarios shows (as findings key them) -> the cells
    # that show each, and that run's folder. None: findings are not compared.
    known: dict[str, list[str]] | None = None
    known_from: str | None = None
    # --skip-known: while searching, pass by a case whose every failure `known` holds (the budget goes to new
    # ones). False: every failure counts, and is marked known or new.
    skip_known: bool = False

    @property
    def stop_file(self) -> Path | None:
        return self.out / "work" / "found-one" if self.stop_at_first else None

    @property
    def halt_file(self) -> Path:
        return self.out / "work" / "interrupted"

    def stopped(self) -> bool:
        return self.stop_file is not None and self.stop_file.exists()


def _seeds(opts: SearchOptions) -> Iterator[int]:
    if opts.seeds is None:
        return itertools.count(opts.first_seed)
    return iter(range(opts.first_seed, opts.first_seed + opts.seeds))


def _job(opts: SearchOptions, seed: int, search_until: float) -> SeedJob:
    return SeedJob(seed=seed, bugs=opts.bugs, work_dir=opts.out / "work" / f"seed-{seed}", space=opts.space,
                   max_examples=opts.examples, search_until=search_until,
                   shrink_until=search_until + opts.shrink_s, router=opts.router,
                   stop_file=opts.stop_file, halt_file=opts.halt_file, shrink_s=opts.shrink_s,
                   shifts=opts.shifts if opts.world == "sim" else (), world=opts.world,
                   skip=frozenset(opts.known or ()) if opts.skip_known else frozenset())


def _record(summary: Summary, opts: SearchOptions, res: SeedResult, started_after_s: float) -> None:
    summary.seeds_tried += 1
    summary.runs += res.runs
    summary.unsound_runs += res.unsound_runs
    summary.shift_runs += res.shift_runs
    summary.fragile_failures += res.fragile
    summary.replay_runs += res.real.replay_runs
    summary.reference_runs += res.real.reference_runs
    summary.redrawn += res.real.redrawn
    summary.known_passed += res.known_passed + res.real.known_passed
    summary.set_aside += [{"seed": res.seed, **a.as_dict()} for a in res.real.set_aside]
    f = res.found
    if f is None:
        return
    reason = failing_reason(f.outcome, f.signature)
    path = write_found(opts.out, f.signature, res.seed, opts.bugs, f.original, f.shrunk, reason,
                       opts.shifts if opts.world == "sim" else (), opts.router, opts.world)
    when = started_after_s + f.found_after_s
    if summary.time_to_first_failure_s is None or when < summary.time_to_first_failure_s:
        summary.time_to_first_failure_s = when
    shrunk = {**f.shrunk.size(), "requests": f.outcome.requests}
    entry = FoundEntry(res.seed, f.signature.text, str(path), round(when, 3), f.original.size(), shrunk,
                       f.shrink_runs)
    if opts.known is not None:
        entry.shown_by = _shown_by(opts.known, f.signature, f.outcome)
    if opts.world == "real":
        report = write_report(Finding(f.signature, res.seed, opts.router, opts.bugs, f.original, f.shrunk,
                                      f.outcome, f.reference, path))
        entry.report = str(report)
        entry.reference = _reference_verdict(f.reference)
    summary.found.append(entry)


def _shown_by(known: dict[str, list[str]], sig: Signature, outcome: RunOutcome) -> list[str]:
    """The cells of the --known run that show the failure: its own signature, or a lead of the same run
    that absorbs it (a symptom of a known problem is not a new one)."""
    keys = known_as(search_signature_as_finding(sig.checker, sig.reason), known, outcome.absorbed)
    return list(dict.fromkeys(cell for key in keys for cell in known[key]))


def _reference_verdict(ref: RunOutcome | None) -> str:
    if ref is None:
        return "not run"
    return "pass" if ref.passed else "did not pass"


def _collect_halted(summary: Summary, opts: SearchOptions, running: dict[Future[SeedResult], float]) -> None:
    """Tell the running seeds to stop (each does before its next run) and keep what they found and shrank so
    far; a second Ctrl-C stops the waiting."""
    opts.halt_file.touch()
    for fut in running:
        fut.cancel()  # not started yet: nothing to keep
    for fut in as_completed([f for f in running if not f.cancelled()]):
        if fut.exception() is None:
            _record(summary, opts, fut.result(), running[fut])


def run_search(opts: SearchOptions) -> Summary:
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "work").mkdir(exist_ok=True)
    summary = Summary(list(opts.bugs), opts.router, opts.settings_label, opts.budget_s, opts.jobs,
                      shifts=opts.shifts if opts.world == "sim" else (), world=opts.world,
                      known_from=opts.known_from, skip_known=opts.skip_known)
    start = time.time()
    search_until = start + opts.budget_s
    seeds = _seeds(opts)
    if opts.jobs <= 1 and opts.ray is None:
        try:
            for seed in seeds:
                if time.time() >= search_until or opts.stopped():
                    break
                began = time.time() - start
                res = search_seed(_job(opts, seed, search_until))
                _record(summary, opts, res, began)
                if res.stopped == INTERRUPTED:
                    summary.interrupted = True
                    break
        except KeyboardInterrupt:  # between two seeds
            summary.interrupted = True
    else:
        with open_executor(opts.ray, opts.jobs) as pool:
            running: dict[Future[SeedResult], float] = {}
            width = pool.cpus if opts.jobs_from_cluster and isinstance(pool, RayExecutor) else opts.jobs
            summary.jobs = width

            def submit() -> bool:
                if time.time() >= search_until or opts.stopped():
                    return False
                seed = next(seeds, None)
                if seed is None:
                    return False
                running[pool.submit(search_seed, _job(opts, seed, search_until))] = time.time() - start
                return True

            try:
                for _ in range(width):
                    if not submit():
                        break
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in done:
                        began = running.pop(fut)
                        _record(summary, opts, fut.result(), began)
                        submit()
            except KeyboardInterrupt:
                summary.interrupted = True
                with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: keep what was collected
                    _collect_halted(summary, opts, running)
    summary.found.sort(key=lambda f: f.found_after_s)
    summary.wall_s = time.time() - start
    summary.write(opts.out)
    return summary
