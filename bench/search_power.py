"""Power of `pdchaos search`: for each bug switch (or the ones named), run `pdchaos search --inject-bug X
--budget 60` and print seeds/s, runs/s, time to first failure, the shrunk size, whether the shrunk scenario
has at most 2 faults and (`--replay-real`) whether replaying it in real time at scaled settings fails the
same checker.

    python bench/search_power.py                           # every switch, 60 s each
    python bench/search_power.py stale_engine_id legs_joined --budget 30 --jobs 2 --replay-real

One line per switch, then a total; exits 0 whatever was found (it measures, it does not judge).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.scenario.bugs import INJECTABLE_BUGS  # noqa: E402


def _pdchaos(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _replay_real(found: dict[str, Any], work: Path) -> str:
    """'fails' when the real-time replay fails the same checker, else what it gave."""
    path = Path(found["file"])
    if "Not in real time:" in path.read_text():
        return "simulation only"
    seed = path.read_text().split("--seed ")[1].split()[0]
    out = work / ("real-" + path.stem)
    proc = _pdchaos("run", str(path), "--world", "real", "--settings", "scaled", "--seed", seed,
                    "--no-progress", "--out", str(out), timeout=300)
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return f"no report (exit {proc.returncode})"
    checker = found["signature"].split(":")[0]
    # A checker may be judged more than once (two availability expectations): any failing one counts.
    statuses = [v["status"] for r in report["results"] for v in r["verdicts"] if v["name"] == checker]
    if "fail" in statuses:
        return "fails"
    return f"{checker} {'/'.join(statuses) or 'absent'}"


def measure(bug: str, budget: float, jobs: int, replay_real: bool, work: Path,
            full_budget: bool = False, shrink_budget: float | None = None) -> dict[str, Any]:
    out = work / bug
    # By default the search stops generating at its first failure (which it still shrinks): the time to
    # first failure is the same, and a switch found early does not spend the rest of the budget.
    stop = [] if full_budget else ["--stop-at-first"]
    shrink = shrink_budget or budget
    _pdchaos("search", "--inject-bug", bug, "--budget", str(budget), "--shrink-budget", str(shrink),
             "--jobs", str(jobs), "--out", str(out), *stop, timeout=budget + shrink * 2 + 120)
    try:
        s = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {"bug": bug, "error": "no summary.json"}
    row: dict[str, Any] = {"bug": bug, "seeds_per_s": s["seeds_per_s"], "runs_per_s": s["runs_per_s"],
                           "seeds": s["seeds_tried"], "runs": s["runs"], "wall_s": s["wall_s"],
                           "ttff_s": s["time_to_first_failure_s"], "signatures": s["distinct_signatures"]}
    if s["found"]:
        best = min(s["found"], key=lambda f: (f["shrunk"]["faults"], f["found_after_s"]))
        row.update(shrunk=best["shrunk"], le2=best["shrunk"]["faults"] <= 2, signature=best["signature"])
        if replay_real:
            row["real"] = _replay_real(best, work)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bugs", nargs="*", help="switches (default: all)")
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--shrink-budget", type=float, help="seconds a failure may be shrunk (default: --budget)")
    p.add_argument("--replay-real", action="store_true")
    p.add_argument("--full-budget", action="store_true",
                   help="search for the whole budget (default: stop generating at the first failure)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="keep each search's folder (found files, summaries) and replay under DIR")
    args = p.parse_args(argv)
    bugs = args.bugs or list(INJECTABLE_BUGS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="search-power-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for bug in bugs:
            row = measure(bug, args.budget, args.jobs, args.replay_real, work, args.full_budget,
                          args.shrink_budget)
            rows.append(row)
            shrunk = row.get("shrunk") or {}
            ttff = row.get("ttff_s")
            print(f"{bug:28s} seeds/s {row.get('seeds_per_s', '-'):>6} "
                  f"runs/s {row.get('runs_per_s', '-'):>6} wall {row.get('wall_s', '-'):>7} "
                  f"ttff {ttff if ttff is not None else '-':>7} "
                  f"shrunk faults {shrunk.get('faults', '-')} engines {shrunk.get('engines', '-')} "
                  f"<=2 {row.get('le2', '-')} real {row.get('real', '-')} | "
                  f"{row.get('signature', 'not found')}",
                  flush=True)
    found = sum(1 for r in rows if r.get("ttff_s") is not None)
    small = sum(1 for r in rows if r.get("le2"))
    real = sum(1 for r in rows if r.get("real") == "fails")
    print(f"found {found} of {len(rows)} switches within {args.budget:g} s; shrunk to <=2 faults: {small}"
          + (f"; real-time replay fails the same checker: {real}" if args.replay_real else ""))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
