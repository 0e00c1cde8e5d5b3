"""`pdchaos`: run chaos scenarios against a PD router, list them, re-render reports.

Exit codes (every subcommand): 0 pass, 1 fail, 2 unknown (includes an interrupted run), 3 usage or
configuration error. A usage or configuration error prints one line `pdchaos: error: ...` and never a
traceback; only a bug in pdchaos itself shows one.

Interrupts: the first SIGINT, SIGTERM or SIGHUP cancels the run, tears every process down, writes the partial
report (its verdict is unknown) and exits 2. A second one while tearing down SIGKILLs every process group
at once and exits 2 immediately. A SIGKILL cannot be caught: the children die with the harness through
their parent-death signal (see harness.worlds.real.processes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cli_args import cell_filters, repeats, world_and_settings
from harness.jobs import JOBS_HELP, default_jobs, jobs_arg
from harness.suite import (
    UsageError,
    default_suite,
    load_named,
    out_folder_problem,
    select_suite,
)
from harness.text import one_line
from harness.usage_parser import EXIT_USAGE, UsageParser, seed_arg
from pdchaos.argtypes import non_negative

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNKNOWN = 2

RUN_INFO = "run.json"
# After an interrupt, how long the run may take to tear itself down before every group is SIGKILLed.
TEARDOWN_TIMEOUT_S = 20.0
# SIGHUP too: a closed terminal deserves the same clean teardown as Ctrl-C.
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def handled_signals() -> list[signal.Signals]:
    """The signals a run tears down on: a signal ignored when pdchaos started (nohup's SIGHUP, a background
    job's SIGINT) stays ignored."""
    return [sig for sig in HANDLED_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN]


_DESCRIPTION = """\
pdchaos: chaos scenarios for prefill/decode disaggregated LLM serving.

Starts fake vLLM engines (prefill and decode) and a router under test on loopback, drives client load
through the router while a scenario's fault timeline restarts, crashes, wedges or degrades engines, then
judges the recorded history (recovery time, handoff correctness, transfer-timeout hangs, prompt 503s,
lost requests). Results go to a run folder: report.json, junit.xml, report.html, one history.jsonl and
the process logs per scenario cell.

  pdchaos run                       the default suite, reference router, embedded fake engines
  pdchaos run prefill_restart_mooncake --router 'cmd:my-router --port {port} {prefill_args} {decode_args}'
  pdchaos list                      scenarios with their descriptions and the bugs they catch
  pdchaos report runs/latest        re-render the reports of a run folder
"""

_EPILOG = """\
exit codes: 0 pass, 1 fail, 2 unknown (the harness could not tell, or the run was interrupted),
3 usage or configuration error (one line on stderr saying what is wrong).
"""


def command_names() -> list[str]:
    """The `pdchaos` commands, in the order the help lists them."""
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return [name for a in actions for name in a.choices]


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="pdchaos",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=UsageParser)

    run = sub.add_parser(
        "run",
        help="run scenarios and write a report (no scenario named: the default suite)",
        description="Run scenarios, each in every topology/connector/transport cell it applies to, and write "
        "report.json, junit.xml and report.html into the run folder.\nThe terminal ends with the findings: "
        "each distinct problem once, with the cells that show it\n(report.html and report.json list them "
        "first).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[cell_filters(), world_and_settings("real"), repeats()],
    )
    run.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO",
        help="scenario names (see `pdchaos list`) or paths to scenario files (*.py defining SCENARIOS; "
        "FILE.py::NAME runs one of them); none: every scenario tagged 'default'",
    )
    run.add_argument(
        "--router", default="reference", metavar="ROUTER",
        help="'reference' (pdchaos-router, the default); 'profile:NAME', the reference router with a gateway "
        "release's known bugs switched on (the one other router the sim world takes; an unknown NAME lists "
        "them all); 'cmd:<command template>' with placeholders such as {port} {prefill_args} "
        "{decode_args} (see harness/routers/command.py); or a gateway release: smg[==X.Y.Z] (HTTP workers "
        "registered through its worker API), smg-flags[==X.Y.Z] (workers from its flags alone), "
        "smg-operator[==X.Y.Z] (smg with an operator that registers a restarted prefill again), "
        "vllm-router[==X.Y.Z]",
    )
    run.add_argument(
        "--inject-bug", metavar="BUG", action="append", default=[],
        help="put a known bug back for this run (repeatable): a router switch (the reference router only) "
        "or an engine switch (any router); `pdchaos zoo --list` lists them all. The scenarios that guard it "
        "must fail",
    )
    run.add_argument("--engines", default="fake", metavar="BACKEND",
                     help="engine backend: fake (the default), vllm (real vLLM on this machine; `pdchaos "
                     "engines install vllm` first; one cell at a time unless --jobs says otherwise), "
                     "command:FILE (command templates start, kill, pause and resume engines elsewhere; "
                     "see docs/vllm.md) or k8s:FILE (engines as pods on a Kubernetes cluster; the file is a "
                     "sweep's [engines.NAME] table). Cells a backend cannot run are skipped with the reason")
    run.add_argument("--check-determinism", action="store_true",
                     help="sim: run each cell twice and require byte-identical histories")
    run.add_argument("--out", type=Path, metavar="DIR",
                     help="run folder (default: runs/<timestamp-id>; runs/latest points at the newest)")
    run.add_argument("--seed", type=seed_arg, default=0, metavar="N",
                     help="seed for the workload, 0 to 2**32-1 (default 0)")
    run.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    run.add_argument("--jobs", type=jobs_arg, default=None, metavar="N", help=JOBS_HELP)
    run.add_argument("--log-cap-mb", type=non_negative, default=None, metavar="MB",
                     help="real world: cut a router's or engine's log that grows past MB back to its start "
                     "and its latest lines, with a line saying how much was cut (default: "
                     "$PDCHAOS_LOG_CAP_MB, else 256; 0: no cap)")

    lst = sub.add_parser("list", help="list scenarios with their descriptions and bug ids",
                         description="List the scenarios pdchaos knows.")
    lst.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                     help="only these names or files (FILE.py::NAME: one scenario of a file)")
    lst.add_argument("--json", action="store_true", help="machine-readable output")

    rep = sub.add_parser("report", help="re-render the reports of a run folder",
                         description="Re-render junit.xml and report.html of a run folder (report.json "
                         "only when the run wrote none: the run's own is kept); cells whose result was never "
                         "saved are judged from their history.")
    rep.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    rep.add_argument("--recheck", action="store_true",
                     help="judge every history afresh; the new reports go beside the run's own "
                     "(report.recheck.json, junit.recheck.xml, report.recheck.html), which stay as they are")

    sub.add_parser("zoo", help="run the suite once per bug switch: which scenario catches each known bug",
                   description="The bug zoo (see `pdchaos zoo --help`).", add_help=False)
    sub.add_parser("matrix", help="run scenarios against several routers and compare them",
                   description="The router matrix (see `pdchaos matrix --help`).", add_help=False)
    sub.add_parser("fault", help="apply a fault to an engine started through the vLLM shim",
                   description="Engine faults on a running shim engine (see `pdchaos fault --help`).",
                   add_help=False)
    sub.add_parser("incident", help="turn an outage's logs into a scenario and say whether it replays",
                   description="Incident replay (see `pdchaos incident --help`).", add_help=False)
    sub.add_parser("bisect", help="find the first gateway release where a scenario's verdict changes",
                   description="Release bisect (see `pdchaos bisect --help`).", add_help=False)
    sub.add_parser("search", help="search fault schedules in simulated time, shrink failures to scenario "
                   "files",
                   description="Fault search (see `pdchaos search --help`).", add_help=False)
    sub.add_parser("engines", help="install real engine backends (vllm) and show what is installed",
                   description="Engine backends (see `pdchaos engines --help`).", add_help=False)
    sub.add_parser("fidelity", help="probe a fake and a real engine pair alike and print the differences",
                   description="Fake-engine fidelity (see `pdchaos fidelity --help`).", add_help=False)
    sub.add_parser("sweep", help="run a sweep file (scenarios x cells x routers x worlds x engines) and "
                   "compare it with a baseline", description="Sweeps (see `pdchaos sweep --help`).",
                   add_help=False)
    return p


