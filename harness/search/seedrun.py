"""One seed of a search: Hypothesis generates cases from the seed until one fails, then shrinks it keeping
its failure signature.

Hypothesis is both the generator and the shrinker: the test function runs a case and raises `_Failed` only
when the case fails with the signature being shrunk (the first failure's first signature), so every smaller
case Hypothesis keeps fails the same way. We record each failing case as Hypothesis finds it: the last one
recorded is the smallest so far, which survives a budget that runs out mid-shrink. No example database
(`database=None`) and an explicit seed: the same seed draws the same cases.

A failure counts only when it is robust: the case also fails the same way with its whole fault schedule
shifted later by each of `SeedJob.shifts` (a fraction of a probe interval) against the load and the probes.
Simulated time carries a schedule out at exactly the same phase every run; real time does not, and a failure
that needs one phase (a crash landing just before a probe, the third failure opening a breaker just before a
retry) is gone when the case is replayed in real time. A fragile failure is counted and set aside.

In real time (`SeedJob.world == "real"`: the router under test runs as processes on loopback) the shift rule
is replaced by the replay rule of `harness.search.realtime`: a failure counts when the case fails the same
way twice on the router under test and the reference router passes it (each real run takes seconds, and
real time shifts the phase by itself). A case the real world cannot carry out for that router is rejected
(Hypothesis draws another); each case is run and judged once, its decision kept for Hypothesis' replays.
Shrinking runs in real time too, bound by the shrink budget: each smaller case that fails once is confirmed
the same way before it is kept, so the case recorded last is always a confirmed failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, find, given, reject, settings
from hypothesis import seed as hypothesis_seed

from harness.findings.group import unknown_signatures
from harness.search import DEFAULT_EXAMPLES, DEFAULT_SHIFTS_S
from harness.search.case import SearchCase, shifted
from harness.search.execute import RunOutcome, run_case
from harness.search.realtime import RealCounts, RealJudge, real_problem
from harness.search.signature import Signature
from harness.search.strategies import Space, search_cases


class _Failed(Exception):
    """The case failed with the signature being searched for (Hypothesis shrinks on it)."""


class _Stop(BaseException):
    """Out of time: a BaseException, so Hypothesis does not take it for a failure and stops at once."""


class _Halt(BaseException):
    """The search was interrupted."""


# `SeedResult.stopped` of a seed the search's interruption stopped.
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class SeedJob:
    seed: int
    bugs: tuple[str, ...]
    work_dir: Path
    space: Space = field(default_factory=Space)
    max_examples: int = DEFAULT_EXAMPLES
    # time.time() after which no new case is generated, and after which shrinking stops.
    search_until: float = float("inf")
    shrink_until: float = float("inf")
    router: str = "reference"
    # A file whose existence means some seed of the search found a failure (`--stop-at-first`): no seed
    # generates another case then, and the seed that found one makes it when it does.
    stop_file: Path | None = None
    # A file whose existence means the search was interrupted: the seed stops at once, searching or shrinking,
    # and returns what it has.
    halt_file: Path | None = None
    # Shrinking also stops this long after the failure was found (with `stop_file`: the search ends with
    # that shrink, so the budget's end is no reason to go on).
    shrink_s: float = float("inf")
    # Seconds the fault schedule is also run shifted by: a failure must show at each (see the module doc).
    shifts: tuple[float, ...] = DEFAULT_SHIFTS_S
    # "sim" (simulated time, at the case's preset) or "real" (real time at scaled settings; `router` any
    # `--router` spec of `pdchaos run`).
    world: str = "sim"
    # Finding keys to pass by while searching (`--skip-known`): a case whose every failure is one of them
    # counts as no failure, so the budget goes to new ones.
    skip: frozenset[str] = frozenset()


@dataclass
class Found:
    signature: Signature
    original: SearchCase
    shrunk: SearchCase
    outcome: RunOutcome
    found_after_s: float
    found_at_run: int
    shrink_runs: int
    # Real time: the reference router's run of the shrunk case (it passed).
    reference: RunOutcome | None = None


@dataclass
class SeedResult:
    seed: int
    runs: int = 0
    unsound_runs: int = 0
    # Failures gone with the schedule shifted (set aside) and the runs their checks took.
    fragile: int = 0
    shift_runs: int = 0
    wall_s: float = 0.0
    found: Found | None = None
    stopped: str = "exhausted"
    real: RealCounts = field(default_factory=RealCounts)
    # Cases that failed only in ways `SeedJob.skip` names (passed by while searching).
    known_passed: int = 0


def robust_signatures(case: SearchCase, wanted: list[Signature], job: SeedJob,
                      res: SeedResult) -> list[Signature]:
    """Those of `wanted` the case also fails with at each of the job's shifts (stops at the first shift that
    leaves none)."""
    kept = list(wanted)
    for by_s in job.shifts:
        if not kept:
            break
        outcome = run_case(shifted(case, by_s), job.bugs, job.work_dir, job.router)
        res.shift_runs += 1
        kept = [s for s in kept if outcome.sound and s in outcome.signatures]
    return kept


# (the signature it fails with, its run, the reference router's run in real time)
Hit = tuple[Signature, RunOutcome, RunOutcome | None]


def _sim_hit(case: SearchCase, target: Signature | None, job: SeedJob, res: SeedResult) -> Hit | None:
    """Run the case in simulated time: a failure with the target (any, while searching) that also shows at
    each shift."""
    outcome = run_case(case, job.bugs, job.work_dir, job.router)
    res.runs += 1
    if not outcome.sound:
        res.unsound_runs += 1
        return None
    if target is None:
        wanted = unknown_signatures(outcome.signatures, job.skip, outcome.absorbed)
        if outcome.signatures and not wanted:
            res.known_passed += 1
    else:
        wanted = [target] if target in outcome.signatures else []
    robust = robust_signatures(case, list(wanted), job, res)
    if wanted and not robust:
        res.fragile += 1
        return None
    return (robust[0], outcome, None) if robust else None


def _real_hit(case: SearchCase, target: Signature | None, judge: RealJudge, res: SeedResult) -> Hit | None:
    """Run the case in real time (once per case: a case decided before is not run again) and confirm a
    failure (`RealJudge`)."""
    if not judge.decided(case):
        outcome = judge.run(case)
        res.runs += 1
        if not outcome.sound:
            res.unsound_runs += 1
        judge.judge(case, outcome, target)
    found = judge.verdict_of(case, target)
    if found is None:
        return None
    # The replay's run: its folder is kept (`RealJudge`), the first run's is the next case's.
    return (target or found.signature, found.replay, found.reference)


def simplest_case(space: Space) -> SearchCase:
    """The case Hypothesis draws first from `space` (its simplest)."""
    quiet = settings(database=None, phases=[Phase.generate, Phase.shrink], verbosity=Verbosity.quiet,
                     suppress_health_check=list(HealthCheck), deadline=None)
    return find(search_cases(space), lambda _: True, settings=quiet)


def search_seed(job: SeedJob) -> SeedResult:
    """Search one seed (runs in a pool worker; the clock here is the budget's, nothing a run sees)."""
    started = time.time()
    res = SeedResult(job.seed)
    state: dict[str, Signature] = {}
    shrink_until = [job.shrink_until]
    job.work_dir.mkdir(parents=True, exist_ok=True)
    # Hypothesis draws the simplest case first whatever the seed: it is seed 0's, and every other seed goes
    # straight to cases of its own (else short seeds all ran that one case, and with a bug that it trips, all
    # found and shrank the same failure).
    simplest = None if job.seed == 0 else simplest_case(job.space)
    judge = RealJudge(job.bugs, job.router, job.work_dir, res.real, job.skip) if job.world == "real" else None

    @settings(
        database=None, max_examples=job.max_examples, deadline=None, phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck), report_multiple_bugs=False, verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @hypothesis_seed(job.seed)
    @given(search_cases(job.space))
    def probe(case: SearchCase) -> None:
        target = state.get("target")
        if target is None and case == simplest:
            reject()
        if judge is not None and not judge.decided(case) and real_problem(case, job.bugs, judge.adapter):
            res.real.redrawn += 1
            reject()
        now = time.time()
        if (target is None and now > job.search_until) or (target is not None and now > shrink_until[0]):
            raise _Stop
        if target is None and job.stop_file is not None and job.stop_file.exists():
            raise _Stop
        if job.halt_file is not None and job.halt_file.exists():
            raise _Halt
        hit = (_real_hit(case, target, judge, res) if judge is not None
               else _sim_hit(case, target, job, res))
        if hit is None:
            return
        sig, outcome, reference = hit
        if target is None:
            target = sig
            state["target"] = target
            if job.stop_file is not None:
                job.stop_file.touch()
                shrink_until[0] = min(job.shrink_until, time.time() + job.shrink_s)
            res.found = Found(target, case, case, outcome, time.time() - started, res.runs, 0, reference)
        else:
            assert res.found is not None
            res.found.shrunk, res.found.outcome, res.found.reference = case, outcome, reference
        # One raise site: Hypothesis tells failures apart by where they are raised.
        raise _Failed(str(target))

    try:
        probe()
        res.stopped = "exhausted"
    except _Failed:
        res.stopped = "shrunk"
    except _Stop:
        res.stopped = "budget"
    except (_Halt, KeyboardInterrupt):  # Ctrl-C: here (one process), or the driver's halt file (a pool)
        res.stopped = INTERRUPTED
    except Exception as e:  # Hypothesis' own end (e.g. Flaky when a replay differs): what we recorded stands
        res.stopped = f"hypothesis: {type(e).__name__}"
    if res.found is not None:
        res.found.shrink_runs = res.runs - res.found.found_at_run
    res.wall_s = time.time() - started
    return res
