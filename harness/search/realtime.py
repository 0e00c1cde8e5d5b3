"""Searching a router in real time: which cases the real world can carry out for it, and when a failure
counts.

A case runs as `pdchaos run --world real --settings scaled` runs a scenario: processes on loopback, the
router under test started by its adapter (the reference router, a `cmd:` template, a gateway release). A
case the real world cannot carry out for this router (a fault its proxy cannot follow, a worker API call a
gateway has no endpoint for, a transport it does not serve) is redrawn, never run (`real_problem`).

A failure counts only when
- the same case fails with the same signature twice on the router under test (the failing run and one
  replay): real time does not keep a schedule's phase against the probes, so a failure that needs one phase
  shows once and not again; this replaces the simulated search's shifted schedules;
- and the reference router passes the case in real time (one run, router switches off, engine switches
  kept: they are the engines, not the router). A case it fails too is no router bug: a scenario a correct
  router cannot pass here, or a machine too loaded to carry it out.
Anything else is set aside and counted. Each case is judged once per seed (`RealJudge` keeps the decision):
Hypothesis asks again for the case it shrank to, and a second real run could disagree.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.findings.group import unknown_signatures
from harness.routers import RouterAdapter, make_router_adapter
from harness.routers.gateways.adapters import GatewayAdapter
from harness.search.case import SearchCase
from harness.search.execute import RunOutcome, run_case, scenario_of
from harness.search.faults import API_KINDS
from harness.search.signature import Signature
from harness.search.strategies import Space

# A seed's folders under its work folder: the replay and the reference router's run of the case being
# confirmed, and those two runs of each confirmed case, numbered (`confirmed-N`, `confirmed-N-reference`):
# the case recorded last is Hypothesis' smallest, not always the last one confirmed, and its bug report
# points to its own runs.
REPLAY_DIR = "replay"
REFERENCE_DIR = "reference"
KEPT_DIR = "confirmed-{n}"
KEPT_REFERENCE_DIR = "confirmed-{n}-reference"
# Why a candidate failure was set aside.
ONCE = "failed once only"
REFERENCE = "the reference router also fails"
REFERENCE_ROUTER = "reference"


@functools.cache
def router_adapter(router: str) -> RouterAdapter:
    """One adapter per router spec and process (a gateway's release is resolved once)."""
    return make_router_adapter(router)


def engine_switches(bugs: tuple[str, ...]) -> tuple[str, ...]:
    """The engine-side switches among `bugs`: the reference router runs against the same engines."""
    from harness.scenario.bugs import split_bugs

    return split_bugs(bugs)[1]


def real_problem(case: SearchCase, bugs: tuple[str, ...], adapter: RouterAdapter) -> str | None:
    """Why the real world cannot run this case against this router (None: it can)."""
    from harness.matrix import skip_reason
    from harness.runner import Cell

    scenario = scenario_of(case, bugs)
    if "real" not in scenario.worlds:
        return scenario.world_notes.get("real", "simulation only")
    return skip_reason(adapter, scenario, Cell(case.topology, case.connector, case.transport))


def real_space(space: Space, adapter: RouterAdapter) -> Space:
    """The space narrowed to what the router can run at all, so that few draws are redrawn: a gateway's
    transports, no worker API call where it has no worker ids, and its probe times in whole seconds."""
    if not isinstance(adapter, GatewayAdapter):
        return space
    transports = tuple(t for t in space.transports if t in adapter.transports)
    kinds = space.kinds if adapter.has_worker_ids else tuple(k for k in space.kinds if k not in API_KINDS)
    return Space(**{**vars(space), "transports": transports or space.transports, "kinds": kinds,
                    "whole_second_probes": True})


@dataclass(frozen=True)
class Confirmed:
    """A failure that counts: `outcome` failed with `signature`, `replay` again, `reference` passed."""

    signature: Signature
    signatures: tuple[Signature, ...]
    outcome: RunOutcome
    replay: RunOutcome
    reference: RunOutcome


@dataclass(frozen=True)
class SetAside:
    signature: str
    why: str
    detail: str
    size: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"signature": self.signature, "why": self.why, "detail": self.detail, "size": self.size}


@dataclass
class RealCounts:
    """Runs and decisions of one seed in real time."""

    replay_runs: int = 0
    reference_runs: int = 0
    # Candidate failures found while searching (not while shrinking) that did not count.
    set_aside: list[SetAside] = field(default_factory=list)
    # Cases drawn that the real world cannot carry out for this router (redrawn).
    redrawn: int = 0
    # Cases whose every failure was a known one (`RealJudge.skip`): passed by without a replay.
    known_passed: int = 0