# ---------------------------------------------------------------- scenario selection


def _check_router(spec: str, scenarios: Sequence[Any], named: bool) -> list[Any]:
    """The scenarios this router can run. A scenario that puts a bug back into the reference router
    (`inject_bugs`) cannot run against another router: an error when the user named it, else left out."""
    from harness.routers import CommandRouter, RouterAdapterError, make_router_adapter

    try:
        adapter = make_router_adapter(spec)
    except RouterAdapterError as e:
        raise UsageError(str(e)) from None
    if isinstance(adapter, CommandRouter) and (problem := adapter.executable_problem()) is not None:
        raise UsageError(problem)
    kept = []
    for s in scenarios:
        bug = ", ".join(s.router.inject_bugs)
        if bug and not adapter.supports_inject_bug:
            if named:
                raise UsageError(
                    f"scenario {s.name!r} injects bug {bug!r}, which router {adapter.name!r} cannot take"
                )
            print(f"pdchaos: skipping {s.name}: it injects bug {bug!r} into the reference router",
                  file=sys.stderr)
            continue
        kept.append(s)
    return kept


# ---------------------------------------------------------------- run


def _check_router_bugs(spec: str, bugs: Sequence[str]) -> None:
    """A router switch from the command line goes into the reference router (a profile is one): another
    router cannot take it, whatever the scenarios (engine switches go to the engines, under any router)."""
    from harness.routers import RouterAdapterError, make_router_adapter
    from harness.scenario.bugs import split_bugs

    try:
        router_side, _ = split_bugs(bugs)
        adapter = make_router_adapter(spec)
    except (ValueError, RouterAdapterError):
        return  # said where the bug names and the router are checked
    if router_side and not adapter.supports_inject_bug:
        raise UsageError(f"--inject-bug {', '.join(router_side)}: a reference-router switch; router "
                         f"{adapter.name!r} cannot take it (build the bug into that router, or run "
                         "--router reference or profile:NAME)")


