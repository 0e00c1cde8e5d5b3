"""`pdchaos incident replay`: build the scenario, run it against the release and the reference router in
real time (scaled settings) and in simulation (the incident's own settings; the release by its gateway
profile, when it has one), judge each world, and write the run folders, `incident.md` and `incident.json`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.incident.judge import WorldJudgement, judge_world, overall
from harness.incident.plan import Plan
from harness.parallel import repeat_dir_name
from harness.races import fold_runs
from harness.routers.profiles import PROFILES
from harness.runner import Cell, cell_dir_name, run_scenario
from harness.scenario import Scenario

REFERENCE = "reference"
WORLD_SETTINGS = {"real": "real time, scaled settings", "sim": "simulation, the incident's own settings"}


def profile_for(release: str, transport: str) -> str | None:
    """The gateway profile that models `release` over `transport` (`profile:NAME`), if any."""
    for p in PROFILES.values():
        if p.release == release and transport in p.transports:
            return f"profile:{p.name}"
    return None


@dataclass
class RunRecord:
    world: str
    router: str
    folder: str
    status: str
    reason: str
    checkers: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, list[str]] = field(default_factory=dict)


async def _run(
    scenario: Scenario, plan: Plan, router: str, world: str, out: Path, seed: int, repeat: int = 1
) -> RunRecord:
    """One router in one world; in real time `repeat` runs of it, folded as `pdchaos run --repeat` folds them
    (a checker that fails in some runs and passes in others is a race)."""
    from reports import write_reports

    settings = "scaled" if world == "real" else "production"
    cell = Cell(plan.topology, plan.connector, plan.transport)
    runs = repeat if world == "real" else 1  # the simulation replays exactly: once is all of it
    results = [
        await run_scenario(
            scenario,
            plan.topology,
            plan.connector,
            plan.transport,
            router,
            out / repeat_dir_name(cell_dir_name(scenario.name, cell), i, runs),
            seed=seed,
            world=world,
            settings=settings,
        )
        for i in range(1, runs + 1)
    ]
    res = fold_runs(results)
    write_reports([res], out)
    checks = {v.name: v.status for v in res.verdicts}
    evidence = {v.name: [str(e) for e in list(v.evidence)[:3]] for v in res.verdicts if v.status != "pass"}
    return RunRecord(world, router, str(out), res.status, res.reason, checks, evidence)


def replay(
    scenario: Scenario,
    plan: Plan,
    release: str,
    out: Path,
    seed: int = 0,
    real: bool = True,
    sim: bool = True,
    say: Callable[[str], None] = print,
    repeat: int = 1,
) -> dict[str, Any]:
    """Every run, the judgement per world and overall (also written to out/incident.json)."""
    symptoms = [s.checker for s in plan.symptoms]
    runs: list[RunRecord] = []
    judged: dict[str, WorldJudgement | None] = {"real": None, "sim": None}
    skipped: list[str] = []
    for world in ("real", "sim"):
        if not (real if world == "real" else sim):
            skipped.append(f"{world}: not asked for")
            continue
        target = release if world == "real" else profile_for(release, plan.transport)
        if target is None:
            skipped.append(f"sim: no gateway profile models {release} over {plan.transport}")
            continue
        pair = []
        for router in (target, REFERENCE):
            folder = out / world / ("reference" if router == REFERENCE else "release")
            say(f"incident: {world}: running {router} ...")
            rec = asyncio.run(_run(scenario, plan, router, world, folder, seed, repeat))
            not_passed = [c for c in symptoms if rec.checkers.get(c) != "pass"]
            say(f"incident: {world}: {router}: {rec.status}"
                + (f" ({', '.join(not_passed)} not passed)" if not_passed else ""))
            runs.append(rec)
            pair.append(rec)
        judged[world] = judge_world(world, symptoms, pair[0].checkers, pair[1].checkers)
    outcome, why = overall(judged["real"], judged["sim"])
    result = {
        "outcome": outcome,
        "why": why,
        "release": release,
        "symptoms": [asdict(s) for s in plan.symptoms],
        "worlds": {w: asdict(j) for w, j in judged.items() if j is not None},
        "skipped": skipped,
        "runs": [asdict(r) for r in runs],
    }
    (out / "incident.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def incident_md(
    result: dict[str, Any], plan: Plan, scenario_path: Path, bundle: str, bisect_line: str | None = None
) -> str:
    """A summary to paste into a bug report."""
    lines = [
        f"# Incident replay: {result['outcome']}",
        "",
        f"- Bundle: `{bundle}`",
        f"- Gateway: `{result['release']}`; topology {plan.topology}, {plan.connector}, {plan.transport}",
        f"- Scenario: `{scenario_path}`",
        f"- Outcome: **{result['outcome']}**: {result['why']}",
        *([f"- First release without the symptom: {bisect_line}"] if bisect_line else []),
        "",
        "## What the logs showed",
        "",
        *[f"- `{s.checker}`: {s.why} (`{s.cite}`)" for s in plan.symptoms],
        "",
        "## The faults replayed (incident time)",
        "",
        *[
            f"- {f.at_s - plan.load_start:.2f} s: {f.action} {f.target} {f.params or ''} (`{f.cite}`)"
            for f in plan.faults
        ],
        "",
        "## Side by side",
        "",
    ]
    for world, j in result["worlds"].items():
        lines += [
            f"### {world} ({WORLD_SETTINGS[world]})",
            "",
            "| checker | release | reference |",
            "|---|---|---|",
        ]
        lines += [f"| `{c}` | {rel} | {ref} |" for c, (rel, ref) in j["checkers"].items()]
        lines += [""]
        for r in result["runs"]:
            if r["world"] != world:
                continue
            for checker, ev in r["evidence"].items():
                if checker in j["checkers"]:
                    lines += [f"- {r['router']} `{checker}`: " + "; ".join(ev)[:400]]
        lines += [""]
    if result["skipped"]:
        lines += ["Not run: " + "; ".join(result["skipped"]), ""]
    if plan.defaults:
        lines += ["## Named defaults (the bundle did not say)", "", *[f"- {d}" for d in plan.defaults], ""]
    return "\n".join(lines)
