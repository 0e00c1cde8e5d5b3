"""`pdchaos search`: generate fault schedules, run them in simulated time (the reference router or a profile
of it) or in real time (any router `pdchaos run` takes), shrink each failure and write it as a scenario file
(and, in real time, a bug report)."""

from __future__ import annotations

import argparse
import math
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli_args import cell_filters
from harness.jobs import default_jobs, jobs_arg
from harness.routers.profiles import PREFIX as PROFILE_PREFIX
from harness.routers.profiles import ProfileRouter, profile_named
from harness.scenario.presets import PRESET_NAMES
from harness.search import DEFAULT_EXAMPLES, DEFAULT_SHIFTS_S
from harness.suite import out_folder_problem
from harness.usage_parser import UsageParser

if TYPE_CHECKING:
    from harness.routers import RouterAdapter

_SHIFTS = ",".join(f"{x:g}" for x in DEFAULT_SHIFTS_S)

_USAGE = """\
Search for fault schedules that break the router: Hypothesis draws cases (topology 1p1d..8p8d, connector,
transport, settings preset, workload, circuit breaker, and a fault schedule: restarts, crashes, freezes,
engine faults, link cuts, latency, resets, flapping, swizzle-clogs, worker API updates and mistakes, router
pauses; overlapping, repeated and clustered),
runs each in the simulated world and judges it with invariants a correct router keeps under any schedule.
A failure is shrunk by Hypothesis to the smallest case that fails the same checker for the same reason, and
written as a scenario file OUT/found/<checker>-<hash>.py that `pdchaos run` replays (sim, or real time
unless the file says it is simulation only).

Seeds are independent: seed N always draws the same cases (only seed 0 starts with the simplest case, the
others with cases of their own); --jobs runs seeds in parallel processes, --ray
spreads them over a Ray cluster (or a Ray instance started here).
OUT/summary.json (and the terminal) say seeds tried, runs, runs/s, failures, distinct signatures, time to
first failure and shrunk sizes. With --known RUN (what `pdchaos run` of the shipped scenarios wrote for the
same router) each finding is marked known, with the cells of RUN that show the same problem, or new.

In real time (--world real; implied by a gateway or cmd: router) each case runs as `pdchaos run --world real
--settings scaled` runs a scenario, against the router under test; cases the real world cannot carry out
for that router are redrawn. A failure counts only when the case fails the same way twice on that router
and the reference router passes it in real time; the others are set aside and counted. Each finding is also
written as a bug report OUT/found/<checker>-<hash>.md (the router and its settings, the case, the symptom,
the evidence, the reference router's verdict, the replay line). --jobs defaults to 1 there.

Exit status: 0 no failure found; 1 failures found (files in OUT/found); 2 interrupted (a partial summary:
unknown); 3 bad arguments.

examples:
  pdchaos search --inject-bug stale_engine_id --budget 60
  pdchaos search --budget 300 --jobs 2                     # the reference router as it is: expect nothing
  pdchaos search --inject-bug stale_engine_id --ray auto   # on the Ray cluster this machine belongs to
  pdchaos search --router smg==1.13.0 --budget 1800        # a gateway release, in real time
  pdchaos search --router smg==1.13.0 --known runs/smg-suite # new findings apart from the suite's
  pdchaos search --world real --inject-bug stale_engine_id --budget 60 --stop-at-first
  pdchaos run runs/search-.../found/handoff-0123abcd.py --world sim --settings scaled --seed 0
"""

SETTINGS_CHOICES = (*PRESET_NAMES, "any")


