"""Speed of the simulated world at production settings.

1. 1p2d, 20 requests/s, one simulated hour, the prefill restarting every 5 minutes: simulated seconds per
   wall second (goal: at least 1000).
2. 64p64d, 1000 requests/s, ten simulated minutes with faults (prefill and decode restarts, a partitioned
   link): wall time (goal: under 60 s on 2 cores).

    python bench/sim_speed.py                 # both
    python bench/sim_speed.py --only small    # the first
    python bench/sim_speed.py --scale 0.1     # the second at a tenth of its rate (a quick look)

Prints one line per measurement (wall and CPU time, the second steadier on a shared machine; simulated
seconds, requests, requests per wall second, history size, the process's peak memory so far, verdict);
exits 0 whatever the verdicts (it measures, it does not judge).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

# Runnable from a checkout without installation.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.runner import run_scenario
from harness.scenario import At, Expect, HealLink, Partition, Restart, Scenario, Step, Workload

# The scenarios below are written at production time already: the preset must not stretch them again.
AS_WRITTEN = {"production": {"time_scale": 1.0}}
EXPECT = (Expect("nothing_lost"), Expect("output"), Expect("transfer_timeout"))


def small() -> Scenario:
    hour = 3600.0
    steps = tuple(Step(f"restart{i}", Restart("prefill-0", down_s=20.0), At(300.0 * i))
                  for i in range(1, int(hour // 300)))
    return Scenario(
        name="bench_1p2d_hour", description="1p2d, 20 rps, prefill restart every 5 min, 1 h",
        topologies=("1p2d",), connectors=("mooncake",), transports=("http",),
        workload=Workload(mode="open", rate_rps=20.0, duration_s=hour, deadline_s=600.0, stream_fraction=0.3,
                          chat_fraction=0.2, max_tokens=6),
        timeline=steps, expect=EXPECT, preset_overrides=AS_WRITTEN, ready_timeout_s=600.0,
    )


def large(scale: float) -> Scenario:
    span = 600.0
    steps = (
        Step("p3_restart", Restart("prefill-3", down_s=30.0), At(60.0)),
        Step("d7_restart", Restart("decode-7", down_s=200.0), At(120.0)),
        Step("cut_p5", Partition("prefill-5"), At(240.0)),
        Step("mend_p5", HealLink("prefill-5"), At(330.0)),
        Step("p11_restart", Restart("prefill-11", down_s=5.0), At(400.0)),
    )
    return Scenario(
        name="bench_64p64d", description="64p64d, 1000 rps, restarts and a partition, 10 min",
        topologies=("64p64d",), connectors=("mooncake",), transports=("http",),
        workload=Workload(mode="open", rate_rps=1000.0 * scale, duration_s=span, deadline_s=600.0,
                          stream_fraction=0.3, chat_fraction=0.2, max_tokens=6),
        timeline=steps, expect=EXPECT, preset_overrides=AS_WRITTEN, ready_timeout_s=900.0,
    )


async def measure(label: str, s: Scenario, topology: str, out: Path) -> None:
    t0, cpu0 = time.perf_counter(), time.process_time()
    r = await run_scenario(s, topology, "mooncake", "http", "reference", out, world="sim",
                           settings="production")
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    size, requests = history_size(out / "history.jsonl")
    sim_s = s.workload.duration_s
    print(f"{label}: wall {wall:.1f} s (CPU {cpu:.1f} s) for {sim_s:.0f} simulated s = "
          f"{sim_s / wall:.0f}x real time; "
          f"{requests} requests ({requests / wall:.0f}/wall s); history {size / 1e6:.1f} MB; "
          f"peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB; "
          f"verdict {r.status}" + (f" ({r.reason[:120]})" if r.status != "pass" else ""), flush=True)


def history_size(path: Path) -> tuple[int, int]:
    """(bytes, completed requests) of a history file."""
    if not path.exists():
        return 0, 0
    with open(path, "rb") as fh:
        requests = sum(1 for line in fh if b"request_completed" in line)
    return path.stat().st_size, requests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("small", "large"))
    ap.add_argument("--scale", type=float, default=1.0, help="rate factor for the 64p64d run (default 1)")
    ap.add_argument("--keep", type=Path, help="keep run folders under this folder")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="pdchaos-simbench-"))
    print(f"cpus: {os.cpu_count()}; runs under {base}", flush=True)
    if args.only in (None, "small"):
        asyncio.run(measure("1p2d 20 rps 1 h", small(), "1p2d", base / "small"))
    if args.only in (None, "large"):
        asyncio.run(measure(f"64p64d {1000 * args.scale:g} rps 10 min", large(args.scale), "64p64d",
                            base / "large"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
