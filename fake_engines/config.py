"""The `pdchaos-engine` command line that fills an EngineConfig (CONTRACTS.md §1), and its help text.

`EngineConfig` itself is a core value (`fake_engines.core.engine_config`), re-exported here.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from fake_engines.core.bugs import ENGINE_BUGS, engine_bug_names, validate_engine_bugs
from fake_engines.core.engine_config import Connector, EngineConfig, Role
from pdchaos.argtypes import non_negative, port, positive_int
from pdchaos.bugs import list_text

__all__ = [
    "CONNECTOR_NAMES",
    "FAULTS_HELP",
    "KV_ROLES",
    "Connector",
    "EngineConfig",
    "Role",
    "build_parser",
    "config_from_args",
]

CONNECTOR_NAMES = {"mooncake": "MooncakeConnector", "nixl": "NixlConnector", "none": ""}
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}

FAULTS_HELP = """\
faults (control API POST /control/fault {"fault": KIND, ...}, or the Python handle
fake_engines.control.EngineControlClient):
  wedge {"surface": S}       accept connections/requests on surface S and never answer until cleared;
                             S = all | health | metadata | server_info | generate | side_channel
  fail_server_info           GetServerInfo -> UNAVAILABLE while GetModelInfo still answers (partial read)
  no_engine_id               report the engine id as "" (GetServerInfo, bootstrap /query, prefill params)
  fail_requests {"count": N, "status": 500}
                             the next N generate requests (HTTP or gRPC) fail with that status
  latency {"surface": S, "ms": N}
                             add N ms before answering on surface S
process faults (control API):
  POST /control/restart {"down_s": 0, "engine_id": null}
                             in-process restart: same serving ports, new engine id, new side-channel port
  POST /control/slow_start {"refuse_s": S}
                             restart whose listeners refuse connections for S seconds
  POST /control/crash        answer, then SIGKILL itself
  POST /control/die {"exit_after_s": 5}
                             engine death: /health 503, HealthCheck unhealthy, then exit
  DELETE /control/fault/KIND, POST /control/clear
                             heal one fault / all faults (parked wedged requests then get answered)
  GET /control/state, GET /control/records?since=N
                             state json (as in the READY line); handoff provenance records
surfaces: health = GET /health, HealthCheck, grpc.health.v1;
  metadata = /v1/models, /version, /metrics, GetModelInfo, GetServerInfo, GetLoads, GetTokenizer;
  server_info = GetServerInfo only; generate = /v1/completions, /v1/chat/completions, Generate, Abort;
  side_channel = Mooncake bootstrap /query and KV pulls, NIXL handshakes and pulls;
  all = every one of them (the control API is never faulted).
