"""One failing verdict per checker, as a real run printed it: the examples of the checker reference.

Each example is a run that fails the checker, replayed by its one-line command:
- a bug switch of the zoo in simulation, in a cell the committed zoo matrix (`tests/data/zoo.json`) says the
  checker caught it (deterministic: the same command prints the same verdict);
- for a checker no switch trips, a real gateway release with a documented finding (docs/GATEWAYS.md); its
  times vary from run to run, its reason does not.

A checker with neither has no example, and the page says so. The examples are kept in
`checker_examples.json` beside this module; `python -m harness.docs_reference` renders them, and a test
replays one so the file cannot drift from what the checkers print.

    python -m harness.checker_examples              # replay every source, rewrite the file (minutes)
    python -m harness.checker_examples --only leg_shape
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.checkers import CHECKERS
from harness.topology import parse_topology
from harness.zoo.plan import parse_cell_key

EXAMPLES_JSON = Path(__file__).with_name("checker_examples.json")
ZOO_JSON = Path(__file__).resolve().parent.parent / "tests" / "data" / "zoo.json"
EVIDENCE_LINES = 4
LINE_CHARS = 240
# The documented gateway findings of checkers no switch trips (docs/GATEWAYS.md, contract checkers).
GATEWAY_SOURCES = {
    "error_answers": "pdchaos run prefill_fails_requests --topology 1p1d --connector nixl --transport http "
                     "--router vllm-router==0.1.17",
    "worker_api": "pdchaos run property_update_keeps_handoff --topology 1p1d --connector mooncake "
                  "--transport http --router smg==1.13.0",
}


@dataclass(frozen=True)
class Source:
    checker: str
    replay: str
    kind: str  # "switch NAME" or "gateway"


def _cell_rank(cell: str, checkers: Sequence[str], checker: str) -> tuple[int, int, int, str]:
    """The smallest cell where the checker leads: fewer engines, HTTP before gRPC, then by name."""
    _, topology, _, transport = parse_cell_key(cell)
    size = parse_topology(topology)
    return (checkers.index(checker), size.engines, transport != "http", cell)


def zoo_sources(zoo: Mapping[str, Any]) -> dict[str, Source]:
    """Per checker, the zoo cell (switch on) where it failed, smallest first."""
    found: dict[str, tuple[tuple[int, int, int, str], Source]] = {}
    for switch, entry in sorted(zoo["switches"].items()):
        for cell, outcome in entry["cells"].items():
            if not outcome["caught"]:
                continue
            for checker in outcome["checkers"]:
                rank = _cell_rank(cell, outcome["checkers"], checker)
                if checker not in found or rank < found[checker][0]:
                    found[checker] = (rank, Source(checker, outcome["replay"], f"switch {switch}"))
    return {name: source for name, (_, source) in found.items()}


def sources(zoo: Mapping[str, Any]) -> dict[str, Source]:
    out = zoo_sources(zoo)
    for checker, replay in GATEWAY_SOURCES.items():
        out.setdefault(checker, Source(checker, replay, "gateway"))
    return {name: out[name] for name in sorted(out) if name in CHECKERS}


def _short(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 3] + "..."


def replay(source: Source, out: Path, timeout_s: float = 900.0) -> dict[str, Any]:
    """Run the source's command into `out` and return the checker's verdict as the example keeps it."""
    argv = shlex.split(source.replay)
    if argv[:2] != ["pdchaos", "run"]:
        raise ValueError(f"{source.checker}: not a `pdchaos run` line: {source.replay}")
    cmd = [sys.executable, "-m", "harness.cli", *argv[1:], "--out", str(out), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False,
                          start_new_session=True)
    report = out / "report.json"
    if not report.is_file():
        raise RuntimeError(f"{source.checker}: {source.replay} wrote no report (exit {done.returncode}): "
                           f"{done.stderr.strip()[-400:]}")
    results = json.loads(report.read_text(encoding="utf-8"))["results"]
    verdicts = [v for r in results for v in r["verdicts"] if v["name"] == source.checker]
    failed = [v for v in verdicts if v["status"] == "fail"]
    if not failed:
        got = ", ".join(v["status"] for v in verdicts) or "no verdict"
        raise RuntimeError(f"{source.checker}: {source.replay} did not fail it ({got})")
    v = failed[0]
    return {"checker": source.checker, "source": source.kind, "replay": source.replay,
            "reason": v["reason"], "evidence": [_short(str(e)) for e in v["evidence"][:EVIDENCE_LINES]],
            "more_evidence": max(0, len(v["evidence"]) - EVIDENCE_LINES)}


def load_examples(path: Path = EXAMPLES_JSON) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    return {e["checker"]: e for e in json.loads(path.read_text(encoding="utf-8"))}


def write_examples(examples: Mapping[str, Mapping[str, Any]], path: Path = EXAMPLES_JSON) -> None:
    path.write_text(json.dumps([examples[k] for k in sorted(examples)], indent=2) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.checker_examples", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", metavar="CHECKER", help="replay only these checkers' sources")
    p.add_argument("--no-gateways", action="store_true",
                   help="keep the gateway examples as they are (each downloads a release, runs in real time)")
    args = p.parse_args(argv)
    todo = sources(json.loads(ZOO_JSON.read_text(encoding="utf-8")))
    unknown = sorted(set(args.only or ()) - set(CHECKERS))
    if unknown:
        p.error(f"no such checker: {', '.join(unknown)} (known: {', '.join(sorted(CHECKERS))})")
    if args.only:
        todo = {k: v for k, v in todo.items() if k in args.only}
    if args.no_gateways:
        todo = {k: v for k, v in todo.items() if v.kind != "gateway"}
    examples = load_examples()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="checker-examples-") as tmp:
        for name, source in todo.items():
            try:
                # In real time the run folder's name is the request tags' run id: keep it short and plain.
                folder = Path(tmp) / name
                folder.mkdir()
                examples[name] = replay(source, folder / "example")
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                failures += 1
                print(f"FAILED {name}: {exc}", file=sys.stderr)
                continue
            print(f"{name}: {examples[name]['reason']}", flush=True)
            write_examples(examples)
    missing = sorted(set(CHECKERS) - set(examples))
    if missing:
        print(f"no example: {', '.join(missing)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