def _with_bugs(bugs: Sequence[str], scenarios: Sequence[Any]) -> list[Any]:
    from harness.scenario.bugs import split_bugs, with_bugs

    try:
        split_bugs(bugs)
    except ValueError as e:
        raise UsageError(f"--inject-bug: {e}") from None
    return [with_bugs(s, bugs) for s in scenarios]


def _check_sim(spec: str, scenarios: Sequence[Any], named: bool) -> list[Any]:
    """The scenarios the simulated world can run (it runs the reference router's core)."""
    from harness.runner import sim_router_name
    from harness.scenario import ScenarioError

    try:
        sim_router_name(spec)
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    return _in_world("sim", scenarios, named)


def _in_world(world: str, scenarios: Sequence[Any], named: bool) -> list[Any]:
    """The scenarios that run in `world` (`Scenario.worlds`): one named that does not is an error, another is
    left out with its reason."""
    what = {"sim": "the simulated world", "real": "real time"}[world]
    kept = []
    for s in scenarios:
        if world in s.worlds:
            kept.append(s)
            continue
        why = s.world_notes.get(world, "")
        if named:
            raise UsageError(f"scenario {s.name!r} does not run in {what}" + (f": {why}" if why else ""))
        print(f"pdchaos: skipping {s.name}: not in {what}" + (f" ({why})" if why else ""), file=sys.stderr)
    return kept


@dataclass
class RunPlan:
    scenarios: list[Any]
    cells: list[tuple[Any, Any]]
    router: str
    out: Path
    seed: int
    world: str = "real"
    settings: str = "scaled"
    check_determinism: bool = False
    jobs: int = 1
    engines: str = "fake"
    repeat: int = 1


def _check_engines(spec: str, world: str, cells: list[tuple[Any, Any]]) -> tuple[str, list[tuple[Any, Any]]]:
    """The engine backend's label and the cells it can run; the others are said and left out."""
    from harness.worlds.real.backends import EngineChoiceError, not_applicable, parse_engines

    try:
        choice = parse_engines(spec)
    except EngineChoiceError as e:
        raise UsageError(str(e)) from None
    if choice.is_fake:
        return choice.label, cells
    if world != "real":
        raise UsageError("--engines: the simulated world simulates its own engines (real time only)")
    if choice.kind == "k8s":
        from harness.worlds.real.kube_engines import cluster_problem

        if (problem := cluster_problem(choice.table)) is not None:
            raise UsageError(f"--engines {choice.label}: {problem}")
    if choice.kind == "vllm":
        from harness.vllm import VllmNotInstalled, find_install

        try:
            find_install()
        except VllmNotInstalled as e:
            raise UsageError(str(e)) from None
    kept = []
    for s, cell in cells:
        why = not_applicable(choice, s, cell.connector, cell.transport)
        if why:
            print(f"pdchaos: skipping {s.name} {cell.topology}/{cell.connector}/{cell.transport}: {why}",
                  file=sys.stderr)
        else:
            kept.append((s, cell))
    if not kept:
        raise UsageError(f"no selected cell can run on --engines {choice.label} (see the reasons above)")
    return choice.label, kept


