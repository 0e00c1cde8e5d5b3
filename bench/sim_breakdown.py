"""Where a simulated request's wall time goes: the 1p2d benchmark of `sim_speed.py` (20 requests/s, the
prefill restarting every 5 minutes) for a few simulated minutes under cProfile, its time split by layer.

    python bench/sim_breakdown.py              # 10 simulated minutes (about 12,000 requests)
    python bench/sim_breakdown.py --minutes 3

Layers: the simulation shells (harness/worlds/sim and simpy: what a cheaper request model could remove),
the reference router's core, the fake engines' core (with the tokenizer), the session and its history (load
generation, the recorder, the JSONL writer), the checkers, the rest. A built-in function's time goes to the
layer of the code that called it. Prints seconds and microseconds per request under the profiler (which
slows call-heavy code most). Then, from an unprofiled run's wall time and those shares, what the simulated
seconds per wall second could at most be if the shells cost nothing, and if only the session and history
did (the issue's goal for this benchmark is 1000x). Measures, does not judge (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Runnable from a checkout without installation.
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from sim_speed import small  # noqa: E402

from harness.runner import run_scenario  # noqa: E402
from harness.session import ScenarioSession  # noqa: E402
from harness.worlds.sim.world import SimWorld  # noqa: E402

LAYERS = (
    ("simulation shells", ("harness/worlds/sim/", "site-packages/simpy/")),
    ("router core", ("reference_router/",)),
    ("engine core", ("fake_engines/", "pdchaos/openai_request.py", "site-packages/tokenizers/")),
    ("session and history",
     ("harness/session/", "harness/history.py", "harness/scenario/", "pdchaos/jsonl.py")),
    ("checkers", ("harness/checkers/",)),
)
OTHER = "the rest"


def layer_of(filename: str) -> str:
    name = filename.replace("\\", "/")
    for layer, marks in LAYERS:
        if any(m in name for m in marks):
            return layer
    return OTHER


def split_by_layer(stats: pstats.Stats) -> Counter[str]:
    """Seconds of own time per layer; a built-in's own time shared among its callers' layers by calls."""
    out: Counter[str] = Counter()
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, _fn), (_cc, _calls, own, _cum, callers) in raw.items():
        if filename != "~":
            out[layer_of(filename)] += own
            continue
        total = sum(c[1] for c in callers.values()) or 1
        if not callers:
            out[OTHER] += own
        for (caller_file, _l, _f), c in callers.items():
            out[layer_of(caller_file)] += own * c[1] / total
    return out


def scenario(minutes: float) -> Any:
    s = small()
    return replace(s, workload=replace(s.workload, duration_s=60.0 * minutes),
                   timeline=s.timeline[: int(minutes // 5)])


def timed_run(minutes: float, out: Path) -> float:
    t0 = time.perf_counter()
    asyncio.run(run_scenario(scenario(minutes), "1p2d", "mooncake", "http", "reference", out, world="sim",
                             settings="production"))
    return time.perf_counter() - t0


def profile_run(minutes: float, out: Path) -> tuple[pstats.Stats, int]:
    s = scenario(minutes)

    async def inline(world: SimWorld, session: ScenarioSession) -> None:
        # The world runs its session on a worker thread, which cProfile does not see: here, on this one.
        world.run_session(session)

    prof = cProfile.Profile()
    original = SimWorld.run
    SimWorld.run = inline  # type: ignore[method-assign]
    try:
        prof.enable()
        asyncio.run(run_scenario(s, "1p2d", "mooncake", "http", "reference", out, world="sim",
                                 settings="production"))
        prof.disable()
    finally:
        SimWorld.run = original  # type: ignore[method-assign]
    with open(out / "history.jsonl", "rb") as fh:
        requests = sum(1 for line in fh if b"request_completed" in line)
    return pstats.Stats(prof), requests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="simulated minutes (default 10)")
    args = ap.parse_args()
    if args.minutes <= 0:
        ap.error("--minutes must be positive")
    with tempfile.TemporaryDirectory(prefix="pdchaos-simbreak-") as tmp:
        wall = timed_run(args.minutes, Path(tmp) / "timed")
        stats, requests = profile_run(args.minutes, Path(tmp) / "profiled")
    layers = split_by_layer(stats)
    total = sum(layers.values())
    per = 1e6 * total / max(1, requests)
    print(f"{requests} requests, {total:.1f} profiled s ({per:.0f} us per request)")
    for layer, secs in layers.most_common():
        print(f"  {layer:20s} {secs:6.2f} s  {100 * secs / total:5.1f}%  "
              f"{1e6 * secs / max(1, requests):6.0f} us/request")
    sim_s = 60.0 * args.minutes
    print(f"unprofiled: {wall:.1f} s wall for {sim_s:.0f} simulated s = {sim_s / wall:.0f}x real time")
    without_shells = wall * (total - layers["simulation shells"]) / total
    history_only = wall * layers["session and history"] / total
    print(f"at most {sim_s / without_shells:.0f}x with the shells at zero cost; "
          f"at most {sim_s / history_only:.0f}x with the session and history alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
