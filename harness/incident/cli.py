"""`pdchaos incident build|replay BUNDLE...`: an outage's evidence to a scenario, and whether it replays."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from harness.incident.bundle import read_bundle
from harness.incident.facts import IncidentError
from harness.incident.infer import infer
from harness.incident.judge import EXIT_BY_OUTCOME
from harness.incident.plan import Plan
from harness.incident.read_notes import TIMELINE_HELP
from harness.incident.render import build_scenario, render, scenario_name
from harness.text import one_line
from harness.usage_parser import EXIT_USAGE, UsageParser, at_least_one, seed_arg
from harness.worlds.real.processes import mark_processes

_DESCRIPTION = """\
Turn an outage's evidence into a scenario that replays it, and say whether it replays.

A bundle is a folder (or files) holding any of: the gateway's log (smg's text or JSON tracing output,
vllm-router's log; .gz too), the gateway's command line (a *.cmdline file) when the log does not show its
flags, engine logs (vLLM's, the fake engines'), Kubernetes events (kubectl get events -o json) and an
incident.toml for what the logs lack. Files are recognised by their content.

The scenario file cites the log line (file:line) each element came from, lists the named defaults used
where the bundle says nothing, and what reading skipped (malformed, cut or foreign lines).
"""

_EPILOG = f"""\
{TIMELINE_HELP}
exit codes: build: 0 written, 3 the bundle cannot give a scenario (one line says what is missing).
replay: 0 reproduced (also: only in simulation), 1 not reproduced, 2 unknown, 3 usage or bad bundle.

examples:
  pdchaos incident build tests/data/incidents/smg-1.10.1-mooncake-restart
  pdchaos incident replay tests/data/incidents/smg-1.10.1-mooncake-restart --router smg==1.10.1 --bisect
