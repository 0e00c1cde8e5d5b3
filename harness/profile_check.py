"""Does each gateway profile behave like its real release? (`python -m harness.profile_check`)

For every profile (`harness.routers.profiles`) and every cell of the scenarios that tell releases apart
(below, each at its default-suite cut, on the transports the release does PD on), the cell runs in real time
at scaled settings with the reference router (once), with the real release (installed in its own cached venv
on first use: needs PyPI) and with the profile. A real-time run of a gateway is not always the same: each of
the last two sides runs up to `--repeat` times (default 3) and each checker's verdict is the majority (a side
stops as soon as no further run can change a majority: two runs that agree settle it). A checker is
compared where both the release and the profile have a verdict (pass or fail; a release without router
events gives `unknown` on some checkers, and a split with no majority is `unsettled`: nothing to compare).
The table (`tests/data/profiles.json`) holds, per cell, the verdicts per checker (with each run's, when
repeated), whether the release differs from the reference there, and whether the profile agrees with the
release. `--only SCENARIO` reruns some cells and keeps the others of an unchanged profile.
`tests/integration/gateways/test_profiles_external.py` checks the table (always) and re-runs it with the real
releases (PDCHAOS_EXTERNAL=1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.routers.profiles import PREFIX, PROFILES, GatewayProfile
from harness.scenario import Scenario, load_scenarios

TABLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "profiles.json"
COMPARED = ("pass", "fail")
# A checker whose runs gave no majority verdict: nothing to compare.
UNSETTLED = "unsettled"
# The reference router's verdicts per cell, run once for every profile that shares the cell.
_REFERENCE: dict[str, dict[str, str]] = {}


# Where a profile does not match its release yet, with what the runs showed (behaviour no switch describes
# yet). `tests/integration/gateways/test_profiles_external.py` holds the stored table to exactly these, so a
# new disagreement fails it, and so does one that went away (drop its line). Races are not listed here: a
# checker whose runs split is compared by the outcomes both sides were seen giving (`compare`). Empty since
# the table of 2026-12-02: the races that were listed (a crashed prefill's refused legs reaching smg's breaker
# before its probes, or not; a reset NIXL read rerun whole or not) showed both outcomes once their runs were
# accumulated (`--accumulate`).
EXPLAINED: dict[str, str] = {}

# Scenarios on which releases are known to differ from the reference (docs/real-gateways.md, the release
# matrix), plus the ones that guard the profiles' switches.
SCENARIOS = (
    "sole_prefill_down", "prefill_restart_mooncake", "prefill_restart_between_probes",
    "side_channel_reset_during_pull", "one_of_two_prefills_down", "prefill_link_partitioned",
    "wedged_decode_generate", "hung_decode_ejected", "property_update_keeps_handoff", "prefill_link_blip",
    "decode_crash", "decode_restart",
)


@dataclass(frozen=True)
class Cell:
    scenario: str
    topology: str
    connector: str
    transport: str

    @property
    def key(self) -> str:
        return f"{self.scenario}[{self.topology}/{self.connector}/{self.transport}]"


def cells_for(profile: GatewayProfile, scenarios: dict[str, Scenario]) -> list[Cell]:
    """Each scenario's first topology and first connector (of its default-suite cut: Mooncake where the
    scenario runs it, the connector whose engine id the releases mishandle), on the release's transports."""
    out = []
    for name in SCENARIOS:
        s = scenarios.get(name)
        if s is None:
            continue
        first = (s.topologies[0], s.connectors[0])
        out += [Cell(name, t, c, tr) for t, c, tr in s.matrix()
                if (t, c) == first and tr in profile.transports]
    return out


def seen_verdicts(verdict: str | None, runs: Sequence[str] | None) -> set[str]:
    """The compared verdicts (pass, fail) a side was seen giving: its runs', else its one verdict's."""
    return set(runs if runs else [verdict]) & set(COMPARED)