def _apply_log_cap(mb: float | None) -> None:
    """--log-cap-mb reaches every supervisor of the run, cell workers' included, through the environment;
    a bad $PDCHAOS_LOG_CAP_MB is a usage error now rather than a failure at the first process."""
    from harness.worlds.real.log_cap import LOG_CAP_ENV, MIN_LOG_CAP_MB, log_cap_from_env

    if mb is not None:
        if mb != 0 and not MIN_LOG_CAP_MB <= mb < float("inf"):
            raise UsageError(f"--log-cap-mb {mb:g}: 0 (no cap) or at least {MIN_LOG_CAP_MB} MB")
        os.environ[LOG_CAP_ENV] = f"{mb:g}"
    try:
        log_cap_from_env()
    except ValueError as e:
        raise UsageError(str(e)) from None


def plan_run(args: argparse.Namespace) -> RunPlan:
    """Everything that can be wrong with a run, found before any process starts (UsageError)."""
    from harness.routers.profiles import PREFIX as PROFILE_PREFIX
    from harness.runner import default_settings, expand_matrix
    from harness.scenario.bugs import absent_bug
    from pdchaos.ports import POOL_ENV, pool_from_env

    try:
        pool_from_env(os.environ.get(POOL_ENV))
    except ValueError as e:
        raise UsageError(str(e)) from None
    _apply_log_cap(getattr(args, "log_cap_mb", None))
    topologies, scenarios = select_suite(args)
    if args.inject_bug:
        if args.world == "real":  # in sim any router but the reference one is refused as such below
            _check_router_bugs(args.router, args.inject_bug)
        scenarios = _with_bugs(args.inject_bug, scenarios)
    if args.check_determinism and args.world != "sim":
        raise UsageError("--check-determinism needs --world sim (real time does not replay exactly)")
    if args.world == "sim":
        scenarios = _check_sim(args.router, scenarios, named=bool(args.scenarios))
    else:
        scenarios = _in_world(args.world, _check_router(args.router, scenarios, named=bool(args.scenarios)),
                              named=bool(args.scenarios))
    if not scenarios:
        raise UsageError(f"no scenario of the default suite can run against router {args.router!r}")
    cells = expand_matrix(
        scenarios,
        topologies,
        [args.connector] if args.connector else None,
        [args.transport] if args.transport else None,
    )
    from harness.matrix import drop_skipped  # cells a gateway cannot run: said, not run

    if not cells:
        wanted = ", ".join(
            f"{k} {'/'.join(v) if isinstance(v, list | tuple) else v}"
            for k, v in (("topology", topologies), ("connector", args.connector),
                                    ("transport", args.transport)) if v
        )
        own = "; ".join(f"{s.name} runs on {'/'.join(s.topologies)}, {'/'.join(s.connectors)}, "
                        f"{'/'.join(s.transports)}" for s in scenarios[:3])
        more = f" (and {len(scenarios) - 3} more)" if len(scenarios) > 3 else ""
        raise UsageError(f"no selected scenario applies to {wanted or 'any cell'}: {own}{more}")
    if args.world == "real" or args.router.startswith(PROFILE_PREFIX):  # a profile: its release's transports
        cells = drop_skipped(args.router, cells)
        if not cells:
            raise UsageError(f"router {args.router!r} can run none of the selected cells (reasons above)")
    if args.scenarios:  # a scenario asked for by name that has no cell here is said, not dropped in silence
        running = {s.name for s, _ in cells}
        for s in scenarios:
            if s.name not in running:
                print(f"pdchaos: {s.name}: no cell with the --topology/--connector/--transport given "
                      f"(it runs on {'/'.join(s.topologies)}, {'/'.join(s.connectors)}, "
                      f"{'/'.join(s.transports)}): left out", file=sys.stderr)
    engines, cells = _check_engines(args.engines, args.world, cells)
    absent = absent_bug(args.inject_bug or [], [(cell.connector, cell.transport) for _, cell in cells],
                        "selected cells")
    if absent is not None:
        raise UsageError(absent)
    settings = args.settings or default_settings(args.world)
    _check_at_preset(scenarios, settings)
    out = args.out if args.out is not None else Path("runs") / _run_id()
    problem = out_folder_problem(out, "run folder")
    if problem:
        raise UsageError(problem)
    if args.repeat > 1 and args.world == "sim":
        raise UsageError("--repeat: a simulated run replays exactly from its seed, so its runs cannot split "
                         "(real time only)")
    return RunPlan(scenarios, cells, args.router, out, args.seed, args.world, settings,
                   args.check_determinism, engines=engines, repeat=args.repeat)


