"""Repeated runs of one cell folded into one result (`pdchaos run --repeat N`): per checker pass, fail, or
race when both outcomes were seen; a cell fails when some checker failed in every run and races when one
split.

A race is a real race in the router (whether a short blip opens a breaker before a probe sees it) or in the
harness's own scenario; either way it is named, with the runs behind each side, instead of a red CI at
random. Unknown is kept apart: a run that could not tell is not a run that passed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from harness.result import ScenarioResult
from harness.verdict import Verdict

EVIDENCE_PER_SIDE = 5
EXIT_BY_STATUS = {"pass": 0, "fail": 1, "unknown": 2}


def exit_code(status: str, fail_on: str = "race") -> int:
    """0 pass, 1 fail, 2 unknown; a race is 1 unless only a fail is red (`--fail-on fail`)."""
    if status == "race":
        return EXIT_BY_STATUS["fail" if fail_on == "race" else "pass"]
    return EXIT_BY_STATUS.get(status, EXIT_BY_STATUS["unknown"])


def fold_verdicts(name: str, runs: Sequence[Verdict | None]) -> Verdict:
    """One checker over `runs` (None: the checker gave no verdict in that run, which counts as unknown)."""
    n = len(runs)
    statuses = [v.status if v is not None else "unknown" for v in runs]
    fails = [(i, v) for i, v in enumerate(runs, 1) if v is not None and v.status == "fail"]
    passes = [(i, v) for i, v in enumerate(runs, 1) if v is not None and v.status == "pass"]
    numbers: dict[str, Any] = {"runs": statuses}
    if fails:
        first = fails[0][1]
        numbers.update(first.numbers)
        if len(fails) == n:
            return Verdict.fail(name, f"{first.reason} (in all {n} runs)", numbers, first.evidence)
        if not passes:
            return Verdict.fail(name, f"{first.reason} (in {len(fails)} of {n} runs; the others could not "
                                "tell)", numbers, first.evidence)
        evidence: list[Any] = [f"run {i} failed: {line}" for i, v in fails for line in
                               (v.evidence or [v.reason])[:EVIDENCE_PER_SIDE]]
        evidence += [f"run {i} passed: {v.reason or 'pass'}" for i, v in passes]
        which = ", ".join(str(i) for i, _ in fails)
        return Verdict(name, "race", f"{first.reason} (failed in {len(fails)} of {n} runs: run {which})",
                       numbers, evidence)
    unknown = [(i, v) for i, v in enumerate(runs, 1) if v is None or v.status == "unknown"]
    if unknown:
        i, v = unknown[0]
        why = v.reason if v is not None else "no verdict"
        return Verdict.unknown_(name, f"{why} (run {i}; unknown in {len(unknown)} of {n} runs)", numbers,
                                v.evidence if v is not None else [])
    return Verdict.ok(name, passes[0][1].reason, {**passes[0][1].numbers, "runs": statuses})


def fold_runs(runs: Sequence[ScenarioResult]) -> ScenarioResult:
    """The runs of one cell (same scenario and cell, in run order) as one result: its verdicts folded, its
    files those of the first run, and `runs` saying how each went and where its folder is."""
    if len(runs) == 1:
        return runs[0]
    names = list(dict.fromkeys(v.name for r in runs for v in r.verdicts))
    by_run = [{v.name: v for v in r.verdicts} for r in runs]
    verdicts = [fold_verdicts(name, [vs.get(name) for vs in by_run]) for name in names]
    first = runs[0]
    durations = [r.duration_s for r in runs if r.duration_s is not None]
    return dataclasses.replace(
        first, verdict=None, verdicts=verdicts, status=None, reason="",
        duration_s=sum(durations) if durations else None, ended_at=runs[-1].ended_at,
        runs=[{"status": r.status, "reason": r.overall.reason if r.status != "pass" else "",
               "cell_dir": r.folder()} for r in runs],
    )


def fold_repeats(results: Sequence[ScenarioResult], repeat: int) -> list[ScenarioResult]:
    """`results` of `repeat` runs per cell, each cell's runs next to each other (as `run_suite` returns
    them with `repeat`), folded cell by cell. A cell cut short has fewer runs: those are folded."""
    return list(results) if repeat <= 1 else fold_adjacent(results)


def fold_adjacent(results: Sequence[ScenarioResult]) -> list[ScenarioResult]:
    """Each run of results of the same cell (scenario and cell) next to each other folded into one."""
    out: list[ScenarioResult] = []
    group: list[ScenarioResult] = []
    for r in results:
        if group and r.key != group[0].key:
            out.append(fold_runs(group))
            group = []
        group.append(r)
    if group:
        out.append(fold_runs(group))
    return out
