"""`pdchaos bisect SCENARIO --router smg --good X --bad Y`: the first release where the verdict changes."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.cli_args import cell_filters, world_and_settings
from harness.routers.gateways.cache import ReleaseCache
from harness.suite import out_folder_problem
from harness.usage_parser import UsageParser, seed_arg
from harness.worlds.real.processes import mark_processes

EXIT_FOUND, EXIT_NO_PAIR, EXIT_USAGE = 0, 2, 3

_USAGE = """\
Find the first release of a gateway where a scenario's verdict (or one checker's) changes. The releases
between --good and --bad (both included; either may be the newer) come from the package index (pip), each is
installed into the gateway cache on first use, and the scenario's cell runs against the releases a binary
search picks: both ends, then one per halving. The result is the pair of adjacent releases whose verdicts
differ, with the evidence of both runs (the checkers that did not pass, their reasons and evidence), in
bisect.json / bisect.md and on stdout. Each run keeps its folder (report.json, history, logs) under --out.

One cell is run: the first the scenario applies to among --topology/--connector/--transport (each defaults
to the scenario's own list). Real time, scaled settings unless --settings says otherwise.

Exit status: 0 a pair was found; 2 no pair (the verdicts at the ends are the same, or a run gave no verdict:
the output says which and why); 3 bad arguments.

examples:
  pdchaos bisect prefill_restart_mooncake --router smg --good 1.13.0 --bad 1.10.1 --transport grpc
  pdchaos bisect prefill_restart_mooncake --router smg --good 1.13.0 --bad 1.10.1 --transport grpc \\
      --checker handoff --gateway-arg=--disable-circuit-breaker
  pdchaos bisect prefill_link_blip --router smg-flags --good 1.11.0 --bad 1.13.0 --dry-run
"""


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="pdchaos bisect", description=_USAGE,
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    parents=[cell_filters("one"), world_and_settings(None)])
    p.add_argument("scenario", metavar="SCENARIO", help="a scenario name (see `pdchaos list`) or file")
    p.add_argument("--router", default="smg", metavar="GATEWAY",
                   help="the gateway, without a version: smg (default), smg-flags, vllm-router")
    p.add_argument("--good", required=True, metavar="VERSION", help="one end: a release (e.g. 1.13.0)")
    p.add_argument("--bad", required=True, metavar="VERSION", help="the other end (e.g. 1.10.1)")
    p.add_argument("--checker", metavar="NAME",
                   help="judge by this checker's verdict only (one of the scenario's expectations)")
    p.add_argument("--seed", type=seed_arg, default=0, metavar="N", help="workload seed, 0 to 2**32-1")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="runs per release; runs that disagree make the release unknown (default 1)")
    p.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                   help="a gateway flag passed to every release, verbatim (repeatable; write "
                   "--gateway-arg=--disable-circuit-breaker)")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: runs/bisect-<timestamp-id>")
    p.add_argument("--dry-run", action="store_true",
                   help="list the releases and the most runs the search needs, run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    return p


def gateway_of(router: str) -> str:
    """The gateway spec name (`smg`, `smg-flags`, `vllm-router`); UsageError for anything else."""
    from harness.routers.base import RouterAdapterError
    from harness.routers.gateways.spec import parse_router_spec

    try:
        rs = parse_router_spec(router)
    except RouterAdapterError as e:
        raise UsageError(str(e)) from None
    if rs.gateway is None:
        raise UsageError(f"--router {router!r} is not a gateway: bisect runs releases of smg, smg-flags or "
                         "vllm-router")
    if rs.version is not None:
        raise UsageError(f"--router {router!r}: name the gateway only; the releases come from --good/--bad")
    return rs.gateway.spec_name


def check_version(gateway: str, flag: str, version: str) -> str:
    from harness.routers.base import RouterAdapterError
    from harness.routers.gateways.spec import LATEST, parse_router_spec

    try:
        rs = parse_router_spec(f"{gateway}=={version}")
    except RouterAdapterError:
        raise UsageError(f"{flag} {version!r} is not a release version (e.g. 1.13.0)") from None
    if rs.version in (None, LATEST):
        raise UsageError(f"{flag} {version!r}: name a release, not {LATEST!r}")
    return str(rs.version)


def pick_target(args: argparse.Namespace, gateway: str) -> Any:
    """The scenario, its one cell and how it is judged (UsageError when that cannot be)."""
    from harness.bisect.release_run import Target
    from harness.runner import check_cell, expand_matrix
    from harness.scenario import ScenarioError
    from harness.suite import UsageError as SuiteUsageError
    from harness.suite import check_expectations, load_named, split_topologies

    try:
        loaded = load_named([args.scenario])
        topologies = split_topologies([args.topology] if args.topology else None)
        check_expectations(loaded)
    except SuiteUsageError as e:
        raise UsageError(str(e)) from None
    if len(loaded) != 1:
        raise UsageError(f"{args.scenario!r} holds {len(loaded)} scenarios: name one")
    (scenario,) = loaded
    checkers = [x.checker for x in scenario.expect]
    if args.checker is not None and args.checker not in checkers:
        raise UsageError(f"scenario {scenario.name!r} has no checker {args.checker!r} "
                         f"(it has: {', '.join(checkers)})")
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    pairs = expand_matrix([scenario], topologies, [args.connector] if args.connector else None,
                          [args.transport] if args.transport else None)
    if not pairs:
        raise UsageError(f"scenario {scenario.name!r} applies to no cell with the given "
                         "--topology/--connector/--transport")
    _, cell = pairs[0]
    try:
        check_cell(scenario, cell.topology, cell.connector, None, "real")
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    return Target(scenario, cell, gateway, args.checker, args.settings, args.seed, args.repeat,
                  tuple(args.gateway_arg))


def list_releases(cache: ReleaseCache, gateway: str, say: Any) -> list[str]:
    """Releases on the package index; the cached ones when the index cannot be read (said on stderr)."""
    from harness.routers.gateways.cache import GatewayInstallError
    from harness.routers.gateways.spec import GATEWAYS

    gw = GATEWAYS[gateway]
    try:
        return cache.available_versions(gw)
    except GatewayInstallError as e:
        cached = cache.cached_versions(gw)
        say(f"cannot read the package index ({e}); using the {len(cached)} cached release(s)")
        return cached


def main(argv: Sequence[str] | None = None, cache: ReleaseCache | None = None) -> int:
    args = build_parser().parse_args(argv)
    from harness.bisect.release_run import ReleaseRunner
    from harness.bisect.report import render_text, write
    from harness.bisect.search import BisectResult, bisect_releases, max_runs, release_chain

    def say(line: str) -> None:
        if not args.no_progress:
            print(f"pdchaos bisect: {line}", file=sys.stderr, flush=True)

    try:
        gateway = gateway_of(args.router)
        good = check_version(gateway, "--good", args.good)
        bad = check_version(gateway, "--bad", args.bad)
        target = pick_target(args, gateway)
        c = cache if cache is not None else ReleaseCache()
        try:
            chain = release_chain(list_releases(c, gateway, say), good, bad)
        except ValueError as e:
            raise UsageError(str(e)) from None
        out = args.out or Path("runs") / ("bisect-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
                                          + "-" + uuid.uuid4().hex[:6])
        problem = None if args.dry_run else out_folder_problem(out, "bisect folder")
        if problem:
            raise UsageError(problem)
    except UsageError as e:
        print(f"pdchaos: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    meta = {"scenario": target.scenario.name, "cell": target.cell.label, "router": gateway,
            "judged_by": target.judged_by, "checker": target.checker, "good": good, "bad": bad,
            "settings": target.settings or "scaled", "seed": target.seed, "repeat": target.repeat,
            "gateway_args": list(target.gateway_args)}
    if args.dry_run:
        print(f"bisect {meta['scenario']} {meta['cell']} on {gateway}, judged by {meta['judged_by']}")
        print(f"releases {good} (good) .. {bad} (bad): {', '.join(chain)}")
        print(f"at most {max_runs(len(chain))} release(s) to run, {target.repeat} run(s) each")
        return EXIT_FOUND
    say(f"{len(chain)} releases from {good} to {bad}; at most {max_runs(len(chain))} to run; out {out}")
    res = BisectResult(list(chain), [])
    mark_processes(out)
    try:
        asyncio.run(bisect_releases(chain, ReleaseRunner(target, out, c, say), res))
    except KeyboardInterrupt:
        res.pair, res.reason = None, "interrupted: the releases judged so far are below"
        j, md = write(out, res, meta)
        print(render_text(res, meta), end="")
        print(f"pdchaos: interrupted; partial bisect: {j} ({md})", file=sys.stderr)
        return EXIT_NO_PAIR
    j, md = write(out, res, meta)
    print(render_text(res, meta), end="")
    print(f"pdchaos: bisect: {j} ({md})")
    return EXIT_FOUND if res.found else EXIT_NO_PAIR


if __name__ == "__main__":
    sys.exit(main())
