"""Mutation score of the two decision cores (reference_router/core, fake_engines/core) with mutmut 3.

Each core is mutated against its own fast unit tests only (router: tests/unit/router, engines:
tests/unit/engines), in a throw-away copy of this checkout (tracked and untracked-not-ignored files), so
the working tree is never touched. Not part of the default test run; needs the `mutation` extra:

    pip install -e '.[mutation]'
    python bench/mutation.py                          # both cores, every mutant (about 6 min on 2 idle cores)
    python bench/mutation.py --core router            # one core
    python bench/mutation.py --core engines --paths 'fake_engines/core/handoff.py' --max-mutants 200
    python bench/mutation.py --survivors out.txt      # also write each surviving mutant's diff

Prints per core: mutants total, killed, survived, timeout, skipped (mutmut's skipped plus the mutants no
test reaches), other (suspicious, segfault, not checked), the score killed / (total - skipped), and the wall
time. A mutant gets a CPU-time limit of (its tests' clean time + --timeout-constant) x --timeout-multiplier
x 2; past it, it counts as a timeout, not as killed. Exits 0 whatever the score (it measures, it does not
judge); 2 when mutmut itself fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--core", choices=(*CORES, "both"), default="both")
    ap.add_argument("--paths", nargs="+", default=[], metavar="GLOB",
                    help="mutate only these files (globs relative to the checkout, e.g. "
                         "'reference_router/core/breaker.py'); default: every file of the chosen cores")
    ap.add_argument("--max-mutants", type=int, metavar="N",
                    help="run a random sample of N mutants (seeded by --seed) instead of all of them")
    ap.add_argument("--seed", type=int, default=0)
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
    try:
        import mutmut
    except ImportError:
        print("mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
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
        if args.max_mutants is not None:
            # Generate every mutant and the test map first (naming a mutant that matches nothing does it).
            run_mutmut(copy, [*run_argv, "pdchaos_no_such_mutant*"], log, args.wall_limit)
            names = sorted(n for codes in results(copy).values() for n in codes)
            random.Random(args.seed).shuffle(names)
            run_argv += sorted(names[: args.max_mutants])
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
