"""Agreement of the two worlds: every shipped scenario (and every bug it catches) in real and simulated time,
at scaled settings, must get the same verdict from every checker.

The table (`tests/data/agreement.json`) holds, per row (scenario, cell, injected bug), each checker's verdict
in real time. `python -m harness.agreement` runs both worlds and rewrites it (about 17 minutes on 2 cores);
the tests run the simulated side against it in the default run and the real-time side behind `slow`. A row
where the worlds cannot agree says why in its scenario (`Scenario.world_notes["sim"]`).

    python -m harness.agreement                 # run both worlds, print the table, write it
    python -m harness.agreement --world sim     # only check the simulated side against the table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.runner import run_scenario
from harness.scenario import Scenario, load_scenarios
from harness.scenario.bugs import with_bugs

TABLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "agreement.json"


@dataclass(frozen=True)
class AgreementRow:
    scenario: str
    topology: str
    connector: str
    transport: str
    bug: str | None

    @property
    def key(self) -> str:
        return f"{self.scenario}[{self.topology}-{self.connector}-{self.transport}]" + (
            f"+{self.bug}" if self.bug else "")


def rows(scenarios: list[Scenario] | None = None) -> list[AgreementRow]:
    """Each scenario in its first cell, as written and with each bug it claims to catch."""
    out = []
    for s in scenarios if scenarios is not None else load_scenarios():
        cells = s.matrix()
        if not cells:
            continue
        t, c, tr = cells[0]
        out.append(AgreementRow(s.name, t, c, tr, None))
        out += [AgreementRow(s.name, t, c, tr, bug) for bug in s.catches]
    return out


async def verdicts(row: AgreementRow, world: str, out: Path,
                   scenarios: dict[str, Scenario]) -> dict[str, str]:
    s = scenarios[row.scenario]
    if row.bug:
        s = with_bugs(s, [row.bug])
    res = await run_scenario(s, row.topology, row.connector, row.transport, "reference",
                             out / world / row.key.replace("[", "_").replace("]", "_").replace("+", "_"),
                             world=world, settings="scaled")
    return {v.name: v.status for v in res.verdicts}


def load_table(path: Path = TABLE) -> dict[str, dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def differences(real: dict[str, str], sim: dict[str, str]) -> list[str]:
    """Checkers whose verdicts differ between the worlds, as `name: real -> sim`."""
    return [f"{name}: {real.get(name, 'absent')} -> {sim.get(name, 'absent')}"
            for name in sorted(set(real) | set(sim)) if real.get(name) != sim.get(name)]


def markdown(table: dict[str, dict[str, Any]]) -> str:
    """The table as README shows it: one line per row, the verdict, and any difference with its reason."""
    lines = ["| scenario [cell] + bug | real | sim | agree |", "|---|---|---|---|"]
    for key, row in table.items():
        real, sim = row.get("real", {}), row.get("sim", {})
        diff = differences(real, sim)
        agree = "yes" if not diff else ("explained: " + row.get("why", "") if row.get("why") else "NO")
        lines.append(f"| {key} | {_overall(real)} | {_overall(sim)} | {agree} |")
    return "\n".join(lines)


def _overall(v: dict[str, str]) -> str:
    if any(s == "fail" for s in v.values()):
        return "fail (" + ", ".join(sorted(k for k, s in v.items() if s == "fail")) + ")"
    if any(s == "unknown" for s in v.values()):
        return "unknown"
    return "pass" if v else "-"


async def _main(args: argparse.Namespace) -> int:
    scen = {s.name: s for s in load_scenarios()}
    unknown = sorted(set(args.only or ()) - set(scen))
    if unknown:
        print(f"python -m harness.agreement: error: unknown scenario(s) {', '.join(unknown)}",
              file=sys.stderr)
        return 2
    table = load_table()
    out = Path(tempfile.mkdtemp(prefix="pdchaos-agreement-"))
    bad = 0
    for row in rows(list(scen.values())):
        if args.only and row.scenario not in args.only:
            continue
        entry = table.setdefault(row.key, {})
        why = scen[row.scenario].world_notes.get("sim", "")
        if why:
            entry["why"] = why
        if args.world in ("both", "real"):
            entry["real"] = await verdicts(row, "real", out, scen)
        entry["sim"] = await verdicts(row, "sim", out, scen)
        diff = differences(entry.get("real", {}), entry["sim"])
        bad += bool(diff and not why)
        print(f"{row.key:70} {'agree' if not diff else 'DIFFER ' + '; '.join(diff)}", flush=True)
    if args.world in ("both", "real") and not args.dry_run:
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(markdown(table))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.agreement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", choices=("both", "real", "sim"), default="both")
    ap.add_argument("--dry-run", action="store_true", help="do not rewrite the table")
    ap.add_argument("--only", nargs="+", metavar="SCENARIO", help="only these scenarios' rows")
    return asyncio.run(_main(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