def _check_at_preset(scenarios: Sequence[Any], settings: str) -> None:
    """Each scenario as it will run (its times and settings at the preset, overrides applied) is valid: a
    bad `preset_overrides` entry is found now, not in the middle of the suite."""
    from harness.scenario import ScenarioError, apply_preset, preset, validate

    for s in scenarios:
        try:
            validate(apply_preset(s, preset(settings)))
        except (ScenarioError, TypeError, ValueError) as e:
            raise UsageError(f"at --settings {settings}: {e}") from None


def _run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def _write_run_info(plan: RunPlan, marker: str, argv: Sequence[str], **end: Any) -> None:
    """run.json: written at the start (who runs what, the marker), rewritten at the end with `end` fields."""
    info = {
        "pid": os.getpid(),
        "marker": marker,
        "argv": list(argv),
        "started_at": time.time(),
        "router": plan.router,
        "seed": plan.seed,
        "world": plan.world,
        "settings": plan.settings,
        "engines": plan.engines,
        "cells": [
            {"scenario": s.name, "topology": c.topology, "connector": c.connector, "transport": c.transport}
            for s, c in plan.cells
        ],
        **end,
    }
    (plan.out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _kill_everything() -> None:
    from harness.worlds.real import processes as procs

    procs._kill_all_live()


async def _run_async(plan: RunPlan, show_progress: bool) -> tuple[list[Any], bool]:
    """(results, interrupted). Installs the SIGINT/SIGTERM handlers for the run's lifetime."""
    from harness.parallel import run_suite
    from harness.progress import ProgressReporter

    loop = asyncio.get_running_loop()
    progress = ProgressReporter(plan.out, total=len(plan.cells) * plan.repeat) if show_progress else None
    suite = asyncio.create_task(
        run_suite(plan.scenarios, plan.cells, plan.out, router=plan.router, seed=plan.seed, progress=progress,
                  world=plan.world, settings=plan.settings, check_determinism=plan.check_determinism,
                  jobs=plan.jobs, engines=plan.engines, repeat=plan.repeat, report_parts=True)
    )
    caught: list[int] = []
    signalled = asyncio.Event()

    def on_signal(sig: int) -> None:
        if caught:
            # Second signal: the user wants out now. No orphan either way: SIGKILL every group, then leave.
            _kill_everything()
            os._exit(EXIT_UNKNOWN)
        caught.append(sig)
        print(f"\npdchaos: {signal.Signals(sig).name}: stopping, tearing down, writing a partial report "
              "(again to kill at once)", file=sys.stderr, flush=True)
        suite.cancel()
        signalled.set()

    handled = handled_signals()
    for sig in handled:
        loop.add_signal_handler(sig, on_signal, sig)
    if progress is not None:
        progress.start()
    results: list[Any] = []
    waiter = asyncio.create_task(signalled.wait())
    try:
        await asyncio.wait({suite, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if caught:
            done, _ = await asyncio.wait({suite}, timeout=TEARDOWN_TIMEOUT_S)
            if not done:
                print("pdchaos: teardown too slow, killing every process", file=sys.stderr, flush=True)
                _kill_everything()
                await asyncio.wait({suite}, timeout=5.0)
            if suite.done() and not suite.cancelled() and suite.exception() is None:
                results = suite.result()
        else:
            results = suite.result()
    finally:
        waiter.cancel()
        if not suite.done():
            suite.cancel()
        if progress is not None:
            await progress.stop()
        for sig in handled:
            loop.remove_signal_handler(sig)
    return results, bool(caught)


def _summary_lines(results: Sequence[Any], run_dir: Path, html: Path | None = None) -> list[str]:
    from harness.findings import compute_findings
    from harness.text import clip
    from reports import summarize
    from reports.findings import findings_lines

    lines = []
    for r in results:
        cell = "/".join(x for x in (r.topology, r.connector, r.transport) if x)
        why = (getattr(r, "reason", "") or r.overall.reason) if r.status != "pass" else ""
        reason = f"  {clip(why, 158)}" if why else ""
        lines.append(f"  {r.status.upper():8} {r.scenario} {cell}{reason}")
        if r.status != "pass" and getattr(r, "replay", ""):
            lines.append(f"           replay: {r.replay}")
    s = summarize(list(results))
    races = f", {s['race']} race" if s.get("race") else ""
    lines.append(
        f"pdchaos: {_count(s['total'], 'cell')}: {s['pass']} pass, {s['fail']} fail, {s['unknown']} unknown"
        f"{races} -> {s['status'].upper()}; report: {html or run_dir / 'report.html'}"
    )
    return lines + findings_lines(compute_findings(list(results)))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from harness.races import exit_code, fold_repeats
    from harness.worlds.real.processes import mark_processes
    from reports import report_from_run_dir, summarize, write_reports

    plan = plan_run(args)
    # Real vLLM engines take a core and about 2.5 GB each: one cell at a time unless asked.
    plan.jobs = args.jobs or (default_jobs(real_time=plan.world == "real") if plan.engines == "fake" else 1)
    try:
        plan.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create run folder {plan.out}: {e.strerror or e}") from None
    marker = mark_processes(plan.out)
    _write_run_info(plan, marker, argv)
    started = time.time()
    times = f", {plan.repeat} runs each" if plan.repeat > 1 else ""
    print(f"pdchaos: {_count(len(plan.cells), 'cell')} from {_count(len(plan.scenarios), 'scenario')}{times} "
          f"-> {plan.out}",
          file=sys.stderr, flush=True)
    show = not args.no_progress
    results, interrupted = asyncio.run(_run_async(plan, show))
    if interrupted:
        results = report_from_run_dir(plan.out)
        code = EXIT_UNKNOWN
    else:
        results = fold_repeats(results, plan.repeat)
        write_reports(results, plan.out)
        code = exit_code(summarize(list(results))["status"], args.fail_on)
    try:
        for line in _summary_lines(results, plan.out):
            print(line, flush=True)
    except BrokenPipeError:
        _drop_stdout()  # the exit status still tells the verdict
    if interrupted:
        print(f"pdchaos: interrupted: partial report of the {len(results)} of {len(plan.cells)} cells that "
              "started, verdict UNKNOWN", file=sys.stderr)
    _write_run_info(plan, marker, argv, started_at=started, ended_at=time.time(), interrupted=interrupted,
                    exit_code=code)
    return code


def _checks(s: Any) -> list[str]:
    """The checkers a scenario's run applies (none named: the default checks)."""
    from harness.checkers import DEFAULT_CHECKS

    return [x.checker for x in s.expect] or list(DEFAULT_CHECKS)


def cmd_list(args: argparse.Namespace) -> int:
    scenarios = load_named(args.scenarios)
    # What `pdchaos run` runs with no scenario named: the shipped default suite, whatever is listed here.
    defaults = {s.name for s in default_suite(load_named([]))}
    if args.json:
        out = [
            {
                "name": s.name,
                "description": s.description,
                "bugs": list(s.bugs),
                "default": s.name in defaults,
                "topologies": list(s.topologies),
                "connectors": list(s.connectors),
                "transports": list(s.transports),
                "tags": list(s.tags),
                "worlds": list(s.worlds),
                "suite_worlds": [w for w in s.suite_worlds if w in s.worlds],
                "world_notes": dict(s.world_notes),
                "checks": _checks(s),
                "catches": list(s.catches),
            }
            for s in scenarios
        ]
        print(json.dumps(out, indent=2))
        return EXIT_PASS
    for s in scenarios:
        flag = "*" if s.name in defaults else " "
        bugs = ", ".join(s.bugs) if s.bugs else "-"
        suite = [w for w in s.suite_worlds if w in s.worlds]
        narrower = s.name in defaults and suite != list(s.worlds)
        only = f"; default suite: {'/'.join(suite)} only" if narrower else ""
        print(f"{flag} {s.name}  [{' '.join(s.topologies)}; {'/'.join(s.connectors)}; "
              f"{'/'.join(s.transports)}; worlds: {'/'.join(s.worlds)}{only}]  bugs: {bugs}")
        print(f"    {s.description}")
        print(f"    checks: {', '.join(_checks(s))}; "
              f"fails under --inject-bug: {', '.join(s.catches) or '-'}")
        for world, note in sorted(s.world_notes.items()):
            print(f"    ({world}: {note})")
    print("(* = in the default suite, what `pdchaos run` runs with no scenario named)")
    return EXIT_PASS


def cmd_report(args: argparse.Namespace) -> int:
    from harness.races import exit_code
    from harness.run_folder import find_histories
    from reports import rerender, summarize

    if not args.run_dir.is_dir():
        what = "is a file, not a run folder" if args.run_dir.exists() else "does not exist"
        raise UsageError(f"no run folder: {args.run_dir} {what}")
    _refuse_a_folder_of_runs(args.run_dir)
    if not (args.run_dir / "report.json").is_file() and not find_histories(args.run_dir):
        raise UsageError(f"{args.run_dir} holds no scenario results or histories")  # nothing written there
    results, written = rerender(args.run_dir, recheck=args.recheck)
    if not results:
        raise UsageError(f"{args.run_dir} holds no scenario results or histories")
    for line in _summary_lines(results, args.run_dir, written.get("html")):
        print(line)
    return exit_code(summarize(list(results))["status"])


def _refuse_a_folder_of_runs(folder: Path) -> None:
    """`pdchaos report runs` would judge every run below as one and write its report among them: a folder
    that is no run's own but holds runs is refused, with the runs it holds."""
    from harness.run_folder import is_run_folder, run_folders_in

    if is_run_folder(folder):
        return
    # Folders of the other commands: each has its own report.
    if (folder / "plan.json").is_file() and (folder / "cells").is_dir():
        raise UsageError(f"{folder} is a zoo folder: its matrix is `pdchaos zoo --rejudge {folder}`")
    if (folder / "summary.json").is_file() and (folder / "work").is_dir():
        raise UsageError(f"{folder} is a search folder: summary.json is its report, and each file under "
                         f"{folder / 'found'} replays with `pdchaos run`")
    inside = run_folders_in(folder)
    if inside:
        more = f" and {len(inside) - 3} more" if len(inside) > 3 else ""
        shown = ", ".join(str(p) for p in inside[:3]) + more
        raise UsageError(f"{folder} is not a run folder but holds {len(inside)} of them ({shown}): name one")


# The commands with parsers of their own, and the module whose `main` takes their arguments.
_OWN_PARSERS = {
    "zoo": "harness.zoo.cli",
    "matrix": "harness.matrix",
    "bisect": "harness.bisect.cli",
    "fault": "harness.fault_cli",
    "incident": "harness.incident.cli",
    "engines": "harness.vllm.cli",
    "fidelity": "harness.fidelity.cli",
    "search": "harness.search.cli",
    "sweep": "harness.sweep.cli",
}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] and args_list[0] in _OWN_PARSERS:
        # Everything after the word goes to that command's own parser.
        return importlib.import_module(_OWN_PARSERS[args_list[0]]).main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "run":
            return cmd_run(args, ["pdchaos", *args_list])
        if args.command == "list":
            return cmd_list(args)
        return cmd_report(args)
    except UsageError as e:
        print(f"pdchaos: error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader of a listing went away (`pdchaos list | head`): nothing more to say.
        _drop_stdout()
        return EXIT_PASS
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(f"pdchaos: error: port in use: {e}", file=sys.stderr)
            return EXIT_USAGE
        raise
    except KeyboardInterrupt:
        # Only reachable outside the run's own handlers (e.g. while loading scenarios).
        _kill_everything()
        print("pdchaos: interrupted", file=sys.stderr)
        return EXIT_UNKNOWN


def _drop_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's flush at exit would meet the broken pipe again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
