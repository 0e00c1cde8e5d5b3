"""Throughput and added latency of the embedded Toxiproxy (no toxics), against a direct connection.

Runs the proxy as its own process (`python -m harness.toxiproxy.cli`), a sink and an echo server here,
and prints MB/s through the proxy vs direct and the p50/p99 round trip of a small request/response.
Bounded in time: well under 30 s with the defaults.

    python bench/proxy_throughput.py [--seconds 2] [--round-trips 2000]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from harness.toxiproxy.testing import echo_handler, serve_tcp, sink_handler

CHUNK = 64 * 1024
IO_TIMEOUT_S = 10.0


@contextmanager
def proxy_process() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.toxiproxy.cli", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""))
        reader.start()
        reader.join(15)
        if not line or not line[0].startswith("PDCHAOS_TOXIPROXY_READY "):
            raise RuntimeError(f"proxy did not start: {line}")
        yield str(json.loads(line[0].split(" ", 1)[1])["url"])
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def create_proxy(api: str, name: str, upstream_port: int) -> int:
    reply = requests.post(
        f"{api}/proxies", json={"name": name, "upstream": f"127.0.0.1:{upstream_port}"}, timeout=5
    )
    reply.raise_for_status()
    return int(reply.json()["listen"].rsplit(":", 1)[1])


def throughput_mb_s(port: int, seconds: float) -> float:
    payload = b"\x5a" * CHUNK
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S) as sock:
        start = time.perf_counter()
        sent = 0
        while time.perf_counter() - start < seconds:
            sock.sendall(payload)
            sent += len(payload)
        sock.shutdown(socket.SHUT_WR)
        received = int(sock.recv(64))  # the sink answers once it has read everything
        elapsed = time.perf_counter() - start
    if received != sent:
        raise RuntimeError(f"sink got {received} of {sent} bytes")
    return sent / elapsed / 1e6


def round_trips_ms(port: int, count: int, budget_s: float) -> list[float]:
    samples = []
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline = time.perf_counter() + budget_s
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(b"p" * 64)
            got = 0
            while got < 64:
                chunk = sock.recv(64 - got)
                if not chunk:
                    raise RuntimeError("echo closed")
                got += len(chunk)
            samples.append((time.perf_counter() - start) * 1000)
            if time.perf_counter() > deadline:
                break
    return samples


def pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1] if len(samples) > 1 else samples[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput run")
    parser.add_argument("--round-trips", type=int, default=2000)
    args = parser.parse_args(argv)

    with (
        serve_tcp(sink_handler(IO_TIMEOUT_S)) as sink,
        serve_tcp(echo_handler(IO_TIMEOUT_S, nodelay=True)) as echo,
        proxy_process() as api,
    ):
        sink_via = create_proxy(api, "sink", sink)
        echo_via = create_proxy(api, "echo", echo)
        direct_mb = throughput_mb_s(sink, args.seconds)
        proxy_mb = throughput_mb_s(sink_via, args.seconds)
        direct_rtt = round_trips_ms(echo, args.round_trips, budget_s=5)
        proxy_rtt = round_trips_ms(echo_via, args.round_trips, budget_s=5)

    d50, d99 = pct(direct_rtt, 50), pct(direct_rtt, 99)
    p50, p99 = pct(proxy_rtt, 50), pct(proxy_rtt, 99)
    print(f"throughput  direct {direct_mb:8.1f} MB/s   via proxy {proxy_mb:8.1f} MB/s")
    print(f"round trip  direct p50 {d50:.3f} ms p99 {d99:.3f} ms")
    print(f"            proxy  p50 {p50:.3f} ms p99 {p99:.3f} ms")
    print(f"added       p50 {p50 - d50:.3f} ms   p99 {p99 - d99:.3f} ms")
    result = {
        "throughput_mb_s": {"direct": round(direct_mb, 1), "proxy": round(proxy_mb, 1)},
        "rtt_ms": {
            "direct": {"p50": round(d50, 3), "p99": round(d99, 3)},
            "proxy": {"p50": round(p50, 3), "p99": round(p99, 3)},
        },
        "added_ms": {"p50": round(p50 - d50, 3), "p99": round(p99 - d99, 3)},
        "round_trips": {"direct": len(direct_rtt), "proxy": len(proxy_rtt)},
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
