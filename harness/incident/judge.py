"""Did a replay show the incident's symptom? Pure: the verdicts of the runs in, a judgement out.

In one world: reproduced when the release fails at least one of the symptom's checkers and the reference
router passes them all; not reproduced when the release passes them all; unknown when either run has no
verdict on them, or the reference fails one too (then the scenario, not the release, is at fault).
Overall: reproduced (in real time), reproduced only in simulation, not reproduced, or unknown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
SIM_ONLY = "reproduced only in simulation"
UNKNOWN = "unknown"
# `pdchaos incident replay` exits with these.
EXIT_BY_OUTCOME = {REPRODUCED: 0, SIM_ONLY: 0, NOT_REPRODUCED: 1, UNKNOWN: 2}


@dataclass(frozen=True)
class WorldJudgement:
    world: str
    outcome: str
    reason: str
    # checker -> (release status, reference status)
    checkers: Mapping[str, tuple[str, str]]


def judge_world(
    world: str, symptoms: Sequence[str], release: Mapping[str, str], reference: Mapping[str, str]
) -> WorldJudgement:
    """`release` / `reference`: checker -> status of that run (a checker missing: no verdict)."""
    table = {c: (release.get(c, "missing"), reference.get(c, "missing")) for c in symptoms}
    ref_bad = [c for c, (_, r) in table.items() if r != "pass"]
    if ref_bad:
        return WorldJudgement(
            world,
            UNKNOWN,
            f"the reference router does not pass {', '.join(ref_bad)} either: "
            "the replay, not the release, shows it",
            table,
        )
    failed = [c for c, (s, _) in table.items() if s in ("fail", "race")]
    if failed:
        return WorldJudgement(
            world, REPRODUCED, f"the release fails {', '.join(failed)}; the reference passes", table
        )
    unknown = [c for c, (s, _) in table.items() if s != "pass"]
    if unknown:
        return WorldJudgement(world, UNKNOWN, f"no verdict on {', '.join(unknown)} for the release", table)
    return WorldJudgement(world, NOT_REPRODUCED, "the release passes every symptom checker", table)


def overall(real: WorldJudgement | None, sim: WorldJudgement | None) -> tuple[str, str]:
    if real and real.outcome == REPRODUCED:
        return REPRODUCED, f"real time: {real.reason}"
    if sim and sim.outcome == REPRODUCED:
        why = f"real time: {real.reason}" if real else "real time not run"
        return SIM_ONLY, f"simulation: {sim.reason}; {why}"
    judged = [j for j in (real, sim) if j is not None]
    if judged and all(j.outcome == NOT_REPRODUCED for j in judged):
        return NOT_REPRODUCED, "; ".join(f"{j.world}: {j.reason}" for j in judged)
    return UNKNOWN, "; ".join(f"{j.world}: {j.reason}" for j in judged) or "nothing was run"
