"""Router overhead side by side: the reference router, smg and vllm-router on the same stub engines, over
HTTP and gRPC workers: added latency p50/p99 (routed minus direct to the decode engine) and requests/s at
saturation (closed loop), printed as one table with ratios to the fastest in each column.

Engines: the reference router's instant stub engines (`reference_router.stub_engines`), a 1p1d Mooncake pair,
one OS process per engine, each serving HTTP, gRPC (`VllmEngine`) and, for the prefill, the Mooncake bootstrap
`/query` on fixed loopback ports. Every router is put in front of these same two processes. They are not the
fake engines because the fakes model KV transfers and token timing, which would land in "added latency"; the
stubs answer at once. The stubs say what smg reads to take them for vLLM: `/v1/models` says `owned_by: vllm`
(else smg registers an HTTP worker as a generic OpenAI server and skips its vLLM PD path), and here
`GetModelInfo.model_path` is a local folder holding the stub's tokenizer (`StubState.model_dir`; else smg
asks the Hugging Face hub for it, off loopback).

Routers: `reference` plus gateway releases from the project's release cache (`smg==X`, `vllm-router==Y`,
default: the newest cached of each), started and registered through their adapters (`harness.routers`; smg's
HTTP workers go in through its worker API with their KV facts), all with the same settings (health every 1 s,
round robin, quiet logs). A cell a gateway cannot run (vllm-router with gRPC workers) is printed as n/a with
the adapter's reason; a router that fails is printed as failed with the error, never with a number.

Added latency: sequential requests, one at a time, a request direct to the decode's HTTP port (gRPC cells too:
the client speaks HTTP) and one through the router taking turns, so both see the same machine load;
p50(routed) - p50(direct), same for p99. The routed path is two legs (prefill, then decode), so it also holds
one extra instant stub answer. Requests/s: `--concurrency` clients posting back to back through the router for
`--seconds`. Client, router and engines share this machine's CPUs: the "direct" line (no router) is the
ceiling the client and one stub reach alone. (xN) in the table: N times the fastest in that column (lowest
added latency, highest req/s); x- where the fastest added latency is at or below zero (noise: no multiple of
it means anything).

Usage: python bench/router_overhead.py [--routers reference,smg==1.13.0,vllm-router==0.1.17]
       [--transport both] [--requests 500] [--seconds 10] [--concurrency 32] [--json FILE] [--log-dir DIR]
Bounded: every wait has a deadline; every process is in its own process group and is killed on every exit
path, also when this process dies (`harness.worlds.real.processes`). Loopback only. About 100 s with the three
default routers. Prints numbers; asserts nothing. The processes' logs stay in --log-dir (default: a temp dir).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from closed_loop import drive

from harness.routers import RouterAdapter, RouterAdapterError, make_router_adapter
from harness.routers.gateways import GATEWAYS, GatewayAdapter, ReleaseCache
from harness.scenario import RouterSettings, Scenario
from harness.topology import Topology, allocate
from harness.worlds.real.processes import ProcessSupervisor
from harness.worlds.real.world import wait_router_serving
from pdchaos.ports import free_port
from reference_router.stub_engines import GrpcStubEngine, HttpStubEngine, StubState, write_model_dir

READY_STUBS = "STUBS_READY"
# smg reaches Ready in about 1.5 s; the rest is slack for a loaded machine.
ROUTER_READY_TIMEOUT_S = 30.0
ROUTABLE_TIMEOUT_S = 20.0
ENGINE_READY_TIMEOUT_S = 20.0
ROUTER_STOP_GRACE_S = 1.0
REQUEST_TIMEOUT_S = 10.0
WARMUP_REQUESTS = 20
MODEL = "pdchaos-fake"
# What the decode stub answers: a routed answer with it went through the decode leg.
DECODE_ANSWER = "answer from decode-0"
BODY = {"model": MODEL, "prompt": "[pdchaos:bench:1] hello", "max_tokens": 8}
# Quiet logs for every router, as a per-request log line would be measured as router overhead: `error` is
# the one quiet level smg (`warn`) and vllm-router (`warning`) spell alike; the reference router's default is
# WARNING.
GATEWAY_LOG_LEVEL = "error"
REFERENCE_LOG_ARGS = ("--log-level", "ERROR")


# ---------------------------------------------------------------------------------------------- stub engines


class _Sink(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        return None


async def serve_stub(spec: dict[str, Any]) -> None:
    """Child mode: one stub engine on HTTP and gRPC (and a prefill's bootstrap `/query`) until killed."""
    state = StubState(spec["name"], spec["role"], "mooncake", model_dir=str(spec["model_dir"]))
    # Record nothing: a long run must not grow the stub's memory.
    state.received = _Sink()
    http = HttpStubEngine(state, bootstrap=spec["role"] == "prefill")
    http.port, http.bootstrap_port = int(spec["http_port"]), spec.get("bootstrap_port")
    await http.start()
    rpc = GrpcStubEngine(state)
    rpc.port = int(spec["grpc_port"])
    await rpc.start()
    print(READY_STUBS, json.dumps({"http": http.url, "grpc": rpc.url}), flush=True)
    # Until the supervisor's SIGTERM/SIGKILL (or this process's parent dying: PDEATHSIG).
    await asyncio.Event().wait()


# ------------------------------------------------------------------------------------------- measurements


@dataclass
class Cell:
    """One (router, transport): the numbers, or why there are none (`na`)."""

    router: str
    transport: str
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    direct_p50_ms: float | None = None
    direct_p99_ms: float | None = None
    routed_p50_ms: float | None = None
    routed_p99_ms: float | None = None
    rps: float | None = None
    ok: int = 0
    errors: int = 0
    na: str | None = None
    notes: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _post(session: aiohttp.ClientSession, url: str) -> str:
    async with session.post(url, json=BODY) as r:
        text = await r.text()
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {text[:200]}")
        return text


async def paired_latency(
    session: aiohttp.ClientSession, direct_url: str, routed_url: str, n: int
) -> tuple[list[float], list[float]]:
    """n direct and n routed requests, one at a time, taking turns (and swapping who goes first) so a
    change in machine load hits both sides alike. Seconds each."""
    direct: list[float] = []
    routed: list[float] = []
    for i in range(n):
        pair = [(direct_url, direct), (routed_url, routed)]
        for url, out in pair if i % 2 == 0 else reversed(pair):
            t0 = time.perf_counter()
            await _post(session, url)
            out.append(time.perf_counter() - t0)
    return direct, routed


async def wait_routable(session: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
    """Until a completion through the router comes back 200 from the decode stub: the workers are Ready
    (each gateway says so differently; an answer is the same for all)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            async with session.post(url, json=BODY, timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                text = await r.text()
                if r.status == 200 and DECODE_ANSWER in text:
                    return
                last = f"HTTP {r.status}: {text[:200]}"
        except (aiohttp.ClientError, TimeoutError) as e:
            last = f"{type(e).__name__}: {e}"
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no completion through the router within {timeout_s:g} s ({last})")


async def run_cell(
    sup: ProcessSupervisor,
    adapter: RouterAdapter,
    topo: Topology,
    settings: RouterSettings,
    scenario: Scenario,
    args: argparse.Namespace,
    log_dir: Path,
) -> Cell:
    cell = Cell(adapter.name, topo.transport)
    if isinstance(adapter, GatewayAdapter):
        why = adapter.cannot_run(scenario, topo.name, topo.connector, topo.transport)
        if why is not None:
            cell.na = why
            return cell
        cell.notes = [n for n in adapter.adjustments(settings) if "reference-router flags" not in n]
    rtopo = dataclasses.replace(topo, router_port=free_port())
    tag = f"{adapter.name}-{topo.transport}"
    try:
        launch = adapter.launch(rtopo, settings, rtopo.names(), str(log_dir / f"{tag}.events.jsonl"))
    except RouterAdapterError as e:
        cell.na = str(e)
        return cell
    cell.argv = list(launch.argv)
    # Belt and braces for loopback only: the stubs' model folder is local, so nothing should be fetched.
    env = {**launch.env, "HF_HUB_OFFLINE": "1"}
    router_url = f"{rtopo.router_url}/v1/completions"
    direct_url = f"{topo.engine('decode-0').http_url}/v1/completions"
    proc = None
    try:
        proc = await sup.spawn(f"router-{tag}", launch.argv, env=env, ready_prefix=launch.ready_prefix,
                               ready_timeout_s=ROUTER_READY_TIMEOUT_S)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            await wait_router_serving(adapter, proc, s, rtopo, ROUTER_READY_TIMEOUT_S)
            await wait_routable(s, router_url, ROUTABLE_TIMEOUT_S)
            await paired_latency(s, direct_url, router_url, WARMUP_REQUESTS)
            direct, routed = await paired_latency(s, direct_url, router_url, args.requests)
        ok, errors, elapsed = await drive(router_url, BODY, args.seconds, args.concurrency)
    except Exception as e:  # one router failing must not cost the others' numbers: it is reported
        cell.na = f"failed: {type(e).__name__}: {str(e)[:300]}"
        return cell
    finally:
        if proc is not None:
            await sup.stop(proc, grace_s=ROUTER_STOP_GRACE_S)
    ms = 1e3
    cell.direct_p50_ms, cell.direct_p99_ms = pct(direct, 0.5) * ms, pct(direct, 0.99) * ms
    cell.routed_p50_ms, cell.routed_p99_ms = pct(routed, 0.5) * ms, pct(routed, 0.99) * ms
    cell.added_p50_ms = cell.routed_p50_ms - cell.direct_p50_ms
    cell.added_p99_ms = cell.routed_p99_ms - cell.direct_p99_ms
    cell.ok, cell.errors = ok, errors
    cell.rps = ok / elapsed if ok else None
    if not ok:
        cell.na = f"failed: no request succeeded at saturation ({errors} errors)"
    return cell


# ------------------------------------------------------------------------------------------------- table

COLUMNS = (("added_p50_ms", "added p50 ms", True), ("added_p99_ms", "added p99 ms", True),
           ("rps", "req/s", False))


def ratios(values: Sequence[float | None], lower_is_better: bool) -> list[float | None]:
    """Each value as a multiple of the column's best: >= 1, 1.00 is the fastest (lowest latency, highest
    req/s). None where a value is missing, or for the whole column when its best is not positive (an added
    latency at or below zero is noise, and no multiple of it means anything)."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present:
        return [None] * len(values)
    best = min(present) if lower_is_better else max(present)
    if best <= 0:
        return [None] * len(values)
    out: list[float | None] = []
    for v in values:
        if v is None or not math.isfinite(v) or v <= 0:
            out.append(None)
        else:
            out.append(v / best if lower_is_better else best / v)
    return out


def _fmt(value: float | None, ratio: float | None, digits: int) -> str:
    if value is None:
        return "n/a"
    r = f"x{ratio:.2f}" if ratio is not None else "x-"
    return f"{value:.{digits}f} ({r})"


def format_table(cells: Sequence[Cell]) -> str:
    """One row per (router, transport); n/a cells carry a footnote with the reason."""
    cols = {key: ratios([getattr(c, key) for c in cells], lower) for key, _, lower in COLUMNS}
    header = ["router", "transport", *(title for _, title, _ in COLUMNS)]
    rows: list[list[str]] = []
    notes: list[str] = []
    for i, c in enumerate(cells):
        if c.na is not None:
            notes.append(f"[{len(notes) + 1}] {c.router} {c.transport}: {c.na}")
            mark = f"n/a [{len(notes)}]"
            rows.append([c.router, c.transport, mark, mark, mark])
            continue
        row = [c.router, c.transport]
        for key, _, _ in COLUMNS:
            row.append(_fmt(getattr(c, key), cols[key][i], 1 if key == "rps" else 3))
        if c.errors:
            notes.append(f"[{len(notes) + 1}] {c.router} {c.transport}: {c.errors} errors at saturation")
            row[-1] += f" [{len(notes)}]"
        rows.append(row)
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]

    def line(r: list[str]) -> str:
        left = [r[j].ljust(widths[j]) for j in range(2)]
        right = [r[j].rjust(widths[j]) for j in range(2, len(r))]
        return "  ".join(left + right).rstrip()

    out = [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    return "\n".join(out + notes)


def comparisons(cells: Sequence[Cell], base: str = "reference") -> list[str]:
    """The base router against each other router, per transport: added p50 and req/s, as ratios."""
    out = []
    by = {(c.router, c.transport): c for c in cells}
    for c in cells:
        b = by.get((base, c.transport))
        if c.router == base or b is None:
            continue
        parts = []
        if b.added_p50_ms is not None and c.added_p50_ms is not None:
            r = f"x{b.added_p50_ms / c.added_p50_ms:.2f}" if c.added_p50_ms > 0 else "x-"
            parts.append(f"added p50 {b.added_p50_ms:.3f} vs {c.added_p50_ms:.3f} ms ({r})")
        if b.rps and c.rps:
            parts.append(f"req/s {b.rps:.0f} vs {c.rps:.0f} (x{b.rps / c.rps:.2f})")
        if parts:
            out.append(f"{base} vs {c.router} [{c.transport}]: " + ", ".join(parts))
    return out


# -------------------------------------------------------------------------------------------------- main


def default_routers() -> tuple[list[str], list[str]]:
    """`reference` and the newest cached release of each gateway (a missing one is noted, not installed:
    installing takes minutes; name a release with --routers to install it)."""
    cache = ReleaseCache()
    specs, notes = ["reference"], []
    for name in ("smg", "vllm-router"):
        versions = cache.cached_versions(GATEWAYS[name])
        if versions:
            specs.append(f"{name}=={versions[0]}")
        else:
            notes.append(f"{name}: no release in {cache.root}; --routers {name}==X.Y.Z installs one")
    return specs, notes


def build_adapters(specs: Sequence[str]) -> list[RouterAdapter]:
    """Adapters as the harness makes them (a named gateway release not yet cached is installed here)."""
    adapters = []
    for spec in specs:
        adapter = make_router_adapter(spec)
        if isinstance(adapter, GatewayAdapter):
            adapter.log_level = GATEWAY_LOG_LEVEL
            # Read the release's flags now, not inside the event loop (a subprocess, up to 30 s).
            adapter.known_flags()
        adapters.append(adapter)
    return adapters


async def run(args: argparse.Namespace, adapters: Sequence[RouterAdapter], log_dir: Path) -> list[Cell]:
    settings = RouterSettings(
        health_interval_s=1.0, health_timeout_s=1.0, failure_threshold=3, success_threshold=1,
        identity_check_interval_s=None, request_timeout_s=REQUEST_TIMEOUT_S, extra_args=REFERENCE_LOG_ARGS,
    )
    scenario = Scenario(name="router_overhead", description="bench", router=settings)
    transports = ["http", "grpc"] if args.transport == "both" else [args.transport]
    topo = allocate("1p1d", "mooncake", "http")
    model_dir = write_model_dir(log_dir / "stub-model")
    cells: list[Cell] = []
    async with ProcessSupervisor(log_dir) as sup:
        for e in topo.engines:
            spec = {"name": e.name, "role": e.role, "http_port": e.http_port, "grpc_port": e.grpc_port,
                    "bootstrap_port": e.bootstrap_port if e.role == "prefill" else None,
                    "model_dir": str(model_dir)}
            await sup.spawn(f"stub-{e.name}", [sys.executable, __file__, "--serve-stub", json.dumps(spec)],
                            ready_prefix=READY_STUBS, ready_timeout_s=ENGINE_READY_TIMEOUT_S)
        direct_url = f"{topo.engine('decode-0').http_url}/v1/completions"
        ok, errors, elapsed = await drive(direct_url, BODY, args.seconds, args.concurrency)
        print(f"direct to the decode stub, no router: {ok / elapsed:.1f} req/s at concurrency "
              f"{args.concurrency} ({errors} errors): the ceiling of this client and one stub", flush=True)
        cells.append(Cell("direct", "http", rps=ok / elapsed if ok else None, ok=ok, errors=errors))
        for transport in transports:
            ttopo = dataclasses.replace(topo, transport=transport)
            for adapter in adapters:
                t0 = time.monotonic()
                cell = await run_cell(sup, adapter, ttopo, settings, scenario, args, log_dir)
                print(f"  {progress(cell)} ({time.monotonic() - t0:.1f} s)", flush=True)
                cells.append(cell)
    return cells


def progress(cell: Cell) -> str:
    if cell.na is not None:
        return f"{cell.router} {cell.transport}: n/a: {cell.na}"
    return (f"{cell.router} {cell.transport}: added p50 {cell.added_p50_ms:.3f} ms, p99 "
            f"{cell.added_p99_ms:.3f} ms, {cell.rps or 0:.1f} req/s")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routers", default=None,
                    help="comma-separated router specs (default: reference and the newest cached smg and "
                         "vllm-router), e.g. reference,smg==1.13.0,vllm-router==0.1.17")
    ap.add_argument("--requests", type=int, default=500, help="sequential direct/routed pairs per cell")
    ap.add_argument("--seconds", type=float, default=10.0, help="closed-loop load per cell")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--transport", choices=["http", "grpc", "both"], default="both")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here as JSON")
    ap.add_argument("--log-dir", type=Path, default=None, help="processes' logs (default: a fresh temp dir)")
    ap.add_argument("--serve-stub", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.requests < 1 or args.seconds <= 0 or args.concurrency < 1:
        ap.error("--requests, --seconds and --concurrency must be positive")
    return args


def report(cells: Sequence[Cell], args: argparse.Namespace, total_s: float) -> dict[str, Any]:
    table_cells = [c for c in cells if c.router != "direct"]
    cols = {key: ratios([getattr(c, key) for c in table_cells], lower) for key, _, lower in COLUMNS}
    rows = []
    for i, c in enumerate(table_cells):
        d = dataclasses.asdict(c)
        d.update({f"ratio_{key}": cols[key][i] for key, _, _ in COLUMNS})
        rows.append(d)
    direct = next((c for c in cells if c.router == "direct"), None)
    return {
        "engines": "reference_router stub engines (plus owned_by vllm, a local model_path), 1p1d mooncake, "
                   "one process per engine",
        "ratios": "N times the fastest in the column (lowest added latency, highest req/s); null: none",
        "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
        "requests": args.requests, "seconds": args.seconds, "concurrency": args.concurrency,
        "direct_rps": direct.rps if direct else None, "cells": rows,
        "comparisons": comparisons(table_cells), "total_s": total_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_stub:
        asyncio.run(serve_stub(json.loads(args.serve_stub)))
        return 0
    t0 = time.monotonic()
    if args.routers:
        specs, notes = [s.strip() for s in args.routers.split(",") if s.strip()], []
    else:
        specs, notes = default_routers()
    for n in notes:
        print(f"note: {n}", flush=True)
    try:
        adapters = build_adapters(specs)
    except RouterAdapterError as e:  # an unknown spec, or a release that would not install
        print(f"router_overhead: {e}", file=sys.stderr)
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="pdchaos-router-overhead-"))
    print(f"routers: {', '.join(a.name for a in adapters)}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}; logs in {log_dir}", flush=True)
    cells = asyncio.run(run(args, adapters, log_dir))
    total = time.monotonic() - t0
    table_cells = [c for c in cells if c.router != "direct"]
    print()
    print(f"Router overhead: 1p1d Mooncake stub engines, {args.requests} sequential pairs, closed loop of "
          f"{args.concurrency} for {args.seconds:g} s per cell; (xN) = N times the fastest in the column")
    print(format_table(table_cells))
    for line in comparisons(table_cells):
        print(line)
    print(f"total {total:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(report(cells, args, total), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