Every control call needs "Authorization: Bearer TOKEN" (--control-token, env PDCHAOS_CONTROL_TOKEN, or the
random one printed at start; --control-open for none) and answers
{"ok": true, "changed": {...}, "state": {...}}. A restart starts with no protocol faults, like a new process.
Signals: SIGTERM is a graceful stop (health turns 503, new requests get 503, in-flight requests finish and
the KV decodes have yet to pull stays served, then exit; bounded by the KV abort timeout); SIGINT or a second
SIGTERM stops at once.
Exit status: 0 after SIGTERM/SIGINT, 1 after /control/die, killed by SIGKILL after /control/crash,
2 on bad flags or ports that cannot be bound.
Bug switches (test-only, off by default): --inject-bug NAME puts a known engine bug back; --list-bugs
shows them.
"""


class _ListBugs(argparse.Action):
    """`--list-bugs`: print the engine bug switches and exit 0 (before the required flags are checked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(list_text(ENGINE_BUGS.values()), file=sys.stdout, flush=True)
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdchaos-engine",
        description="Fake vLLM-like engine (HTTP OpenAI surface, gRPC VllmEngine, Mooncake/NIXL KV handoff "
        "emulation, fault controls). Binds a loopback address (127.0.0.1 by default; a pod's address with "
        "--in-pod). Prints 'PDCHAOS_ENGINE_READY {state json}' on "
        "stdout once it serves; exits cleanly on SIGTERM/SIGINT.",
        epilog=FAULTS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", default="engine", help="label used in records and state (default: engine)")
    p.add_argument("--role", required=True, choices=["prefill", "decode", "both"], help="PD role")
    p.add_argument(
        "--connector",
        default="none",
        choices=["mooncake", "nixl", "none"],
        help="KV connector emulated (default: none)",
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="the address the engine binds and tells its peers: a loopback address (127.0.0.0/8; "
                   "default 127.0.0.1), or with --in-pod the pod's own address")
    p.add_argument("--in-pod", action="store_true",
                   help="the engine runs in a pod (a network of its own, e.g. the pdchaos-fake preset on "
                   "Kubernetes): --host may then be the pod's address, reachable from other pods")
    p.add_argument("--http-port", type=port, default=0,
                   help="OpenAI HTTP port (default 0 = off; at least one of --http-port/--grpc-port)")
    p.add_argument("--grpc-port", type=port, default=0, help="gRPC VllmEngine port (0 = off)")
    p.add_argument("--control-port", type=port, default=0, help="control API port (0 = off)")
    p.add_argument(
        "--control-token",
        default=None,
        help="bearer token for the control API (default: env PDCHAOS_CONTROL_TOKEN, else a random one, "
        "printed on stderr at start)",
    )
    p.add_argument(
        "--control-open",
        action="store_true",
        help="serve the control API without a token: anyone on this machine can then restart, crash or "
        "wedge the engine (not with --control-token)",
    )
    p.add_argument(
        "--bootstrap-port",
        type=port,
        default=8998,
        help="Mooncake prefill bootstrap HTTP port serving GET /query (default: 8998)",
    )
    p.add_argument(
        "--nixl-port",
        type=port,
        default=0,
        help="NIXL handshake port, fixed across restarts (default: a free port)",
    )
    p.add_argument(
        "--advertise-side-channel-port",
        type=port,
        default=0,
        help="prefill: port decodes are told for the KV side channel (bootstrap /query worker_addr, NIXL "
        "remote_port) instead of the bound one, e.g. a proxy in front of it (default: 0 = the bound one)",
    )
    p.add_argument("--engine-id", default=None, help="pin the engine id (default: uuid4 per start)")
    p.add_argument("--dp-size", type=positive_int, default=1, help="data parallel size (default: 1)")
    p.add_argument("--model", default="pdchaos-fake", help="served model name (default: pdchaos-fake)")
    p.add_argument(
        "--transfer-timeout-s",
        type=non_negative,
        default=540.0,
        help="decode waits this long on a dead KV source before timed_out (vLLM: 540)",
    )
    p.add_argument(
        "--kv-abort-timeout-s",
        type=non_negative,
        default=480.0,
        help="prefill holds un-pulled KV this long (default: 480)",
    )
    p.add_argument(
        "--handshake-timeout-s", type=non_negative, default=5.0, help="NIXL handshake timeout (default: 5)"
    )
    p.add_argument(
        "--load-failure-policy",
        default="fail",
        choices=["fail", "recompute"],
        help="on a failed KV load: fail (HTTP 500 / error chunk) or recompute locally (default: fail)",
    )
    p.add_argument(
        "--load-time-s",
        type=non_negative,
        default=0.0,
        help="refuse connections (ports unbound) for S seconds at start: 'loading'",
    )
    p.add_argument(
        "--ttft-ms",
        type=non_negative,
        default=20.0,
        help="time to first token, base ms; +0.05 ms per prompt token (default: 20; 0 = none)",
    )
    p.add_argument("--itl-ms", type=non_negative, default=5.0, help="inter-token latency ms (default: 5)")
    p.add_argument("--seed", type=int, default=None, help="default sampling seed")
    p.add_argument("--records", default=None, help="records JSONL file: handoff provenance and engine calls")
    p.add_argument(
        "--inject-bug",
        action="append",
        default=[],
        metavar="NAME",
        choices=engine_bug_names(),
        help="test-only: put a known engine bug back (repeatable; --list-bugs shows them)",
    )
    p.add_argument("--list-bugs", action=_ListBugs, help="print the engine bug switches and exit")
    p.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="logging level on stderr (default: WARNING)",
    )
    return p


def control_token(parser: argparse.ArgumentParser, a: argparse.Namespace) -> str | None:
    """The control API's token: the flag's, else the environment's, else none with `--control-open`, else a
    random one, printed on stderr (the control API restarts, crashes and wedges the engine: it is never
    open by accident)."""
    given = a.control_token if a.control_token is not None else os.environ.get("PDCHAOS_CONTROL_TOKEN")
    if a.control_open:
        if a.control_token is not None:
            parser.error("--control-open and --control-token exclude each other")
        return None
    if given or not a.control_port:
        return given or None
    token = secrets.token_urlsafe(18)
    print(f"pdchaos-engine: control API token (no --control-token given): {token}", file=sys.stderr,
          flush=True)
    return token


def config_from_args(argv: list[str] | None = None) -> EngineConfig:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.http_port == 0 and a.grpc_port == 0:
        parser.error("at least one of --http-port / --grpc-port must be set")
    host = "127.0.0.1" if a.host == "localhost" else a.host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        parser.error(f"--host must be an IP address, not {a.host!r}")
    if not loopback and not a.in_pod:
        parser.error("--host must be a loopback address (127.0.0.0/8); another address only with --in-pod")
    token = control_token(parser, a)
    bootstrap = a.bootstrap_port if a.connector == "mooncake" and a.role in ("prefill", "both") else 0
    return EngineConfig(
        role=a.role,
        name=a.name,
        connector=a.connector,
        host=host,
        http_port=a.http_port,
        grpc_port=a.grpc_port,
        control_port=a.control_port,
        control_token=token,
        bootstrap_port=bootstrap,
        nixl_port=a.nixl_port,
        advertise_side_channel_port=a.advertise_side_channel_port,
        engine_id=a.engine_id,
        dp_size=a.dp_size,
        model=a.model,
        transfer_timeout_s=a.transfer_timeout_s,
        kv_abort_timeout_s=a.kv_abort_timeout_s,
        handshake_timeout_s=a.handshake_timeout_s,
        load_failure_policy=a.load_failure_policy,
        load_time_s=a.load_time_s,
        ttft_ms=a.ttft_ms,
        itl_ms=a.itl_ms,
        seed=a.seed,
        records=a.records,
        log_level=a.log_level,
        bugs=validate_engine_bugs(a.inject_bug),
    )
