"""Mutation score of the two decision cores (reference_router/core, fake_engines/core) with mutmut 3.

Each core is mutated against its own fast unit tests only (router: tests/unit/router, engines:
tests/unit/engines), in a throw-away copy of this checkout (tracked and untracked-not-ignored files), so
the working tree is never touched. Not part of the default test run; needs the `mutation` extra:

    pip install -e '.[mutation]'
    python bench/mutation.py                          # both cores, every mutant (about 6 min on 2 idle cores)
    python bench/mutation.py --core router            # one core
    python bench/mutation.py --core engines --paths 'fake_engines/core/handoff.py' --max-mutants 200
    python bench/mutation.py --survivors out.txt      # also write each surviving mutant's diff
    python bench/mutation.py --judge suite --core router --max-mutants 300 --seed 1 --results r.json
                                                      # judged by the default suite in simulation, then a
                                                      # 60 s search (bench/mutation_suite.py); hours
    python bench/mutation.py --judge suite --core router --seed 3 --resume r.json --stop-after 3600
                                                      # an hour more of the same sample, kept in r.json

Prints per core: mutants total, killed, survived, timeout, skipped (mutmut's skipped plus the mutants no
test reaches), other (suspicious, segfault, not checked), the score killed / (total - skipped), and the wall
time. A mutant gets a CPU-time limit of (its tests' clean time + --timeout-constant) x --timeout-multiplier
x 2; past it, it counts as a timeout, not as killed. Exits 0 whatever the score (it measures, it does not
judge); 2 when mutmut itself fails.

With `--judge suite` the judge is the default scenario suite in simulated time, then `pdchaos search` with
`--search-budget` seconds for what the suite lets through, not the unit tests (bench/mutation_suite.py):
what a real gateway gets, since it has no unit tests here. `--max-mutants` samples per core (default 300).
It prints per core the mutants killed by the suite, by the search, the survivors and the equivalence
candidates (survivors the unit tests miss too), and the two scores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORES = {
    "router": ("reference_router/core", "tests/unit/router"),
    "engines": ("fake_engines/core", "tests/unit/engines"),
}
# Copied whole into mutmut's mutants/ folder, so every import (the cores' siblings, the pytest plugin)
# resolves inside the copy and never to the editable install of the checkout; only the cores are mutated.
PACKAGES = ("pdchaos", "reference_router", "fake_engines", "harness", "reports", "scenarios")
SKIP_DIRS = {".git", ".venv", "venv", "runs", "mutants", "__pycache__", ".pytest_cache", ".ruff_cache"}
# mutmut's exit code -> our column (mutmut.stats.status_by_exit_code, folded).
COLUMN = {1: "killed", 3: "killed", 0: "survived", 36: "timeout", 24: "timeout", -24: "timeout",
          152: "timeout", 255: "timeout", 33: "skipped", 5: "skipped", 34: "skipped",
          -9: "timeout"}  # -9: killed one second past the CPU limit (mutmut says "segfault")


def copy_checkout(dest: Path) -> None:
    """Tracked and untracked-not-ignored files of the checkout (a plain tree walk outside git)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)]
    for rel in files:
        src = ROOT / rel
        if not src.is_file():  # deleted in the working tree, or a submodule
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def configure(copy: Path, cores: list[str], paths: list[str], args: argparse.Namespace) -> None:
    pyproject = copy / "pyproject.toml"
    text = pyproject.read_text()
    if "mutmut" in tomllib.loads(text).get("tool", {}):
        sys.exit("pyproject.toml already has [tool.mutmut]; this script writes its own")
    only = paths or [f"{CORES[c][0]}/*.py" for c in cores]
    tests = [CORES[c][1] for c in cores]
    section = (
        "\n[tool.mutmut]\n"
        f"source_paths = {json.dumps(list(PACKAGES))}\n"
        f"only_mutate = {json.dumps(only)}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        f"timeout_multiplier = {float(args.timeout_multiplier)}\n"
        f"timeout_constant = {float(args.timeout_constant)}\n"
        "use_git_change_detection = false\n"
    )
    pyproject.write_text(text + section)


def run_mutmut(copy: Path, argv: list[str], log: Path, timeout: float | None = None) -> int:
    with open(log, "ab") as fh:
        fh.write(f"\n$ mutmut {' '.join(argv)}\n".encode())
        fh.flush()
        try:
            done = subprocess.run([sys.executable, "-m", "mutmut", *argv], cwd=copy, stdout=fh,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout)
            return done.returncode
        except subprocess.TimeoutExpired:
            fh.write(b"\n[bench/mutation.py: wall limit reached]\n")
            return 124


