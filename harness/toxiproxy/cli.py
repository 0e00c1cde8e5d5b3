"""`pdchaos-toxiproxy`: run the embedded Toxiproxy-compatible server (like toxiproxy-server)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from harness.toxiproxy.registry import LOOPBACK
from harness.toxiproxy.server import DEFAULT_PORT, EmbeddedToxiproxy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pdchaos-toxiproxy", description=__doc__)
    # The single-dash spellings are toxiproxy-server's, so scripts written for it work unchanged.
    parser.add_argument("--host", "-host", default=LOOPBACK,
                        help=f"API address: a loopback address (default {LOOPBACK})")
    parser.add_argument("--port", "-port", type=int, default=DEFAULT_PORT, help="API port (0 = any free)")
    parser.add_argument("--seed", "-seed", type=int, default=0, help="seed for toxicity and jitter draws")
    parser.add_argument("--config", "-config", type=Path, help="JSON list of proxies to create at start")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> int:
    server = EmbeddedToxiproxy(args.host, args.port, args.seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        if args.config is not None:
            try:
                proxies = json.loads(args.config.read_text(encoding="utf-8"))
            except ValueError as e:  # not JSON, or not UTF-8 text
                raise ValueError(f"--config {args.config}: not a JSON list of proxies ({e})") from None
            await server.service.populate(proxies)
        # One machine-readable line, like the other pdchaos servers, so a parent knows the port.
        print("PDCHAOS_TOXIPROXY_READY " + json.dumps({"url": server.url, "port": server.port}), flush=True)
        await stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(_serve(args))
    except (ValueError, OSError) as exc:
        print(f"pdchaos-toxiproxy: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # an ApiError from --config, reported rather than a traceback
        print(f"pdchaos-toxiproxy: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
