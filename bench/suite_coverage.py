"""The lines of a decision core that the default suite in simulation never runs.

A mutant on a line no scenario runs survives the scenario-level mutation score whatever the checkers judge
(`bench/mutation.py --judge suite`): each such line is a scenario missing, or code the suite cannot reach
by design. This runs the default suite in simulated time (`pdchaos run --world sim`, at each settings preset
in turn) under coverage.py, every cell's worker process included, and prints, per file of the core, its
statements, the ones missed, and each missed line. Lines that only a test-only bug switch leads to (the body
of an `if SWITCH in bugs` branch: no run without `--inject-bug` reaches them) are left out and counted
apart, by the same rule the mutation score sets their mutants aside with.

    pip install -e '.[mutation]'
    python bench/suite_coverage.py                       # router core, scaled then production (minutes)
    python bench/suite_coverage.py --core engines --presets scaled
    python bench/suite_coverage.py --json cov.json       # also write the missed lines as JSON

Exits 0 whatever it finds (it measures), 2 when the suite does not pass (a run that fails says nothing of
what a passing suite reaches) or coverage.py is missing.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from mutation_suite import guarded_lines, switch_names

ROOT = Path(__file__).resolve().parent.parent
CORES = {"router": "reference_router/core", "engines": "fake_engines/core"}
# Started in every Python process of the run (the cells' workers too), through PYTHONPATH.
_STARTUP = "import coverage\ncoverage.process_startup()\n"


def run_suite(work: Path, core: str, presets: list[str]) -> int:
    """The suite at each preset under coverage, its data in `work`; the first exit status that is not 0."""
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_STARTUP)
    rc_file = work / "coveragerc"
    rc_file.write_text(f"[run]\nparallel = True\nsource = {CORES[core].replace('/', '.')}\n"
                       f"data_file = {work / 'data' / '.coverage'}\n")
    (work / "data").mkdir()
    env = {**os.environ, "COVERAGE_PROCESS_START": str(rc_file), "PYTHONPATH": str(site)}
    for preset in presets:
        argv = [sys.executable, "-m", "harness.cli", "run", "--world", "sim", "--no-progress", "--settings",
                preset, "--out", str(work / f"run-{preset}")]
        print(f"suite at {preset} settings under coverage ...", flush=True)
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, start_new_session=True, check=False)
        if done.returncode != 0:
            return done.returncode
    return 0


def missed_lines(work: Path) -> dict[str, tuple[int, list[int]]]:
    """Per source file (relative to the checkout): its statement count and the ones the runs never
    executed."""
    import coverage
    cov = coverage.Coverage(data_file=str(work / "data" / ".coverage"), config_file=str(work / "coveragerc"))
    cov.combine(data_paths=[str(work / "data")], keep=False)
    cov.load()
    out: dict[str, tuple[int, list[int]]] = {}
    for path in sorted(cov.get_data().measured_files()):
        _, statements, _, missing, _ = cov.analysis2(path)
        out[str(Path(path).resolve().relative_to(ROOT))] = (len(statements), list(missing))
    return out


def switch_guarded(path: Path, bugs_file: Path) -> set[int]:
    """The lines of `path` that only a bug switch leads to."""
    if path.resolve() == bugs_file.resolve():
        return set(range(1, len(path.read_text().splitlines()) + 1))
    return guarded_lines(ast.parse(path.read_text()), switch_names(bugs_file))


@dataclass(frozen=True)
class FileCoverage:
    statements: int
    missed: dict[int, str]  # line -> its text, for the lines a run without a switch could reach
    switch_only: int


def judged(missed: dict[str, tuple[int, list[int]]], core: str) -> dict[str, FileCoverage]:
    """The missed lines per file, those only a bug switch leads to set apart."""
    bugs_file = ROOT / CORES[core] / "bugs.py"
    out = {}
    for rel, (statements, missing) in sorted(missed.items()):
        guarded = switch_guarded(ROOT / rel, bugs_file)
        source = (ROOT / rel).read_text().splitlines()
        own = {n: source[n - 1].strip() for n in missing if n not in guarded}
        out[rel] = FileCoverage(statements, own, len(missing) - len(own))
    return out


def report(table: dict[str, FileCoverage], core: str) -> None:
    for rel, row in table.items():
        print(f"{rel}: {row.statements} statements, {len(row.missed)} missed, {row.switch_only} switch-only")
        for n, text in row.missed.items():
            print(f"  {n:5} {text[:100]}")
    total = sum(r.statements for r in table.values())
    switch = sum(r.switch_only for r in table.values())
    missed = sum(len(r.missed) for r in table.values())
    reachable = total - switch
    ran = reachable - missed
    print(f"core {core}: {total} statements, {switch} of them switch-only; the suite ran {ran} of the other "
          f"{reachable} ({100 * ran / max(1, reachable):.1f}%)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--core", choices=sorted(CORES), default="router")
    ap.add_argument("--presets", default="scaled,production", metavar="P[,P]",
                    help="the settings presets the suite runs at, in turn (default scaled,production)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the missed lines here")
    args = ap.parse_args()
    try:
        import coverage  # noqa: F401
    except ImportError:
        print("coverage.py is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pdchaos-suite-coverage-") as tmp:
        work = Path(tmp)
        rc = run_suite(work, args.core, args.presets.split(","))
        if rc != 0:
            print(f"the suite did not pass (exit {rc}): its coverage says nothing of a passing suite",
                  file=sys.stderr)
            return 2
        table = judged(missed_lines(work), args.core)
    report(table, args.core)
    if args.json:
        args.json.write_text(json.dumps({k: asdict(v) for k, v in table.items()}, indent=1, sort_keys=True)
                             + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