def compare(release: dict[str, str], profile: dict[str, str], reference: dict[str, str],
            release_runs: dict[str, list[str]] | None = None,
            profile_runs: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Per checker: whether the release differs from the reference, and whether the profile agrees with the
    release (None: nothing to compare). A checker whose runs split on either side (pass in some, fail in
    others) is a race: there the profile agrees when it was seen giving a verdict the release gave, since
    either outcome is the release's behaviour; elsewhere the two majorities must be equal."""
    checkers: dict[str, Any] = {}
    for name in sorted(set(release) | set(profile) | set(reference)):
        r, p, ref = release.get(name), profile.get(name), reference.get(name)
        rr, pr = (release_runs or {}).get(name), (profile_runs or {}).get(name)
        seen_r, seen_p = seen_verdicts(r, rr), seen_verdicts(p, pr)
        race = len(seen_r) > 1 or len(seen_p) > 1
        if race:
            agrees: bool | None = bool(seen_r & seen_p) if seen_r and seen_p else None
        else:
            agrees = (r == p) if r in COMPARED and p in COMPARED else None
        checkers[name] = {
            "reference": ref, "release": r, "profile": p,
            "release_differs": r in COMPARED and ref in COMPARED and r != ref,
            "race": race, "agrees": agrees,
        }
        if rr:
            checkers[name]["release_runs"] = list(rr)
        if pr:
            checkers[name]["profile_runs"] = list(pr)
    return checkers


def judged_row(reference: dict[str, str], release_runs: Sequence[dict[str, str]],
               profile_runs: Sequence[dict[str, str]], repeat: int | None = None) -> dict[str, Any]:
    """A cell's row of the table from each side's runs (`repeat`: the runs each side was allowed, for
    the majority; accumulated runs may be more, and then count whole)."""
    release = majority(release_runs, max(repeat or 0, len(release_runs))) if release_runs else {}
    mine = majority(profile_runs, max(repeat or 0, len(profile_runs))) if profile_runs else {}
    checkers = compare(release, mine, reference, _run_lists(release_runs), _run_lists(profile_runs))
    return {
        "checkers": checkers,
        "release_differs": any(c["release_differs"] for c in checkers.values()),
        "agrees": all(c["agrees"] is not False for c in checkers.values()),
    }


def stored_runs(row: dict[str, Any], side: str) -> list[dict[str, str]]:
    """A stored row's runs of one side (`release` or `profile`), one verdict dict per run."""
    lists = {name: c.get(f"{side}_runs") or [] for name, c in row["checkers"].items()}
    count = max((len(v) for v in lists.values()), default=0)
    return [{name: v[i] for name, v in lists.items() if i < len(v)} for i in range(count)]


def stored_reference(row: dict[str, Any]) -> dict[str, str]:
    return {name: c["reference"] for name, c in row["checkers"].items() if c.get("reference") is not None}


async def _verdicts(s: Scenario, cell: Cell, router: str, out: Path) -> dict[str, str]:
    """Each checker's status; empty when this router cannot run the cell at all."""
    from harness.matrix import skip_reason
    from harness.routers import make_router_adapter
    from harness.runner import Cell as RunCell
    from harness.runner import run_scenario

    adapter = make_router_adapter(router)
    if skip_reason(adapter, s, RunCell(cell.topology, cell.connector, cell.transport)) is not None:
        return {}
    res = await run_scenario(s, cell.topology, cell.connector, cell.transport, adapter, out, world="real",
                             settings="scaled")
    return {v.name: v.status for v in res.verdicts}


def majority(runs: Sequence[dict[str, str]], repeat: int) -> dict[str, str]:
    """Per checker, the verdict more than half of `repeat` runs gave (fewer runs may have been made: the
    rest could not change it), else the one more than half of the runs made gave, else UNSETTLED."""
    out: dict[str, str] = {}
    for name in sorted({n for r in runs for n in r}):
        votes = [r.get(name, "unknown") for r in runs]
        best = max(sorted(set(votes)), key=votes.count)
        share = votes.count(best)
        out[name] = best if share * 2 > repeat or share * 2 > len(votes) else UNSETTLED
    return out


def settled(runs: Sequence[dict[str, str]], repeat: int) -> bool:
    """No further run (of `repeat`) can change any checker's majority."""
    return all(max(votes.count(v) for v in set(votes)) * 2 > repeat
               for votes in ([r.get(n, "unknown") for r in runs] for n in {n for r in runs for n in r}))


async def repeated_verdicts(s: Scenario, cell: Cell, router: str, out: Path,
                            repeat: int) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Up to `repeat` runs of the cell, stopping once every checker's majority is settled: the majority
    verdicts, and each run's."""
    runs: list[dict[str, str]] = []
    for i in range(max(1, repeat)):
        got = await _verdicts(s, cell, router, out if repeat == 1 else out / f"run{i + 1}")
        if not got:  # this router cannot run the cell
            return {}, []
        runs.append(got)
        if settled(runs, repeat):
            break
    return majority(runs, repeat), runs


def _run_lists(runs: Sequence[dict[str, str]]) -> dict[str, list[str]]:
    return {n: [r.get(n, "unknown") for r in runs] for n in sorted({n for r in runs for n in r})}


async def check_profile(profile: GatewayProfile, out: Path, only: Sequence[str] = (),
                        repeat: int = 1) -> dict[str, Any]:
    """Compare the profile with its release on each of its cells (`only`: these scenarios'), each side's
    verdicts the majority of up to `repeat` runs (the reference router runs once)."""
    scenarios = {s.name: s.suite_cut() for s in load_scenarios()}
    rows: dict[str, Any] = {}
    for cell in cells_for(profile, scenarios):
        if only and cell.scenario not in only:
            continue
        s = scenarios[cell.scenario]
        base = out / profile.name / cell.key.replace("[", "-").replace("]", "").replace("/", "-")
        if cell.key not in _REFERENCE:
            _REFERENCE[cell.key] = await _verdicts(s, cell, "reference", base / "reference")
        reference = _REFERENCE[cell.key]
        _, release_runs = await repeated_verdicts(s, cell, profile.release, base / "release", repeat)
        _, mine_runs = await repeated_verdicts(s, cell, PREFIX + profile.name, base / "profile", repeat)
        rows[cell.key] = judged_row(reference, release_runs, mine_runs, repeat)
        differs = "differs" if rows[cell.key]["release_differs"] else "same"
        agrees = "agrees" if rows[cell.key]["agrees"] else "DISAGREES"
        print(f"{profile.name} {cell.key}: release {differs}, profile {agrees}", file=sys.stderr)
    return {"release": profile.release, "bugs": list(profile.bugs), "repeat": repeat, "cells": rows}


def merged(old: dict[str, Any] | None, new: dict[str, Any], accumulate: bool = False) -> dict[str, Any]:
    """A profile's table entry after a run: a partial run (`--only`) of the same switches keeps the cells it
    did not run; anything else replaces the entry. `accumulate`: a cell run again adds its runs to the
    stored ones (same release and switches), and is judged on all of them (evidence for a race builds up)."""
    if not old or sorted(old.get("bugs", [])) != sorted(new["bugs"]) or old.get("release") != new["release"]:
        return new
    cells = {**old.get("cells", {}), **new["cells"]}
    if accumulate:
        for key, row in new["cells"].items():
            before = old.get("cells", {}).get(key)
            if before is not None:
                cells[key] = judged_row(stored_reference(row),
                                        stored_runs(before, "release") + stored_runs(row, "release"),
                                        stored_runs(before, "profile") + stored_runs(row, "profile"))
    return {**new, "cells": cells}


def disagreements(table: dict[str, Any], explained: dict[str, str] | None = None) -> list[str]:
    """`PROFILE CELL CHECKER: release X, profile Y` for each checker where a profile and its release differ,
    leaving out those `explained` names (keys `PROFILE CELL CHECKER`)."""
    out = []
    for name, entry in table.items():
        for key, row in entry.get("cells", {}).items():
            for checker, c in row["checkers"].items():
                if c["agrees"] is False and f"{name} {key} {checker}" not in (explained or {}):
                    out.append(f"{name} {key} {checker}: release {c['release']}, profile {c['profile']}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.profile_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", action="append", choices=sorted(PROFILES), help="repeatable (default: all)")
    p.add_argument("--only", action="append", default=[], metavar="SCENARIO", help="repeatable")
    p.add_argument("--repeat", type=int, default=3, metavar="N",
                   help="runs per cell and side (release, profile), up to N: each checker's verdict is the "
                        "majority, and a side stops once no further run can change it (default 3)")
    p.add_argument("--table", type=Path, default=TABLE, help=f"where to merge the results (default {TABLE})")
    p.add_argument("--accumulate", action="store_true",
                   help="add the runs to the stored ones of the same cells (same release and switches) and "
                        "judge each cell on all of them, rather than replacing them: a race's both outcomes "
                        "show up over table runs")
    p.add_argument("--dry-run", action="store_true", help="list the cells and exit")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    chosen = [PROFILES[n] for n in (args.profile or sorted(PROFILES))]
    scenarios = {s.name: s.suite_cut() for s in load_scenarios()}
    if unknown := sorted(set(args.only) - set(scenarios)):
        p.error(f"--only: unknown scenario(s) {', '.join(unknown)}")
    if args.dry_run:
        for prof in chosen:
            for cell in cells_for(prof, scenarios):
                if not args.only or cell.scenario in args.only:
                    print(prof.name, cell.key)
        return 0
    table = json.loads(args.table.read_text(encoding="utf-8")) if args.table.exists() else {}
    with tempfile.TemporaryDirectory(prefix="pdchaos-profiles-") as tmp:
        for prof in chosen:
            got = asyncio.run(check_profile(prof, Path(tmp), args.only, args.repeat))
            table[prof.name] = merged(table.get(prof.name), got, args.accumulate)
            args.table.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    bad = disagreements(table, EXPLAINED)
    for line in bad:
        print("disagrees:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
