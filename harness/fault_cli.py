"""`pdchaos fault ENGINE ACTION`: apply a fault to an engine started through the vLLM shim (`pdchaos engines
shim`), found in the engines registry. One line adds an outage to someone else's test; the engine logs the
fault and keeps its handoff records (the registry names the file)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from fake_engines import registry
from fake_engines.control_client import ControlError, EngineControlClient
from harness.usage_parser import EXIT_USAGE, UsageParser
from pdchaos.argtypes import non_negative

EXIT_OK, EXIT_FAILED = 0, 1
SURFACES = ("all", "health", "metadata", "server_info", "generate", "side_channel")


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="pdchaos fault",
        description="Apply a fault to an engine started through the vLLM shim (see `pdchaos engines shim`): "
        "it is found by name in the engines registry ($PDCHAOS_ENGINES_REGISTRY, else ~/.cache/pdchaos/"
        "engines.json). The answer is what changed, as JSON. `pdchaos fault --list` lists the engines.",
        epilog="actions:\n"
        "  restart [--down-s S] [--new-id | --same-id | --engine-id ID]\n"
        "                                           restart on the same ports, by default with a new engine\n"
        "                                           id (vLLM #2491: a Mooncake prefill back with a new id)\n"
        "  slow-start --refuse-s S                  restart whose listeners refuse connections for S s\n"
        "  crash                                    SIGKILL (the engine stays down)\n"
        "  die [--exit-after-s S]                   health turns unhealthy, the process exits S s later\n"
        "  wedge SURFACE                            accept and never answer on SURFACE\n"
        "  slow SURFACE --ms N                      add N ms before answering on SURFACE (side_channel:\n"
        "                                           a slow KV side channel)\n"
        "surfaces: " + ", ".join(SURFACES) + "\n"
        "  fail-requests --count N [--status 500]   the next N generate requests fail\n"
        "  no-engine-id | fail-server-info          protocol faults (see pdchaos-engine --help)\n"
        "  heal [KIND]                              clear one fault kind (wedge, latency, ...) or all\n"
        "exit codes: 0 applied, 1 the engine refused or is unreachable, 3 usage (unknown engine, bad action)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("engine", nargs="?", metavar="ENGINE", help="the engine's name (e.g. prefill-0)")
    p.add_argument("action", nargs="?", metavar="ACTION", help="see below")
    p.add_argument("arg", nargs="?", metavar="ARG", help="the surface (wedge, slow) or fault kind (heal)")
    p.add_argument("--list", action="store_true", help="list the registered engines and exit")
    p.add_argument("--down-s", type=non_negative, default=0.0, metavar="S")
    ident = p.add_mutually_exclusive_group()
    ident.add_argument("--new-id", action="store_true", help="restart: with a new engine id (the default)")
    ident.add_argument("--same-id", action="store_true", help="restart: keeping the engine id")
    ident.add_argument("--engine-id", default=None, metavar="ID", help="restart: with this engine id")
    p.add_argument("--refuse-s", type=non_negative, default=None, metavar="S")
    p.add_argument("--exit-after-s", type=non_negative, default=5.0, metavar="S")
    p.add_argument("--ms", type=int, default=None, metavar="N")
    p.add_argument("--count", type=int, default=None, metavar="N")
    p.add_argument("--status", type=int, default=500, metavar="CODE")
    return p


class FaultUsage(ValueError):
    pass


async def apply(client: EngineControlClient, args: argparse.Namespace) -> Any:
    a, arg = args.action, args.arg
    if a == "restart":
        engine_id = args.engine_id
        if args.same_id:
            engine_id = (await client.state())["engine_id"]
        return await client.restart(args.down_s, engine_id)
    if a == "slow-start":
        if args.refuse_s is None:
            raise FaultUsage("slow-start needs --refuse-s S")
        return await client.slow_start(args.refuse_s)
    if a == "crash":
        return await client.crash()
    if a == "die":
        return await client.die(args.exit_after_s)
    if a in ("wedge", "slow"):
        if arg not in SURFACES:
            raise FaultUsage(f"{a} needs a surface: one of {', '.join(SURFACES)}")
        if a == "wedge":
            return await client.fault("wedge", surface=arg)
        if args.ms is None or args.ms < 0:
            raise FaultUsage("slow needs --ms N (N >= 0)")
        return await client.fault("latency", surface=arg, ms=args.ms)
    if a == "fail-requests":
        if args.count is None or args.count < 1:
            raise FaultUsage("fail-requests needs --count N (N >= 1)")
        return await client.fault("fail_requests", count=args.count, status=args.status)
    if a in ("no-engine-id", "fail-server-info"):
        return await client.fault(a.replace("-", "_"))
    if a == "heal":
        return await (client.clear_fault(arg) if arg else client.clear())
    raise FaultUsage(f"unknown action {a!r} (see pdchaos fault --help)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    engines = registry.engines()
    if args.list:
        for name, e in sorted(engines.items()):
            print(f"{name}  {e['role']}  {e['connector']}  {e['host']}:{e['port']}  pid {e['pid']}  records "
                  f"{e['records']}")
        if not engines:
            print(f"no engine registered in {registry.path()}", file=sys.stderr)
        return EXIT_OK
    if not args.engine or not args.action:
        print("pdchaos: error: give ENGINE and ACTION (or --list)", file=sys.stderr)
        return EXIT_USAGE
    if args.engine not in engines:
        known = ", ".join(sorted(engines)) or "none"
        print(f"pdchaos: error: no engine {args.engine!r} in {registry.path()} (registered: {known})",
              file=sys.stderr)
        return EXIT_USAGE
    e = engines[args.engine]
    client = EngineControlClient(f"http://{e['host']}:{e['control_port']}", token=e["control_token"])
    try:
        answer = asyncio.run(apply(client, args))
    except FaultUsage as exc:
        print(f"pdchaos: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ControlError, OSError) as exc:
        print(f"pdchaos: fault: {args.engine}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(answer.get("changed", answer) if isinstance(answer, dict) else answer, sort_keys=True))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
