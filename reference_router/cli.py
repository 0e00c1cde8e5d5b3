"""`pdchaos-router`: the reference PD router (the oracle) as a process.

Prints `PDCHAOS_ROUTER_READY {"port": N}` on stdout once it serves; exits cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence

from pdchaos.argtypes import port
from pdchaos.bugs import list_text

from .config import RouterConfig, WorkerArg, initial_specs
from .core.bugs import ROUTER_BUGS
from .server import RouterServer

_DESCRIPTION = """\
Reference prefill/decode (PD) router for vLLM-style engines, with the health and KV engine-id semantics the
pdchaos suite treats as correct. Workers are OpenAI-compatible HTTP engines (http://host:port) or
vllm.grpc.engine.VllmEngine gRPC engines (grpc://host:port). In PD mode every request runs a sanitised prefill
leg first, then the decode leg with the KV handoff parameters (Mooncake: minted by the router from the prefill
engine id in force; NIXL: relayed from the prefill answer). Binds 127.0.0.1 only.
"""

_EPILOG = """\
examples:
  pdchaos-router --pd-disaggregation --prefill http://127.0.0.1:8100 8998 --decode http://127.0.0.1:8200
  pdchaos-router --pd-disaggregation --prefill grpc://127.0.0.1:50051 --decode grpc://127.0.0.1:50052 \\
      --health-check-interval-secs 0.5 --health-failure-threshold 1 --api-key secret
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdchaos-router",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("serving")
    g.add_argument("--host", default="127.0.0.1", help="address to bind; only 127.0.0.1 is allowed")
    g.add_argument("--port", type=port, default=0, help="port (default 0 = a free one; READY prints it)")
    g.add_argument("--model", default=None, help="served model name; requests naming another model get 404")
    g.add_argument("--api-key", default=None, help="bearer token required by the worker API (/workers)")
    g.add_argument("--events-file", default=None, help="append router events here as JSON lines")
    g.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024,
                   help="largest request body accepted (default 4 MiB; bigger -> 413)")
    g.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                   help="Python logging level (default WARNING)")

    w = p.add_argument_group("workers")
    w.add_argument("--pd-disaggregation", action="store_true",
                   help="prefill/decode mode: it serves once it has workers of both roles, from --prefill/"
                   "--decode or added later through the worker API")
    w.add_argument("--prefill", nargs="+", action="append", default=[], metavar=("URL", "BOOTSTRAP_PORT"),
                   help="prefill worker URL and optional Mooncake bootstrap port (default 8998); repeatable")
    w.add_argument("--decode", action="append", default=[], metavar="URL",
                   help="decode worker URL (repeatable)")
    w.add_argument("--worker-urls", nargs="+", default=[], metavar="URL", help="regular (non-PD) workers")
    w.add_argument("--allow-worker-host", action="append", default=[], metavar="HOST",
                   help="a non-loopback host workers may live on (repeatable); without it, worker URLs "
                        "(flags and the worker API) must be loopback")
    w.add_argument("--connector", choices=["mooncake", "nixl", "none"], default=None,
                   help="KV connector of the PD workers (default: GetServerInfo for gRPC, mooncake for HTTP)")
    w.add_argument("--prefill-policy", default="round_robin",
                   choices=["round_robin", "random", "power_of_two", "least_load"])
    w.add_argument("--decode-policy", default="round_robin",
                   choices=["round_robin", "random", "power_of_two", "least_load"])
    w.add_argument("--request-timeout-secs", type=float, default=600.0,
                   help="deadline of every upstream call of a request (each leg), seconds")

    h = p.add_argument_group("health")
    h.add_argument("--health-check-interval-secs", type=float, default=60.0,
                   help="probe interval (default 60)")
    h.add_argument("--health-check-timeout-secs", type=float, default=5.0,
                   help="per-probe deadline; also bounds each engine-id re-read (default 5)")
    h.add_argument("--health-failure-threshold", type=int, default=3, help="consecutive failures (default 3)")
    h.add_argument("--health-success-threshold", type=int, default=2,
                   help="consecutive successes (default 2)")
    h.add_argument("--max-concurrent-health-checks", type=int, default=128, help="probes in flight at most")
    h.add_argument("--identity-check-interval-secs", type=float, default=30.0,
                   help="how often a Ready Mooncake worker's identity is re-checked although its probes "
                        "pass; bounds how long a restart no probe saw keeps a dead engine id (default 30)")

    b = p.add_argument_group("circuit breaker (off unless --cb-failure-threshold is given)")
    b.add_argument("--cb-failure-threshold", type=int, default=None, metavar="N",
                   help="consecutive own request failures that open a worker's breaker; enables the breaker "
                        "(smg's default is 10)")
    b.add_argument("--cb-timeout-duration-secs", type=float, default=60.0, metavar="S",
                   help="how long an open breaker keeps its worker out before one trial request (default 60)")
    b.add_argument("--disable-circuit-breaker", action="store_true",
                   help="no circuit breaker, whatever --cb-failure-threshold says (the default)")

    t = p.add_argument_group("testing")
    t.add_argument("--seed", type=int, default=None, help="seed for the random/power_of_two policies")
    t.add_argument("--inject-bug", action="append", default=[], metavar="NAME", choices=sorted(ROUTER_BUGS),
                   help="test-only: put a known router bug back (repeatable; see --list-bugs)")
    t.add_argument("--list-bugs", action="store_true",
                   help="list the bug switches (name, zoo entry, where, symptom, reference) and exit")
    return p


def config_from_args(ns: argparse.Namespace) -> RouterConfig:
    prefills: list[WorkerArg] = []
    for entry in ns.prefill:
        if len(entry) > 2:
            raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT], got {entry}")
        port = None
        if len(entry) == 2:
            try:
                port = int(entry[1])
            except ValueError as exc:
                raise ValueError(f"--prefill bootstrap port must be an integer, got {entry[1]!r}") from exc
        prefills.append(WorkerArg(entry[0], port))
    return RouterConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        api_key=ns.api_key,
        events_file=ns.events_file,
        max_body_bytes=ns.max_body_bytes,
        pd=ns.pd_disaggregation,
        prefill=tuple(prefills),
        decode=tuple(ns.decode),
        regular=tuple(ns.worker_urls),
        connector=ns.connector,
        prefill_policy=ns.prefill_policy,
        decode_policy=ns.decode_policy,
        request_timeout_s=ns.request_timeout_secs,
        interval_s=ns.health_check_interval_secs,
        probe_timeout_s=ns.health_check_timeout_secs,
        failure_threshold=ns.health_failure_threshold,
        success_threshold=ns.health_success_threshold,
        max_probes_in_flight=ns.max_concurrent_health_checks,
        identity_check_interval_s=ns.identity_check_interval_secs,
        cb_failure_threshold=None if ns.disable_circuit_breaker else ns.cb_failure_threshold,
        cb_open_s=ns.cb_timeout_duration_secs,
        seed=ns.seed,
        bugs=frozenset(ns.inject_bug),
        allowed_worker_hosts=tuple(ns.allow_worker_host),
    )


async def _serve(cfg: RouterConfig) -> None:
    server = RouterServer(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    port = await server.start()
    try:
        sys.stdout.write("PDCHAOS_ROUTER_READY " + json.dumps({"port": port}) + "\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.list_bugs:
        print(list_text(ROUTER_BUGS.values()))
        return 0
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s router %(levelname)s %(message)s")
    try:
        cfg = config_from_args(ns)
        cfg.validate()
        initial_specs(cfg)
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(_serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
