"""Wall time of the #2491 scenario (Mooncake prefill restart, 1p2d) and of the whole default suite.

Targets: the #2491 scenario well under 30 s wall; the default suite under 5 minutes on 2 cores.

    python bench/scenario_walltime.py                 # both
    python bench/scenario_walltime.py --only-2491     # the single scenario
    python bench/scenario_walltime.py --transport grpc --keep runs/bench

Prints one line per measured thing plus the slowest cells; exits 0 whatever the verdicts (it measures
time, it does not judge), 3 when nothing matches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Runnable from a checkout without installation.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.parallel import run_suite
from harness.runner import expand_matrix
from harness.scenario import load_scenarios
from harness.suite import default_suite


def pick_2491(scenarios: list[Any], name: str | None) -> Any | None:
    if name:
        return next((s for s in scenarios if s.name == name), None)
    for s in scenarios:
        if "#2491" in s.bugs and "mooncake" in s.connectors and "1p2d" in s.topologies:
            return s
    return None


async def timed(label: str, scenarios: list[Any], cells: list[Any], out: Path, router: str) -> list[Any]:
    t0 = time.monotonic()
    results = await run_suite(scenarios, cells, out, router=router)
    wall = time.monotonic() - t0
    counts = {s: sum(1 for r in results if r.status == s) for s in ("pass", "fail", "unknown")}
    print(f"{label}: {len(cells)} cells, wall {wall:.1f} s, {wall / max(1, len(cells)):.1f} s/cell; "
          f"pass {counts['pass']} fail {counts['fail']} unknown {counts['unknown']}", flush=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only-2491", action="store_true", help="measure only the #2491 scenario")
    ap.add_argument("--skip-2491", action="store_true", help="measure only the default suite")
    ap.add_argument("--scenario", help="the #2491 scenario's name (default: first with bug #2491, Mooncake)")
    ap.add_argument("--transport", default="http", choices=("http", "grpc"), help="for the #2491 cell")
    ap.add_argument("--router", default="reference")
    ap.add_argument("--keep", type=Path, help="keep run folders under this folder (default: a temp folder)")
    args = ap.parse_args()

    scenarios = load_scenarios()
    base = args.keep or Path(tempfile.mkdtemp(prefix="pdchaos-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"cpus: {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))}); runs under {base}", flush=True)

    if not args.skip_2491:
        s = pick_2491(scenarios, args.scenario)
        if s is None:
            print("no #2491 scenario found", file=sys.stderr)
            return 3
        cells = expand_matrix([s], ["1p2d"], ["mooncake"], [args.transport])
        if not cells:
            print(f"{s.name} has no 1p2d/mooncake/{args.transport} cell", file=sys.stderr)
            return 3
        res = asyncio.run(timed(f"#2491 {s.name} 1p2d/{args.transport}", [s], cells, base / "s2491",
                                args.router))
        for r in res:
            print(f"  verdict {r.status}; scenario's own time {r.duration_s:.1f} s", flush=True)

    if not args.only_2491:
        suite = default_suite(scenarios, "real")
        cells = expand_matrix(suite)
        res = asyncio.run(timed(f"default suite ({len(suite)} scenarios)", suite, cells, base / "suite",
                                args.router))
        slow = sorted(res, key=lambda r: -(r.duration_s or 0.0))[:5]
        for r in slow:
            print(f"  slowest: {r.duration_s:.1f} s {r.scenario} {r.topology}/{r.connector}/{r.transport} "
                  f"{r.status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
