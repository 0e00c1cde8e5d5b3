"""Wall time of the default suite at several `--jobs` values, and whether the verdicts stayed the same.

Runs `pdchaos run --jobs N` (the real CLI: fake engines and the reference router on loopback, real time)
once per N, in a fresh run folder each, and prints one line per N plus every cell whose verdict (or any
checker's) differs from the first N's. The machine's CPUs and load average are printed too: a timing
taken while something else keeps the cores busy says little about the suite.

    python bench/parallel_walltime.py                    # N = 1, 2, 4
    python bench/parallel_walltime.py --jobs 1,3 --world sim
    python bench/parallel_walltime.py --keep runs/bench-jobs -- prefill_restart_mooncake

Exit 0 whatever the verdicts (it measures, it does not judge); 1 when the verdicts differ between Ns.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def pdchaos() -> list[str]:
    exe = Path(sys.executable).with_name("pdchaos")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "harness.cli"]


def verdicts(run_dir: Path) -> dict[str, tuple[str, dict[str, str]]]:
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for r in doc.get("results") or []:
        key = f"{r['scenario']} {r['topology']}-{r['connector']}-{r['transport']}"
        out[key] = (r["status"], {v["name"]: v["status"] for v in r.get("verdicts") or []})
    return out


def one(n: int, base: Path, world: str, scenarios: list[str]) -> tuple[float, dict[str, Any]]:
    out = base / f"jobs-{n}"
    argv = [*pdchaos(), "run", *scenarios, "--jobs", str(n), "--world", world, "--out", str(out),
            "--no-progress"]
    t0 = time.monotonic()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.monotonic() - t0, verdicts(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="1,2,4", help="comma list of N (default 1,2,4)")
    ap.add_argument("--world", default="real", choices=("real", "sim"))
    ap.add_argument("--keep", type=Path, help="keep the run folders under this folder")
    ap.add_argument("scenarios", nargs="*", help="scenarios (default: the default suite)")
    args = ap.parse_args()
    ns = [int(x) for x in args.jobs.split(",") if x.strip()]
    base = args.keep or Path(tempfile.mkdtemp(prefix="pdchaos-jobs-"))
    base.mkdir(parents=True, exist_ok=True)
    cpus = len(os.sched_getaffinity(0))
    print(f"cpus: {cpus}; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"world: {args.world}; runs under {base}", flush=True)
    first: dict[str, Any] | None = None
    walls: dict[int, float] = {}
    differ = False
    for n in ns:
        wall, got = one(n, base, args.world, args.scenarios)
        walls[n] = wall
        counts = {s: sum(1 for st, _ in got.values() if st == s) for s in ("pass", "fail", "unknown")}
        print(f"jobs {n}: {len(got)} cells, wall {wall:.1f} s ({wall / 60:.2f} min); pass {counts['pass']} "
              f"fail {counts['fail']} unknown {counts['unknown']}; load average now "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        if first is None:
            first = got
            continue
        for key in sorted(set(first) | set(got)):
            if first.get(key) != got.get(key):
                differ = True
                print(f"  differs from jobs {ns[0]}: {key}: {first.get(key)} -> {got.get(key)}", flush=True)
    if len(walls) > 1:
        ref = walls[ns[0]]
        print("speed-up: " + ", ".join(f"jobs {n} x{ref / w:.2f}" for n, w in walls.items()), flush=True)
    print(f"verdicts {'DIFFER' if differ else 'identical'} across jobs {', '.join(map(str, ns))}", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