def results(copy: Path) -> dict[str, dict[str, int]]:
    """{mutant name: exit code} per source file, from mutmut's .meta files."""
    out: dict[str, dict[str, int]] = {}
    for meta in sorted((copy / "mutants").rglob("*.py.meta")):
        rel = str(meta.relative_to(copy / "mutants"))[: -len(".meta")]
        data = json.loads(meta.read_text())
        out[rel] = dict(data.get("exit_code_by_key", {}))
    return out


def core_of(path: str) -> str | None:
    return next((c for c, (src, _) in CORES.items() if path.startswith(src + "/")), None)


def table(by_file: dict[str, dict[str, int]], cores: list[str], wall: float) -> None:
    print(f"{'core':<8} {'total':>6} {'killed':>7} {'survived':>9} {'timeout':>8} {'skipped':>8} {'other':>6}"
          f" {'score':>7}")
    for core in cores:
        n: Counter[str] = Counter()
        for path, codes in by_file.items():
            if core_of(path) != core:
                continue
            for code in codes.values():
                n["total"] += 1
                n[COLUMN.get(code, "other") if code is not None else "other"] += 1
        tested = n["total"] - n["skipped"]
        score = f"{100.0 * n['killed'] / tested:6.1f}%" if tested else "    n/a"
        print(f"{core:<8} {n['total']:>6} {n['killed']:>7} {n['survived']:>9} {n['timeout']:>8} "
              f"{n['skipped']:>8} {n['other']:>6} {score:>7}")
    print(f"wall {wall / 60:.1f} min", flush=True)


def write_survivors(copy: Path, by_file: dict[str, dict[str, int]], out: Path) -> int:
    names = [(path, name) for path, codes in by_file.items() for name, code in codes.items() if code == 0]
    script = (
        "import json, sys\n"
        "from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
        "for path, name in json.load(sys.stdin):\n"
        "    print(f'# {name}  ({path})')\n"
        "    print(get_diff_for_mutant(name, path=path))\n"
        "    print()\n"
    )
    with open(out, "w") as fh:
        subprocess.run([sys.executable, "-c", script], cwd=copy, input=json.dumps(names).encode(),
                       stdout=fh, check=False)
    return len(names)