"""


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="pdchaos incident",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=UsageParser)
    b = sub.add_parser(
        "build",
        help="write the scenario that replays a bundle",
        description="Read the bundle and write the scenario file that replays it.",
    )
    r = sub.add_parser(
        "replay",
        help="build, run against the release and the reference router, judge",
        description="Build the scenario, run it against the release and the reference router in "
        "real time (scaled settings) and in simulation (the incident's own settings; the release "
        "by its gateway profile), and say whether the symptom reproduced. Writes the run folders, "
        "incident.md (to paste into a bug report) and incident.json under --out.",
    )
    for sp in (b, r):
        sp.add_argument(
            "bundle", nargs="+", type=Path, metavar="BUNDLE", help="a bundle folder, or its files"
        )
        sp.add_argument("--name", metavar="NAME", help="the incident's name (default: the bundle folder's)")
    b.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="the scenario file to write (default: incidents/incident_<name>.py); never overwritten "
        "unless --force",
    )
    b.add_argument("--force", action="store_true", help="overwrite --out")
    r.add_argument(
        "--router",
        metavar="RELEASE",
        help="the gateway release to replay against, e.g. smg==1.10.1 (default: the one the bundle names)",
    )
    r.add_argument("--out", type=Path, metavar="DIR", help="default: runs/incident-<timestamp-id>")
    r.add_argument("--seed", type=seed_arg, default=0, metavar="N", help="workload seed (default 0)")
    r.add_argument("--repeat", type=at_least_one("--repeat"), default=1, metavar="N",
                   help="real time: run each router N times; a symptom checker that fails in some runs and "
                   "passes in others is a race, and a race on the release counts as the symptom shown "
                   "(default 1)")
    r.add_argument("--no-real", action="store_true", help="skip the real-time runs")
    r.add_argument("--no-sim", action="store_true", help="skip the simulated runs")
    r.add_argument(
        "--bisect",
        action="store_true",
        help="when reproduced in real time, find the first release without the symptom (pdchaos "
        "bisect between the release and --good, judged by the first symptom checker it fails)",
    )
    r.add_argument(
        "--good",
        metavar="VERSION",
        help="--bisect's other end (default: the newest release a gateway profile models)",
    )
    return p


def _label(args: argparse.Namespace) -> str:
    if args.name:
        return str(args.name)
    first = args.bundle[0].resolve()
    return first.name if first.is_dir() else first.parent.name


def _plan(args: argparse.Namespace) -> tuple[Plan, str]:
    bundle = read_bundle(list(args.bundle))
    return infer(bundle), " ".join(str(p) for p in args.bundle)


def _summary(plan: Plan) -> str:
    return (f"gateway {plan.release or plan.gateway or '?'}; {plan.topology} "
            f"{plan.connector}/{plan.transport}; {len(plan.faults)} fault(s); "
            f"symptom: {', '.join(s.checker for s in plan.symptoms)}; {len(plan.defaults)} named default(s)")


def cmd_build(args: argparse.Namespace) -> int:
    plan, desc = _plan(args)
    label = _label(args)
    out = args.out or Path("incidents") / f"{scenario_name(plan, label)}.py"
    if out.exists() and not args.force:
        raise IncidentError(f"{out} exists (--force overwrites it)")
    text = render(plan, label, desc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"pdchaos: incident: {_summary(plan)}")
    print(f"pdchaos: incident: scenario written: {out}")
    print(f"  replay: pdchaos run {out} --router {plan.release or 'RELEASE'}          (real time, scaled)")
    print(
        f"          pdchaos run {out} --world sim --settings production           (the incident's settings)"
    )
    return 0


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP end a replay as Ctrl-C does: the run in progress tears its processes down. A signal
    ignored when pdchaos started (nohup's SIGHUP) stays ignored."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, interrupt)


def _newest_profile_release(gateway: str) -> str | None:
    from harness.routers.gateways.spec import version_key
    from harness.routers.profiles import PROFILES

    versions = [p.release.split("==", 1)[1] for p in PROFILES.values() if p.release.split("==")[0] == gateway]
    return max(versions, key=version_key, default=None)


def cmd_replay(args: argparse.Namespace) -> int:
    from harness.incident.replay import incident_md, replay

    plan, desc = _plan(args)
    release = args.router or plan.release
    if not release or "==" not in release:
        raise IncidentError("the bundle names no gateway release: give --router, e.g. --router smg==1.10.1")
    if args.no_real and args.no_sim:
        raise IncidentError("--no-real and --no-sim leave nothing to run")
    label = _label(args)
    out = args.out or Path("runs") / f"incident-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    if out.exists() and any(out.iterdir()):
        raise IncidentError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    scenario_path = out / f"{scenario_name(plan, label)}.py"
    scenario_path.write_text(render(plan, label, desc))
    print(f"pdchaos: incident: {_summary(plan)}")
    scenario = build_scenario(plan, label)
    # Every process of the runs carries this marker (one fork server for all; nothing left after).
    mark_processes(out)
    _interrupt_on_signals()
    try:
        result = replay(scenario, plan, release, out, args.seed, real=not args.no_real, sim=not args.no_sim,
                        say=lambda s: print(f"pdchaos: {s}", file=sys.stderr), repeat=args.repeat)
    except KeyboardInterrupt:
        print(f"pdchaos: interrupted; the runs so far are under {out}", file=sys.stderr)
        return EXIT_BY_OUTCOME["unknown"]
    bisect_line = None
    if args.bisect:
        bisect_line = _bisect(args, plan, result, release, scenario_path, out)
    (out / "incident.md").write_text(incident_md(result, plan, scenario_path, desc, bisect_line))
    print(f"pdchaos: incident: {result['outcome']}: {result['why']}")
    if bisect_line:
        print(f"pdchaos: incident: first release without the symptom: {bisect_line}")
    print(f"pdchaos: incident: {out / 'incident.md'}")
    return EXIT_BY_OUTCOME[result["outcome"]]


def _bisect(
    args: argparse.Namespace, plan: Plan, result: dict, release: str, scenario_path: Path, out: Path
) -> str:
    from harness.bisect.cli import main as bisect_main

    real = result["worlds"].get("real")
    if not real or real["outcome"] != "reproduced":
        return "not run (the symptom did not reproduce in real time)"
    gateway, bad = release.split("==", 1)
    good = args.good or _newest_profile_release(gateway)
    if not good or good == bad:
        return f"not run (no newer release than {bad} to bisect to: give --good)"
    checker = next(c for c, (rel, _ref) in real["checkers"].items() if rel in ("fail", "race"))
    code = bisect_main(
        [
            str(scenario_path),
            "--router",
            gateway,
            "--good",
            good,
            "--bad",
            bad,
            "--checker",
            checker,
            "--transport",
            plan.transport,
            "--seed",
            str(args.seed),
            "--out",
            str(out / "bisect"),
            "--no-progress",
        ]
    )
    path = out / "bisect" / "bisect.json"
    if code != 0 or not path.exists():
        return f"no pair found between {bad} and {good} (see {out / 'bisect'})"
    pair = json.loads(path.read_text()).get("pair") or []
    if len(pair) != 2:
        return f"no pair found between {bad} and {good} (see {out / 'bisect'})"
    good_run, bad_run = pair
    return f"{good_run['version']} (the symptom, {checker}, is in {bad_run['version']})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return cmd_build(args) if args.command == "build" else cmd_replay(args)
    except IncidentError as e:
        print(f"pdchaos: error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("pdchaos: interrupted", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