class UsageError(ValueError):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="pdchaos search", description=_USAGE,
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    parents=[cell_filters("none")])
    p.add_argument("--router", default="reference",
                   help="reference (default), profile:NAME (simulated time only), or in real time any router "
                   "`pdchaos run --router` takes: smg[==X.Y.Z], vllm-router[==X.Y.Z], cmd:<template>")
    p.add_argument("--world", choices=("sim", "real"), default=None,
                   help="sim: simulated time (the reference router or a profile); real: processes on "
                   "loopback in real time at scaled settings (default: sim for reference and profile:NAME, "
                   "real for any other router)")
    p.add_argument("--inject-bug", action="append", default=[], metavar="BUG",
                   help="put a known bug back (repeatable; `pdchaos zoo --list` lists them)")
    p.add_argument("--budget", default="60", metavar="SECONDS",
                   help="wall seconds for generating cases (default 60); a failure found in time is still "
                   "shrunk for up to --shrink-budget more")
    p.add_argument("--shrink-budget", default="60", metavar="SECONDS",
                   help="wall seconds a seed may spend shrinking after the budget (default 60)")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="at most N seeds (default: as many as the budget allows)")
    p.add_argument("--first-seed", type=int, default=0, metavar="S", help="seeds S, S+1, ... (default 0)")
    p.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, metavar="N",
                   help=f"cases generated per seed before the next seed (default {DEFAULT_EXAMPLES}: many "
                   "short seeds draw "
                   "more varied cases than a few long ones, whose later cases vary the earlier ones)")
    p.add_argument("--shifts", default=None, metavar="S,...",
                   help="a failure counts only if the case also fails the same way with its fault schedule "
                   f"shifted later by each of these seconds (default {_SHIFTS}: fractions of a probe "
                   "interval, "
                   "the phase real time does not keep); 'none' counts every failure. Simulated time only: "
                   "in real time a failure counts when it replays")
    p.add_argument("--jobs", type=jobs_arg, default=None, metavar="N",
                   help="seeds searched at once, in worker processes (default: one per CPU, at most 8; in "
                   "real time 1; with --ray on a cluster: the cluster's CPUs)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the seeds as Ray tasks (needs pdchaos[ray]): 'local' starts Ray on this "
                   "machine, 'auto' joins the cluster this machine is part of, ray://HOST:PORT reaches one "
                   "through Ray Client (the project's code is shipped to it); found cases come back here")
    p.add_argument("--settings", choices=SETTINGS_CHOICES, default="scaled",
                   help="settings preset the cases run at: scaled (default; what real time replays, and "
                   "the only one it runs), production, or any (drawn per case)")
    p.add_argument("--max-side", type=int, default=8, metavar="N",
                   help="at most N prefills and N decodes (default 8: up to 8p8d)")
    p.add_argument("--stop-at-first", action="store_true",
                   help="stop generating once a failure is found (it is still shrunk, for up to "
                   "--shrink-budget from then): time to first failure without spending the whole budget")
    p.add_argument("--known", type=Path, metavar="RUN",
                   help="a `pdchaos run` (or sweep) folder of the shipped scenarios against the same router: "
                   "each finding is marked known (with the cells of RUN that show the same problem) or "
                   "new, and the summary counts the new ones")
    p.add_argument("--skip-known", action="store_true",
                   help="with --known: while searching, pass by a case whose every failure RUN already shows "
                   "(not replayed, not shrunk; counted), so the budget goes to new findings. A release with "
                   "a bug most cases trip otherwise spends every seed finding that one again")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: runs/search-<timestamp-id>")
    return p


def _known(folder: Path | None) -> dict[str, list[str]] | None:
    """--known: what the run's findings show, by signature (None without the flag)."""
    if folder is None:
        return None
    from harness.findings.delta import cells_by_signature, findings_of_folder

    try:
        return cells_by_signature(findings_of_folder(folder))
    except ValueError as e:
        raise UsageError(f"--known {folder}: {e}; give the folder `pdchaos run` wrote (it holds "
                         "report.json)") from None


def _seconds(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} takes a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{flag} must be a positive number of seconds, got {text!r}")
    return value


def _shifts(text: str) -> tuple[float, ...]:
    if text.strip().lower() == "none":
        return ()
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise UsageError(f"--shifts takes seconds separated by commas or 'none', not {text!r}") from None
        if not math.isfinite(value) or not 0 < value <= 5:
            raise UsageError(f"--shifts: each shift must be within (0, 5] seconds, got {part.strip()!r}")
        out.append(value)
    return tuple(dict.fromkeys(out))


def _options(args: argparse.Namespace) -> object:
    from harness.scenario.bugs import INJECTABLE_BUGS, absent_bug, unknown_bugs
    from harness.search.bias import space_for
    from harness.search.driver import SearchOptions

    bad = unknown_bugs(args.inject_bug)
    if bad:
        raise UsageError(f"unknown bug {', '.join(bad)} (known: {', '.join(INJECTABLE_BUGS)})")
    budget = _seconds(args.budget, "--budget")
    shrink = _seconds(args.shrink_budget, "--shrink-budget")
    if args.seeds is not None and args.seeds < 1:
        raise UsageError("--seeds must be at least 1")
    if args.skip_known and args.known is None:
        raise UsageError("--skip-known needs --known RUN: the run whose findings it passes by")
    if args.first_seed < 0:
        raise UsageError("--first-seed must be >= 0")
    if args.examples < 1:
        raise UsageError("--examples must be at least 1")
    world = search_world(args.router, args.world)
    if world == "real":
        _real_only_problems(args)
    shifts = _shifts(args.shifts or _SHIFTS)
    if not 1 <= args.max_side <= 8:
        raise UsageError("--max-side must be within 1..8")
    bugs = tuple(dict.fromkeys(args.inject_bug))
    adapter: RouterAdapter | None = None
    if world == "sim":
        router = _sim_router(args.router)
    else:
        router, adapter = _real_router(args.router, bugs)
    out = args.out or Path("runs") / ("search-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-"
                                      + uuid.uuid4().hex[:6])
    problem = out_folder_problem(out, "search folder")
    if problem:
        raise UsageError(problem)
    ray = None
    if args.ray is not None:
        from harness.search.executors import parse_ray_address

        try:
            ray = parse_ray_address(args.ray)
        except ValueError as e:
            raise UsageError(str(e)) from None
    presets = PRESET_NAMES if args.settings == "any" else (args.settings,)
    transport = (_profile_transport(router, args.transport) if adapter is None
                 else _gateway_transport(adapter, args.transport, args.connector))
    space = space_for(bugs, max_side=args.max_side, presets=presets, connector=args.connector,
                      transport=transport)
    if adapter is not None:
        from harness.search.realtime import real_space

        space = real_space(space, adapter)
    absent = absent_bug(args.inject_bug, [(c, t) for c in space.connectors for t in space.transports],
                        "cells searched")
    if absent is not None:
        raise UsageError(absent)
    jobs = args.jobs or (1 if world == "real" else default_jobs())
    return SearchOptions(out=out, bugs=bugs, router=router, budget_s=budget, shrink_s=shrink,
                         seeds=args.seeds, first_seed=args.first_seed, jobs=jobs, examples=args.examples,
                         space=space,
                         settings_label=args.settings, stop_at_first=args.stop_at_first, shifts=shifts,
                         ray=ray, jobs_from_cluster=ray not in (None, "local") and args.jobs is None,
                         world=world, known=_known(args.known),
                         known_from=None if args.known is None else str(args.known),
                         skip_known=args.skip_known)


