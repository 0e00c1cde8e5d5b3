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
did (the issue's goal for this benchmark is 1000x).

Last, two floors measured without the profiler, which no change to the cores or the shells can go under
while every request is simulated event by event and recorded: the history (the timed run's own records,
written again through a HistoryRecorder), simpy itself (as many events per request as the timed run
scheduled, as bare timeouts in one process per request), and the engine and router cores (every call the
simulation shells make into them, timed in place in a fourth run, less the timer's own cost). Measures,
does not judge (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import simpy

HERE = Path(__file__).resolve().parent
# Runnable from a checkout without installation.
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from sim_speed import small  # noqa: E402

import harness.worlds.sim.router as sim_router  # noqa: E402
from fake_engines.core.engine_state import EngineState  # noqa: E402
from fake_engines.core.fault_state import FaultState  # noqa: E402
from fake_engines.core.request_flow import RequestFlow  # noqa: E402
from harness.history_writer import HistoryRecorder  # noqa: E402
from harness.runner import run_scenario  # noqa: E402
from harness.session import ScenarioSession  # noqa: E402
from harness.worlds.sim.world import SimWorld  # noqa: E402
from pdchaos.jsonl import read_jsonl  # noqa: E402
from reference_router.core import DispatchFlow  # noqa: E402

LAYERS = (
    ("simulation shells", ("harness/worlds/sim/", "site-packages/simpy/")),
    ("router core", ("reference_router/",)),
    ("engine core", ("fake_engines/", "pdchaos/openai_request.py", "site-packages/tokenizers/")),
    ("session and history",
     ("harness/session/", "harness/history.py", "harness/scenario/", "pdchaos/jsonl.py")),
    ("checkers", ("harness/checkers/",)),
)
OTHER = "the rest"
# Where the simulation shells call into the cores, per request (the health loop's few calls a minute are left
# out): owner, then the names of its functions that a shell calls.
CORE_ENTRIES: tuple[tuple[Any, tuple[str, ...]], ...] = (
    (RequestFlow, ("__init__", "next_step", "on_gate_passed", "on_query_result", "on_handshake_result",
                   "on_pull_result", "on_deadline", "on_slept", "abort")),
    (EngineState, ("answer_side_channel", "bootstrap_answer")),
    (FaultState, ("gate_delay",)),
    (sim_router, ("gen_request_from_openai",)),
    (DispatchFlow, ("__init__", "start", "on_prepared", "on_id_read_waited", "on_leg_done", "on_backoff_done",
                    "close", "id_read_settled")),
)


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


def counted_run(minutes: float, out: Path) -> int:
    """The events simpy scheduled in a run of the benchmark (a third run: counting slows it)."""
    count = 0
    original = simpy.Environment.schedule

    def counting(self: simpy.Environment, event: simpy.Event, priority: int = 1, delay: float = 0) -> None:
        nonlocal count
        count += 1
        original(self, event, priority, delay)

    simpy.Environment.schedule = counting  # type: ignore[method-assign]
    try:
        asyncio.run(run_scenario(scenario(minutes), "1p2d", "mooncake", "http", "reference", out,
                                 world="sim", settings="production"))
    finally:
        simpy.Environment.schedule = original  # type: ignore[method-assign]
    return count


class CoreTimer:
    """Wall time spent inside the cores' entry points (a call inside another counts once), and calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.by_entry: Counter[str] = Counter()
        self.calls_by_entry: Counter[str] = Counter()
        self._depth = 0

    def wrap(self, fn: Callable[..., Any], label: str = "") -> Callable[..., Any]:
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth = 1
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                took = clock() - t0
                self.seconds += took
                self.calls += 1
                self.by_entry[label] += took
                self.calls_by_entry[label] += 1
                self._depth = 0

        return timed

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved = [(owner, name, owner.__dict__[name]) for owner, names in CORE_ENTRIES for name in names]
        try:
            for owner, name, fn in saved:
                setattr(owner, name, self.wrap(fn, f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"))
            yield
        finally:
            for owner, name, fn in saved:
                setattr(owner, name, fn)

    def own_cost_s(self) -> float:
        """What one timed call adds to `seconds` by itself (its clock reads), from timing a no-op."""
        probe = CoreTimer()
        noop = probe.wrap(lambda: None)
        for _ in range(100_000):
            noop()
        return probe.seconds / probe.calls


def cores_run(minutes: float, out: Path) -> tuple[float, int, list[tuple[str, float]]]:
    """Seconds inside the cores' entry points in a run of the benchmark, less the timer's own cost; calls;
    the costliest entries with their seconds."""
    timer = CoreTimer()
    with timer.installed():
        asyncio.run(run_scenario(scenario(minutes), "1p2d", "mooncake", "http", "reference", out,
                                 world="sim", settings="production"))
    own = timer.own_cost_s()
    top = [(name, max(0.0, secs - timer.calls_by_entry[name] * own))
           for name, secs in timer.by_entry.most_common(4)]
    return max(0.0, timer.seconds - timer.calls * own), timer.calls, top


def history_floor(history: Path, scratch: Path) -> float:
    """Seconds to record `history`'s records again (the view kept, the file written), unprofiled."""
    records = list(read_jsonl(history))
    recorder = HistoryRecorder(scratch, flush_each=False)
    t0 = time.perf_counter()
    for rec in records:
        fields = dict(rec)
        type_, t = fields.pop("type"), fields.pop("t")
        recorder.record(type_, fields, t=t)
    took = time.perf_counter() - t0
    recorder.close()
    return took


def simpy_floor(requests: int, events_per_request: float, rate_rps: float) -> float:
    """Seconds for simpy to schedule and run `events_per_request` events per request as bare timeouts, one
    process per request arriving at `rate_rps`, unprofiled: no model, no yield from, no record."""
    env = simpy.Environment()
    # The process's start is an event of its own, as is each request's send by the load generator.
    timeouts = max(0, round(events_per_request) - 2)

    def request() -> Any:
        for _ in range(timeouts):
            yield env.timeout(0.001)

    def load() -> Any:
        for _ in range(requests):
            yield env.timeout(1.0 / rate_rps)
            env.process(request())

    env.process(load())
    t0 = time.perf_counter()
    env.run()
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
        events = counted_run(args.minutes, Path(tmp) / "counted")
        cores_s, core_calls, top_entries = cores_run(args.minutes, Path(tmp) / "cores")
        history_s = history_floor(Path(tmp) / "timed" / "history.jsonl", Path(tmp) / "again.jsonl")
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
    per_request = events / max(1, requests)
    events_s = simpy_floor(requests, per_request, scenario(args.minutes).workload.rate_rps)
    floor = history_s + events_s + cores_s
    us = 1e6 / max(1, requests)
    print("floors, unprofiled, per request:")
    print(f"  recording the history      {history_s * us:5.0f} us")
    print(f"  simpy, {per_request:4.1f} events         {events_s * us:5.0f} us")
    print(f"  the cores, {core_calls / max(1, requests):4.1f} calls in    {cores_s * us:5.0f} us")
    for name, secs in top_entries:
        print(f"    of which {name:33s} {secs * us:5.0f} us")
    print(f"  together                   {floor * us:5.0f} us = at most {sim_s / floor:.0f}x real time with "
          f"free shells and session ({1e6 * wall / max(1, requests):.0f} us/request now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
