"""Does each gateway profile behave like its real release? (`python -m harness.profile_check`)

For every profile (`harness.routers.profiles`) and every cell of the scenarios that tell releases apart
(below, each at its default-suite cut, on the transports the release does PD on), the cell runs three times
in real time at scaled settings: with the reference router, with the real release (installed in its own
cached venv on first use: needs PyPI) and with the profile. A checker is compared where both the release and
the profile gave a verdict (pass or fail; a release without router events gives `unknown` on some checkers:
nothing to compare). The table (`tests/data/profiles.json`) holds, per cell, the three verdicts per checker,
whether the release differs from the reference there, and whether the profile agrees with the release.
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
# The reference router's verdicts per cell, run once for every profile that shares the cell.
_REFERENCE: dict[str, dict[str, str]] = {}

# Where a profile does not match its release yet, with what the runs showed: behaviour no switch describes
# (yet). `tests/integration/gateways/test_profiles_external.py` holds the stored table to exactly these, so a
# new disagreement fails it, and so does one that went away (drop its line).
EXPLAINED: dict[str, str] = {
    'smg-1.10.1 one_of_two_prefills_down[2p1d/mooncake/grpc] handoff':
        "the release's verdict varied between runs (fail, fail, fail, pass): one run per cell cannot "
        "settle it",
    'smg-1.10.1 one_of_two_prefills_down[2p1d/mooncake/grpc] legs_once':
        "the release's verdict varied between runs (fail, fail, pass): one run per cell cannot settle it",
    'smg-1.10.1 one_of_two_prefills_down[2p1d/mooncake/grpc] nothing_lost':
        "the release's verdict varied between runs (fail, fail, fail, pass): one run per cell cannot "
        "settle it",
    'smg-1.10.1 one_of_two_prefills_down[2p1d/mooncake/grpc] recovery':
        "the release's verdict varied between runs (pass, pass, pass, fail): one run per cell cannot "
        "settle it",
    'smg-1.10.1 one_of_two_prefills_down[2p1d/mooncake/grpc] transfer_timeout':
        "the release's verdict varied between runs (fail, fail, fail, pass): one run per cell cannot "
        "settle it",
    'smg-1.10.1 prefill_link_partitioned[2p1d/mooncake/grpc] recovery':
        "the release gave fail in all 4 runs, the profile pass: not modelled yet (the partitioned prefill "
        "is not back within 3 s of the heal ; its breaker or gRPC channel holds it out)",
    'smg-1.10.1 prefill_restart_mooncake[1p1d/mooncake/grpc] handoff':
        "the release's verdict varied between runs (pass, pass, pass, fail): one run per cell cannot "
        "settle it",
    'smg-1.10.1 side_channel_reset_during_pull[1p1d/nixl/grpc] legs_once':
        "the release gave pass in all 3 runs, the profile fail: not modelled yet (a NIXL read reset is not "
        "rerun by this release, unlike a Mooncake KV timeout)",
    'smg-1.11.0 prefill_link_partitioned[2p1d/mooncake/grpc] recovery':
        "the release gave fail in all 4 runs, the profile pass: not modelled yet (the partitioned prefill "
        "is not back within 3 s of the heal ; its breaker or gRPC channel holds it out)",
    'smg-1.11.0 prefill_restart_mooncake[1p1d/mooncake/grpc] legs_once':
        "the release's verdict varied between runs (fail, pass, fail): one run per cell cannot settle it",
    'smg-1.11.0 prefill_restart_mooncake[1p1d/mooncake/grpc] transfer_timeout':
        "the release's verdict varied between runs (pass, fail, pass, fail): one run per cell cannot "
        "settle it",
    'smg-1.11.0 side_channel_reset_during_pull[1p1d/nixl/grpc] legs_once':
        "the release's verdict varied between runs (fail, pass, fail): one run per cell cannot settle it",
    'smg-1.11.0 sole_prefill_down[1p1d/mooncake/grpc] recovery':
        "the release gave fail in all 4 runs, the profile pass: not modelled yet (the recovered sole "
        "prefill stays out longer than the profile's breaker keeps it)",
    'smg-1.12.0 one_of_two_prefills_down[2p1d/mooncake/grpc] recovery':
        "the release's verdict varied between runs (fail, pass, fail): one run per cell cannot settle it",
    'smg-1.12.0 prefill_link_partitioned[2p1d/mooncake/grpc] recovery':
        "the release gave fail in all 3 runs, the profile pass: not modelled yet (the partitioned prefill "
        "is not back within 3 s of the heal ; its breaker or gRPC channel holds it out)",
    'smg-1.12.0 prefill_restart_between_probes[1p1d/mooncake/grpc] nothing_lost':
        "the release gave fail in all 3 runs, the profile pass: not modelled yet (a restart no probe sees "
        "costs the release more than the profile's switches do)",
    'smg-1.13.0 prefill_link_partitioned[2p1d/mooncake/grpc] recovery':
        "the release gave fail in all 3 runs, the profile pass: not modelled yet (the partitioned prefill "
        "is not back within 3 s of the heal ; its breaker or gRPC channel holds it out)",
    'smg-1.13.0 prefill_restart_between_probes[1p1d/mooncake/grpc] availability':
        "the release gave fail in all 3 runs, the profile pass: not modelled yet (a restart no probe sees "
        "costs the release more than the profile's switches do)",
    'smg-1.13.0 prefill_restart_between_probes[1p1d/mooncake/grpc] handoff':
        "the release gave fail in all 3 runs, the profile pass: not modelled yet (a restart no probe sees "
        "costs the release more than the profile's switches do)",
    'vllm-router-0.1.17 sole_prefill_down[1p1d/mooncake/http] handoff':
        "the release gave fail in all 3 runs, the profile pass: not modelled yet (the recovered sole "
        "prefill stays out longer than the profile's breaker keeps it)",
}

# Scenarios on which releases are known to differ from the reference (README's release matrix), plus the
# ones that guard the profiles' switches.
SCENARIOS = (
    "sole_prefill_down", "prefill_restart_mooncake", "prefill_restart_between_probes",
    "side_channel_reset_during_pull", "one_of_two_prefills_down", "prefill_link_partitioned",
    "wedged_decode_generate", "hung_decode_ejected", "property_update_keeps_handoff",
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


def compare(release: dict[str, str], profile: dict[str, str], reference: dict[str, str]) -> dict[str, Any]:
    """Per checker: whether the release differs from the reference, and whether the profile agrees with the
    release (None: nothing to compare)."""
    checkers: dict[str, Any] = {}
    for name in sorted(set(release) | set(profile) | set(reference)):
        r, p, ref = release.get(name), profile.get(name), reference.get(name)
        comparable = r in COMPARED and p in COMPARED
        checkers[name] = {
            "reference": ref, "release": r, "profile": p,
            "release_differs": r in COMPARED and ref in COMPARED and r != ref,
            "agrees": (r == p) if comparable else None,
        }
    return checkers


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


async def check_profile(profile: GatewayProfile, out: Path, only: Sequence[str] = ()) -> dict[str, Any]:
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
        release = await _verdicts(s, cell, profile.release, base / "release")
        mine = await _verdicts(s, cell, PREFIX + profile.name, base / "profile")
        checkers = compare(release, mine, reference)
        rows[cell.key] = {
            "checkers": checkers,
            "release_differs": any(c["release_differs"] for c in checkers.values()),
            "agrees": all(c["agrees"] is not False for c in checkers.values()),
        }
        differs = "differs" if rows[cell.key]["release_differs"] else "same"
        agrees = "agrees" if rows[cell.key]["agrees"] else "DISAGREES"
        print(f"{profile.name} {cell.key}: release {differs}, profile {agrees}", file=sys.stderr)
    return {"release": profile.release, "bugs": list(profile.bugs), "cells": rows}


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
    p.add_argument("--table", type=Path, default=TABLE, help=f"where to merge the results (default {TABLE})")
    p.add_argument("--dry-run", action="store_true", help="list the cells and exit")
    args = p.parse_args(argv)
    chosen = [PROFILES[n] for n in (args.profile or sorted(PROFILES))]
    scenarios = {s.name: s.suite_cut() for s in load_scenarios()}
    if args.dry_run:
        for prof in chosen:
            for cell in cells_for(prof, scenarios):
                if not args.only or cell.scenario in args.only:
                    print(prof.name, cell.key)
        return 0
    table = json.loads(args.table.read_text(encoding="utf-8")) if args.table.exists() else {}
    with tempfile.TemporaryDirectory(prefix="pdchaos-profiles-") as tmp:
        for prof in chosen:
            table[prof.name] = asyncio.run(check_profile(prof, Path(tmp), args.only))
            args.table.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    bad = disagreements(table, EXPLAINED)
    for line in bad:
        print("disagrees:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