def mutant_diffs(copy: Path, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Each (path, mutant)'s diff, by mutant name (one process for them all)."""
    script = ("import json, sys\nfrom mutmut.mutation.diff_apply import get_diff_for_mutant\n"
              "print(json.dumps({n: get_diff_for_mutant(n, path=p) for p, n in json.load(sys.stdin)}))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=copy, input=json.dumps(pairs).encode(),
                          capture_output=True, check=False)
    try:
        diffs = json.loads(done.stdout or b"{}")
    except ValueError:
        diffs = {}
    return {str(k): str(v) for k, v in diffs.items()}


def _rejudged(results_file: Path, core: str, names: list[tuple[str, str]],
              copy: Path) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The mutants a `--results` file recorded as surviving the suite and the search, where the code still
    has them, and their diffs (a mutant of a function that changed since is gone, or its name stands for
    another mutation: it is named; the one the name stands for now is judged)."""
    from mutation_suite import diff_key, renumbered
    try:
        recorded = json.loads(results_file.read_text())["cores"][core]["mutants"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--rejudge {results_file}: not a --results file of core {core} ({exc})") from exc
    wanted = {n for n, f in recorded.items() if f.get("suite") == "pass" and f.get("search") != "fail"}
    chosen = [(path, n) for path, n in names if n in wanted]
    gone = sorted(wanted - {n for _, n in chosen})
    diffs = mutant_diffs(copy, chosen)
    other = renumbered({n: recorded[n] for _, n in chosen}, {n: diff_key(d) for n, d in diffs.items()})
    print(f"{core}: rejudging {len(chosen)} survivors of {results_file} ({len(recorded)} judged there)"
          + (f"; no longer in the code: {', '.join(gone)}" if gone else "")
          + (f"; now another mutation: {', '.join(other)}" if other else ""), flush=True)
    return chosen, diffs


def source_revision() -> str:
    """The checkout's commit, marked when its working tree differs (what a resumed sample's parts ran on)."""
    done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or "unknown"


def judge_by_suite(copy: Path, cores: list[str], args: argparse.Namespace) -> int:
    """Sample each core's mutants and judge them with the scenario suite, then the search."""
    from mutation_suite import (
        NOT_RUN,
        TIME_LIMIT_FACTOR,
        TIME_LIMIT_FLOOR_S,
        SuiteTally,
        diff_key,
        message_only,
        print_tally,
        resumed,
        run_presets,
        run_search,
        seeded_sample,
        switch_only,
        unit_tests_pass,
    )

    by_file = results(copy)
    presets = tuple(args.presets.split(","))
    clean = run_presets(copy, "", 3600.0, presets)
    print(f"clean suite: {clean.outcome} in {clean.wall_s:.1f} s {clean.detail}", flush=True)
    if clean.outcome != "pass":
        print("the suite does not pass without a mutant: nothing to judge", file=sys.stderr)
        return 2
    forced = run_presets(copy, "fail", 600.0, presets)
    if forced.outcome == "pass":
        print("the suite passed with every mutated function raising: the copy is not what runs",
              file=sys.stderr)
        return 2
    limit = max(TIME_LIMIT_FLOOR_S, TIME_LIMIT_FACTOR * clean.wall_s)
    cores_done: dict[str, object] = {}
    if args.resume is not None:  # the cores not judged this time stay in the file as they were
        with contextlib.suppress(OSError, ValueError, AttributeError):
            cores_done = dict(json.loads(args.resume.read_text()).get("cores", {}))
    report: dict[str, object] = {"seed": args.seed, "clean_suite_s": clean.wall_s, "presets": list(presets),
                                 "cores": cores_done}

    def save(tally: SuiteTally) -> None:
        cores_done[tally.core] = {"mutants": tally.results, "counts": dict(tally.counts()),
                                  "scores": tally.scores()}
        if args.results:
            args.results.write_text(json.dumps(report, indent=1, sort_keys=True))

    survivors_text: list[str] = []
    judged_at = source_revision()
    started = time.monotonic()
    for core in cores:
        t0 = time.monotonic()
        names = sorted((path, n) for path, codes in by_file.items() if core_of(path) == core for n in codes)
        tally = SuiteTally(core)
        if args.rejudge is not None:
            chosen, diffs = _rejudged(args.rejudge, core, names, copy)
        else:
            chosen = seeded_sample(names, args.seed, args.max_mutants or 300)
            diffs = mutant_diffs(copy, chosen)
            if args.resume is not None:
                keys = {n: diff_key(d) for n, d in diffs.items()}
                tally.results.update(resumed(args.resume, core, args.seed, presets, chosen, keys))
                chosen = [(path, name) for path, name in chosen if name not in tally.results]
        for i, (path, name) in enumerate(chosen, 1):
            if args.stop_after is not None and time.monotonic() - started > args.stop_after:
                print(f"--stop-after {args.stop_after:g} s: {len(chosen) - i + 1} of {core}'s sample left "
                      "unjudged (--resume the results file to go on)", flush=True)
                break
            diff = diffs.get(name, "")
            bugs_file = copy / CORES[core][0] / "bugs.py"
            if switch_only(copy / path, bugs_file, name, diff):
                tally.add(name, path=path, suite=NOT_RUN, switch_only="yes", judged_at=judged_at,
                          diff_key=diff_key(diff))
                print(f"[{core} {i}/{len(chosen)}] {name}: switch-only code, set aside without a run",
                      flush=True)
                save(tally)
                continue
            suite = run_presets(copy, name, limit, presets)
            tally.add(name, path=path, suite=suite.outcome, suite_detail=suite.detail,
                      suite_s=f"{suite.wall_s:.1f}", judged_at=judged_at, diff_key=diff_key(diff))
            if suite.outcome == "pass" and args.search_budget > 0:
                search = run_search(copy, name, args.search_budget, args.jobs)
                tally.add(name, search=search.outcome, search_detail=search.detail)
            facts = tally.results[name]
            if facts.get("suite") == "pass" and facts.get("search") != "fail":
                unit = unit_tests_pass(copy, name, CORES[core][1])
                wording = message_only(copy / path, name, diff)
                tally.add(name, unit_tests="pass" if unit else "fail", switch_only="no",
                          message_only="yes" if wording else "no")
                mark = ("message wording: set aside" if wording else
                        "equivalence candidate: the unit tests miss it too" if unit else "unit tests kill it")
                survivors_text.append(f"# {name}  ({path}): {mark}\n{diff}\n")
            print(f"[{core} {i}/{len(chosen)}] {name}: suite {suite.outcome} ({suite.wall_s:.0f} s)"
                  + (f", search {facts['search']}" if "search" in facts else "")
                  + (f", unit tests {facts['unit_tests']}" if "unit_tests" in facts else ""), flush=True)
            save(tally)
        save(tally)
        print_tally(tally, time.monotonic() - t0)
    if args.survivors:
        args.survivors.write_text("\n".join(survivors_text))
        print(f"{len(survivors_text)} surviving mutants written to {args.survivors}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", choices=("unit", "suite"), default="unit",
                    help="unit: the core's unit tests kill mutants (default); suite: the default scenario "
                         "suite in simulation, then a short search")
    ap.add_argument("--search-budget", type=float, default=60.0, metavar="S",
                    help="--judge suite: seconds of `pdchaos search` for each mutant the suite lets through "
                         "(0: none; default 60)")
    ap.add_argument("--presets", default="scaled,production", metavar="P[,P]",
                    help="--judge suite: the settings presets the default suite runs at, in turn (default "
                         "scaled,production: both the project ships)")
    ap.add_argument("--results", type=Path, metavar="FILE",
                    help="--judge suite: write every mutant's outcome here as JSON (rewritten as it goes)")
    ap.add_argument("--core", choices=(*CORES, "both"), default="both")
    ap.add_argument("--paths", nargs="+", default=[], metavar="GLOB",
                    help="mutate only these files (globs relative to the checkout, e.g. "
                         "'reference_router/core/breaker.py'); default: every file of the chosen cores")
    ap.add_argument("--max-mutants", type=int, metavar="N",
                    help="run a sample of N mutants instead of all of them: those first by a hash of --seed "
                         "and the mutant's name (a code change adds or drops only its own mutants)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rejudge", type=Path, metavar="RESULTS",
                    help="--judge suite: judge again only the survivors a --results file of an earlier run "
                         "recorded (its sample, after a change to the checkers or scenarios)")
    ap.add_argument("--resume", type=Path, metavar="RESULTS",
                    help="--judge suite: go on with the sample a --results file of the same seed and presets "
                         "holds, judging only the mutants it lacks (the file is rewritten unless --results "
                         "names another)")
    ap.add_argument("--stop-after", type=float, metavar="S",
                    help="--judge suite: start no new mutant after S seconds of judging (--resume goes on)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel workers (default: cpus)")
    ap.add_argument("--timeout-multiplier", type=float, default=5.0,
                    help="per-mutant CPU limit factor over its tests' clean time (default 5)")
    ap.add_argument("--timeout-constant", type=float, default=1.0,
                    help="seconds added to the clean time before the factor (default 1)")
    ap.add_argument("--wall-limit", type=float, default=3600.0, help="stop mutmut after this many seconds")
    ap.add_argument("--survivors", type=Path, metavar="FILE", help="write each surviving mutant's diff here")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="work in DIR and keep it (then `cd DIR && mutmut show NAME` / `mutmut browse`)")
    args = ap.parse_args()
    # A SIGTERM unwinds like Ctrl-C: each judge kills its suite's process group and the copy is removed
    # (the results file keeps what was judged; --resume goes on).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        import mutmut
    except ImportError:
        print("mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    for flag in ("rejudge", "resume", "stop_after"):
        if getattr(args, flag) is not None and args.judge != "suite":
            ap.error(f"--{flag.replace('_', '-')} needs --judge suite")
    if args.rejudge is not None and args.resume is not None:
        ap.error("--rejudge and --resume are two different samples: give one")
    if args.resume is not None and args.results is None:
        args.results = args.resume
    cores = list(CORES) if args.core == "both" else [args.core]
    if args.paths:
        bad = [p for p in args.paths if core_of(p) not in cores]
        if bad:
            ap.error(f"--paths outside the chosen cores: {bad}")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        copy = args.keep.resolve()
    else:
        copy = Path(tempfile.mkdtemp(prefix="pdchaos-mutation-"))
    log = copy / "mutmut.log"
    print(f"mutmut {mutmut.__version__}; cores {', '.join(cores)}; jobs {args.jobs}; work in {copy} "
          f"(log {log.name})", flush=True)
    t0 = time.monotonic()
    try:
        copy_checkout(copy)
        configure(copy, cores, args.paths, args)
        run_argv = ["run", "--max-children", str(args.jobs)]
        if args.judge == "suite":
            run_mutmut(copy, [*run_argv, "pdchaos_no_such_mutant*"], log, args.wall_limit)
            return judge_by_suite(copy, cores, args)
        if args.max_mutants is not None:
            # Generate every mutant and the test map first (naming a mutant that matches nothing does it).
            run_mutmut(copy, [*run_argv, "pdchaos_no_such_mutant*"], log, args.wall_limit)
            from mutation_suite import seeded_sample
            pairs = [(path, n) for path, codes in results(copy).items() for n in codes]
            run_argv += sorted(n for _, n in seeded_sample(pairs, args.seed, args.max_mutants))
        rc = run_mutmut(copy, run_argv, log, max(1.0, args.wall_limit - (time.monotonic() - t0)))
        wall = time.monotonic() - t0
        by_file = results(copy)
        if args.max_mutants is not None:
            chosen = set(run_argv[3:])
            by_file = {p: {n: c for n, c in codes.items() if n in chosen} for p, codes in by_file.items()}
        if rc != 0 or not by_file:
            print(f"mutmut exited {rc}; the end of {log}:", file=sys.stderr)
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            if not by_file:
                return 2
        table(by_file, cores, wall)
        if args.survivors:
            n = write_survivors(copy, by_file, args.survivors.resolve())
            print(f"{n} surviving mutants written to {args.survivors}")
    finally:
        if not args.keep:
            shutil.rmtree(copy, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
