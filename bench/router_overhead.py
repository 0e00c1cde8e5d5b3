"""Reference router overhead: added latency (p50/p99, routed vs direct to the stub) and requests/s at
saturation, for a 1p1d Mooncake pair of instant stub engines, over HTTP and over gRPC workers.

Three processes on loopback: the stub engines, the router (the real `pdchaos-router` CLI), this client.
Usage: python bench/router_overhead.py [--requests 300] [--seconds 5] [--concurrency 32] [--transport both]
Bounded: well under 60 s. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp
from closed_loop import drive

READY_STUBS = "STUBS_READY"
READY_ROUTER = "PDCHAOS_ROUTER_READY"


async def serve_stubs(transport: str) -> None:
    """Child mode: run the 1p1d stubs until stdin closes."""
    from reference_router.stub_engines import GrpcStubEngine, HttpStubEngine, StubState

    p_state, d_state = StubState("p", "prefill", "mooncake"), StubState("d", "decode", "mooncake")
    if transport == "grpc":
        p: Any = await GrpcStubEngine(p_state).start()
        d: Any = await GrpcStubEngine(d_state).start()
        http_decode = await HttpStubEngine(StubState("dd", "decode", "mooncake")).start()
        boot = 18998
    else:
        p = await HttpStubEngine(p_state, bootstrap=True).start()
        d = await HttpStubEngine(d_state).start()
        http_decode = d
        boot = p.bootstrap_port
    # Record nothing: a long run must not grow the stubs' memory.
    p_state.received = d_state.received = _Sink()
    http_decode.state.received = _Sink()
    info = {"prefill": p.url, "decode": d.url, "bootstrap": boot, "direct": http_decode.url}
    print(READY_STUBS, json.dumps(info), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


class _Sink(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        return None


async def _ready_line(proc: asyncio.subprocess.Process, prefix: str) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20.0)).decode()
        if not line:
            raise RuntimeError(f"process exited before {prefix}")
        if line.startswith(prefix):
            return dict(json.loads(line.split(" ", 1)[1]))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def sequential_latency(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    body = {"prompt": "[pdchaos:bench:1] hello", "max_tokens": 8}
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.post(url, json=body) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url} answered {r.status}")
        out.append(time.perf_counter() - t0)
    return out


async def saturate(url: str, seconds: float, concurrency: int) -> tuple[int, int, float]:
    return await drive(url, {"prompt": "[pdchaos:bench:2] hello", "max_tokens": 8}, seconds, concurrency)


async def run_one(transport: str, args: argparse.Namespace) -> None:
    procs: list[asyncio.subprocess.Process] = []
    try:
        stubs = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve-stubs", transport,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        procs.append(stubs)
        info = await _ready_line(stubs, READY_STUBS)
        router = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reference_router", "--pd-disaggregation",
            "--prefill", info["prefill"], str(info["bootstrap"]), "--decode", info["decode"],
            "--health-check-interval-secs", "1", "--health-success-threshold", "1",
            "--request-timeout-secs", "10", stdout=subprocess.PIPE,
        )
        procs.append(router)
        port = (await _ready_line(router, READY_ROUTER))["port"]
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            for _ in range(200):
                async with s.get(base + "/readiness") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError("router never became ready")
            await sequential_latency(s, base + "/v1/completions", 20)  # warm-up: tokenizer, pools
            await sequential_latency(s, info["direct"] + "/v1/completions", 20)
            direct = await sequential_latency(s, info["direct"] + "/v1/completions", args.requests)
            routed = await sequential_latency(s, base + "/v1/completions", args.requests)
        ok, errors, elapsed = await saturate(base + "/v1/completions", args.seconds, args.concurrency)
        d50, d99 = pct(direct, 0.5) * 1e3, pct(direct, 0.99) * 1e3
        r50, r99 = pct(routed, 0.5) * 1e3, pct(routed, 0.99) * 1e3
        print(f"[{transport} workers, 1p1d mooncake, {args.requests} sequential requests]")
        print(f"  direct to HTTP stub   p50 {d50:7.3f} ms   p99 {d99:7.3f} ms")
        mean = statistics.mean(routed) * 1e3
        print(f"  routed (2 legs)       p50 {r50:7.3f} ms   p99 {r99:7.3f} ms   mean {mean:.3f} ms")
        print(f"  added by the router   p50 {r50 - d50:7.3f} ms   p99 {r99 - d99:7.3f} ms")
        print(f"  saturation: {ok / elapsed:8.1f} req/s routed (concurrency {args.concurrency}, "
              f"{elapsed:.1f} s, {errors} errors)", flush=True)
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5.0)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--transport", choices=["http", "grpc", "both"], default="both")
    ap.add_argument("--serve-stubs", choices=["http", "grpc"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_stubs:
        await serve_stubs(args.serve_stubs)
        return
    t0 = time.monotonic()
    for transport in (["http", "grpc"] if args.transport == "both" else [args.transport]):
        await run_one(transport, args)
    print(f"total {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
