"""Run one search case and judge it: the same runner, session, world and checkers as `pdchaos run`, in
simulated time (the search's default) or in real time at scaled settings (`world="real"`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.findings.group import absorbed_by_lead
from harness.runner import run_scenario
from harness.scenario import Scenario
from harness.search.case import SearchCase, to_scenario
from harness.search.expect import expectations
from harness.search.facts import RunFacts, run_facts
from harness.search.signature import Signature, run_is_sound, signatures

# The only preset real time runs a case at: a case is written at scaled times.
REAL_SETTINGS = "scaled"


@dataclass(frozen=True)
class RunOutcome:
    signatures: tuple[Signature, ...]
    sound: bool
    # (checker, status, reason) of every verdict, for the found file's docstring and the summary.
    verdicts: tuple[tuple[str, str, str], ...]
    requests: int
    # A real-time run's numbers, evidence, router command line and client view (its bug report's material).
    facts: RunFacts | None = None
    # The failures as findings group them: (lead's key, the consequences' keys), `absorbed_by_lead`.
    absorbed: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def passed(self) -> bool:
        """A sound run no checker failed."""
        return self.sound and not self.signatures


def scenario_of(case: SearchCase, bugs: tuple[str, ...], name: str = "search_case") -> Scenario:
    return to_scenario(case, name, expectations(case), bugs)


def _requests(verdicts: list[Any]) -> int:
    for v in verdicts:
        if v.name == "nothing_lost":
            return int(v.numbers.get("requests", 0) or 0)
    return 0


def _complete(verdicts: list[Any]) -> bool:
    """The run ended normally with its history whole: in real time a run can break (a process that did not
    start in time, a damaged record), and a broken run says nothing of the router."""
    return any(v.name == "run_complete" and v.status == "pass" for v in verdicts)


def run_case(case: SearchCase, bugs: tuple[str, ...], out_dir: Path, router: str = "reference",
             world: str = "sim") -> RunOutcome:
    """Run the case's cell once: simulated time at its settings preset, or real time at scaled settings
    (processes on loopback), with its run seed."""
    scenario = scenario_of(case, bugs)
    settings = case.settings if world == "sim" else REAL_SETTINGS
    result = asyncio.run(run_scenario(
        scenario, case.topology, case.connector, case.transport, router, out_dir,
        seed=case.run_seed, world=world, settings=settings,
    ))
    verdicts = list(result.verdicts)
    sound = run_is_sound(verdicts) and bool(verdicts)
    facts = None
    if world == "real":
        sound = sound and _complete(verdicts)
        facts = run_facts(verdicts, result.history_path, out_dir)
    return RunOutcome(
        signatures=tuple(signatures(verdicts)),
        sound=sound,
        verdicts=tuple((v.name, v.status, v.reason) for v in verdicts),
        requests=_requests(verdicts),
        facts=facts,
        absorbed=absorbed_by_lead(verdicts),
    )
