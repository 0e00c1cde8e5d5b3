"""Run one search case in the simulated world and judge it: the same runner, session, world and checkers as
`pdchaos run --world sim`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.runner import run_scenario
from harness.scenario import Scenario
from harness.search.case import SearchCase, to_scenario
from harness.search.expect import expectations
from harness.search.signature import Signature, run_is_sound, signatures


@dataclass(frozen=True)
class RunOutcome:
    signatures: tuple[Signature, ...]
    sound: bool
    # (checker, status, reason) of every verdict, for the found file's docstring and the summary.
    verdicts: tuple[tuple[str, str, str], ...]
    requests: int


def scenario_of(case: SearchCase, bugs: tuple[str, ...], name: str = "search_case") -> Scenario:
    return to_scenario(case, name, expectations(case), bugs)


def _requests(verdicts: list[Any]) -> int:
    for v in verdicts:
        if v.name == "nothing_lost":
            return int(v.numbers.get("requests", 0) or 0)
    return 0


def run_case(case: SearchCase, bugs: tuple[str, ...], out_dir: Path, router: str = "reference") -> RunOutcome:
    """Run the case's cell once (simulated time, its settings preset, its run seed)."""
    scenario = scenario_of(case, bugs)
    result = asyncio.run(run_scenario(
        scenario, case.topology, case.connector, case.transport, router, out_dir,
        seed=case.run_seed, world="sim", settings=case.settings,
    ))
    verdicts = list(result.verdicts)
    return RunOutcome(
        signatures=tuple(signatures(verdicts)),
        sound=run_is_sound(verdicts) and bool(verdicts),
        verdicts=tuple((v.name, v.status, v.reason) for v in verdicts),
        requests=_requests(verdicts),
    )
