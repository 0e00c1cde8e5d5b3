"""Throughput of one fake engine process (zero timing): non-streaming and streaming requests/s over HTTP.

Usage: python bench/engine_throughput.py [--seconds 8] [--concurrency 32] [--max-tokens 16]
Bounded: the whole run stays under 40 s. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from closed_loop import drive

from pdchaos.ports import free_ports

READY = "PDCHAOS_ENGINE_READY"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="per mode (capped at 15)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    seconds = min(args.seconds, 15.0)
    http_port, grpc_port = free_ports(2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fake_engines.cli",
        "--role",
        "both",
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--ttft-ms",
        "0",
        "--itl-ms",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        if not line.startswith(READY):
            print(f"engine did not start: {line!r}", file=sys.stderr)
            return 1
        state = json.loads(line[len(READY) + 1 :])
        url = f"http://127.0.0.1:{http_port}/v1/completions"
        print(
            f"engine pid {state['pid']} on :{http_port}; {args.concurrency} clients, "
            f"max_tokens {args.max_tokens}, {seconds:.0f} s per mode"
        )
        for mode, stream in (("non-streaming", False), ("streaming", True)):
            body = {"prompt": "[pdchaos:bench:0] measure me", "max_tokens": args.max_tokens, "stream": stream}
            ok, errors, elapsed = await drive(url, body, seconds, args.concurrency)
            print(f"{mode:>14}: {ok / elapsed:8.1f} req/s  ({ok} ok, {errors} errors in {elapsed:.1f} s)")
        return 0
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