def _sim_capable(router: str) -> bool:
    return router in ("reference", "", "pdchaos-router") or router.startswith(PROFILE_PREFIX)


def search_world(router: str, world: str | None) -> str:
    """The world searched: as asked, else sim for the reference router and its profiles and real for any
    other router. A profile is a model of its release for simulated time; a release runs in real time only."""
    if world is None:
        return "sim" if _sim_capable(router) else "real"
    if world == "real" and router.startswith(PROFILE_PREFIX):
        raise UsageError(f"--world real: {router} is a model of its release for simulated time; search the "
                         "release itself in real time (e.g. --router smg==1.13.0)")
    if world == "sim" and not _sim_capable(router):
        raise UsageError(f"--world sim: the simulated world runs the reference router only (or a "
                         f"profile:NAME of it), not {router!r}; search it in real time (--world real)")
    return world


def _real_only_problems(args: argparse.Namespace) -> None:
    """Flags that mean nothing in real time: refused rather than ignored."""
    if args.settings != "scaled":
        raise UsageError(f"--settings {args.settings}: real time runs a case at scaled settings only")
    if args.shifts is not None:
        raise UsageError("--shifts is for simulated time: in real time a failure counts when the case fails "
                         "the same way again and the reference router passes it")
    if args.ray is not None:
        raise UsageError("--ray is for simulated time: a real-time search runs its seeds on this machine")


def _sim_router(spec: str) -> str:
    from harness.runner import sim_router_name
    from harness.scenario import ScenarioError

    try:
        return sim_router_name(spec)
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def _real_router(spec: str, bugs: tuple[str, ...]) -> tuple[str, RouterAdapter]:
    """(the router's spec as a replay names it, its adapter): a gateway release is resolved (installed on
    first use) here, once, so that every seed runs the same release."""
    from harness.routers import CommandRouter, make_router_adapter
    from harness.scenario.bugs import split_bugs

    try:
        adapter = make_router_adapter(spec)
    except ValueError as e:  # RouterAdapterError, a release that cannot be installed, a bad version
        raise UsageError(str(e)) from None
    if isinstance(adapter, CommandRouter) and (problem := adapter.executable_problem()) is not None:
        raise UsageError(problem)
    router_side, _ = split_bugs(bugs)
    if router_side and not adapter.supports_inject_bug:
        raise UsageError(f"--inject-bug {', '.join(router_side)}: a reference-router switch; router "
                         f"{adapter.name!r} cannot take it (engine switches can)")
    return adapter.cli_spec() or spec, adapter


def _gateway_transport(adapter: RouterAdapter, transport: str | None, connector: str | None) -> str | None:
    """The transport to draw: a gateway keeps to those it serves."""
    from harness.routers.gateways.adapters import GatewayAdapter

    if not isinstance(adapter, GatewayAdapter):
        return transport
    if transport is not None and transport not in adapter.transports:
        raise UsageError(f"--transport {transport}: {adapter.transport_reason(transport, connector or '')}")
    return transport


def _profile_transport(router: str, transport: str | None) -> str | None:
    """The transport to draw: a gateway profile keeps to those it models its release over."""
    if not router.startswith(PROFILE_PREFIX):
        return transport
    profile = ProfileRouter(profile_named(router))
    if transport is not None:
        if (problem := profile.transport_problem(transport)) is not None:
            raise UsageError(f"--transport {transport}: {problem}")
        return transport
    transports = profile.profile.transports
    return transports[0] if len(transports) == 1 else None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        opts = _options(args)
    except UsageError as e:
        print(f"pdchaos: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 3
    from harness.search.driver import SearchOptions, run_search

    assert isinstance(opts, SearchOptions)
    from harness.search.executors import ExecutorError

    try:
        summary = run_search(opts)
    except ExecutorError as e:
        print(f"pdchaos: error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:  # before the seeds were under way, or while the summary was written
        print(f"pdchaos: interrupted before the summary was written (failures kept so far: {opts.out}/found)",
              file=sys.stderr)
        return 2
    print(summary.text())
    print(f"pdchaos search: {opts.out / 'summary.json'}", file=sys.stderr)
    if summary.interrupted:
        print("pdchaos: interrupted: partial summary, verdict UNKNOWN", file=sys.stderr)
        return 2
    return 1 if summary.found else 0