def _replay_detail(replay: RunOutcome) -> str:
    if replay.passed:
        return "its replay passed"
    return "its replay failed otherwise" if replay.sound else "its replay could not be judged"


def _reference_detail(ref: RunOutcome) -> str:
    if not ref.sound:
        return "its run could not be judged (a fault not carried out, or the run broke)"
    failed = [f"{c}: {r}" for c, s, r in ref.verdicts if s == "fail"]
    return "it failed " + "; ".join(failed[:3])


class RealJudge:
    """Runs and judges the cases of one seed in real time (see the module doc)."""

    def __init__(self, bugs: tuple[str, ...], router: str, work_dir: Path, counts: RealCounts,
                 skip: frozenset[str] = frozenset()) -> None:
        self.bugs = bugs
        self.router = router
        self.work_dir = work_dir
        self.counts = counts
        # Finding keys passed by while searching (known failures; see `SeedJob.skip`).
        self.skip = skip
        self._decided: dict[str, Confirmed | None] = {}

    @property
    def adapter(self) -> RouterAdapter:
        return router_adapter(self.router)

    def run(self, case: SearchCase, folder: str = "") -> RunOutcome:
        return run_case(case, self.bugs, self.work_dir / folder, self.router, world="real")

    def decided(self, case: SearchCase) -> bool:
        return repr(case) in self._decided

    def judge(self, case: SearchCase, outcome: RunOutcome, target: Signature | None) -> Confirmed | None:
        """Whether `case`, whose first run gave `outcome`, fails in a way that counts: with `target` (while
        shrinking), else with any signature. Decided once per case (the replay and the reference run)."""
        key = repr(case)
        if key not in self._decided:
            self._decided[key] = self._confirm(case, outcome, target)
        return self.verdict_of(case, target)

    def verdict_of(self, case: SearchCase, target: Signature | None) -> Confirmed | None:
        """The decision made for `case` (None: none yet, or not a failure that counts with `target`)."""
        found = self._decided.get(repr(case))
        if found is None or (target is not None and target not in found.signatures):
            return None
        return found

    def _confirm(self, case: SearchCase, outcome: RunOutcome, target: Signature | None) -> Confirmed | None:
        wanted = ([target] if target is not None
                  else unknown_signatures(outcome.signatures, self.skip, outcome.absorbed))
        if not outcome.sound or not any(s in outcome.signatures for s in wanted):
            if outcome.sound and target is None and outcome.signatures:
                self.counts.known_passed += 1
            return None
        replay = self.run(case, REPLAY_DIR)
        self.counts.replay_runs += 1
        again = replay.signatures if replay.sound else ()
        twice = tuple(s for s in wanted if s in outcome.signatures and s in again)
        if not twice:
            self._set_aside(case, wanted[0], ONCE, _replay_detail(replay), target)
            return None
        reference = run_case(case, engine_switches(self.bugs), self.work_dir / REFERENCE_DIR,
                             REFERENCE_ROUTER, world="real")
        self.counts.reference_runs += 1
        if not reference.passed:
            self._set_aside(case, twice[0], REFERENCE, _reference_detail(reference), target)
            return None
        n = sum(1 for c in self._decided.values() if c is not None)
        return Confirmed(twice[0], twice, outcome, self._keep(replay, REPLAY_DIR, KEPT_DIR.format(n=n)),
                         self._keep(reference, REFERENCE_DIR, KEPT_REFERENCE_DIR.format(n=n)))

    def _keep(self, outcome: RunOutcome, folder: str, kept: str) -> RunOutcome:
        """The run's folder moved where later runs of the seed leave it alone."""
        src, dst = self.work_dir / folder, self.work_dir / kept
        shutil.rmtree(dst, ignore_errors=True)
        src.rename(dst)
        if outcome.facts is None:
            return outcome
        return replace(outcome, facts=replace(outcome.facts, run_dir=str(dst)))

    def _set_aside(self, case: SearchCase, sig: Signature, why: str, detail: str,
                   target: Signature | None) -> None:
        # Only candidates met while searching are counted: one met while shrinking is a smaller case that
        # does not fail the same way reliably, and shrinking goes on from the last one that did.
        if target is None:
            self.counts.set_aside.append(SetAside(sig.text, why, detail, case.size()))
