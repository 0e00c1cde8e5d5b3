"""Which scenarios a command runs: named ones (by scenario name or file), else the default suite; checked
before anything starts. Problems are `UsageError`s: one line, exit code 3."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_TAG = "default"


class UsageError(Exception):
    """Bad arguments or configuration: reported as one line, exit code 3."""


def out_folder_problem(out: Path, label: str = "", resume: bool = False) -> str | None:
    """Why `out` cannot take a new command's results (None: it can): a file there, or a folder that holds
    something already (a new run never writes among an old one's files)."""
    name = f"{label} {out}" if label else str(out)
    if out.is_symlink() and not out.exists():
        return f"{name} is a link to nothing ({os.readlink(out)})"
    if not out.exists():
        return None
    if not out.is_dir():
        return f"{name} already exists and is not a folder"
    if any(out.iterdir()):
        return f"{name} already exists and is not empty" + (" (--resume goes on with it)" if resume else "")
    return None


def split_topologies(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    from harness.topology import parse_topology

    out: list[str] = []
    for v in values:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(parse_topology(part).name)
            except ValueError as e:
                raise UsageError(str(e)) from None
    if not out:
        raise UsageError("--topology given without a topology")
    return list(dict.fromkeys(out))


def load_named(items: Sequence[str]) -> list[Any]:
    """Scenarios by name (shipped folder) or file, in the order given; none: every shipped scenario. Two
    different scenarios under one name (in one file, in two files, a file reusing a shipped name) are an
    error: names key run folders and reports, so one would silently replace the other."""
    from harness.scenario import ScenarioError, load_scenarios

    try:
        return load_scenarios(list(items) or None)
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def is_default(scenario: Any) -> bool:
    return DEFAULT_TAG in tuple(getattr(scenario, "tags", ()) or ())


def default_suite(scenarios: Sequence[Any], world: str | None = None) -> list[Any]:
    """Scenarios tagged 'default' (cut to their suite cells); if no scenario carries the tag, every scenario
    not tagged 'slow'. `world`: only those whose default suite in that world holds them (`suite_worlds`)."""
    if world is not None:
        scenarios = [s for s in scenarios if world in tuple(getattr(s, "suite_worlds", (world,)))]
    marked = [s for s in scenarios if is_default(s)]
    if marked:
        return [s.suite_cut() if hasattr(s, "suite_cut") else s for s in marked]
    return [s for s in scenarios if "slow" not in tuple(getattr(s, "tags", ()) or ())]


def check_expectations(scenarios: Sequence[Any]) -> None:
    from harness.checkers import validate_expect

    for s in scenarios:
        bad = [p for x in s.expect for p in validate_expect(x.checker, x.params)]
        if bad:
            raise UsageError(f"scenario {s.name!r}: " + "; ".join(bad))


def select_suite(args: argparse.Namespace) -> tuple[list[str] | None, list[Any]]:
    """`--topology` and the scenarios to run (those named, else the default suite), checked (UsageError)."""
    topologies = split_topologies(args.topology)
    loaded = load_named(args.scenarios)
    scenarios = loaded if args.scenarios else default_suite(loaded, getattr(args, "world", None))
    if not scenarios:
        raise UsageError("no scenarios to run")
    check_expectations(scenarios)
    return topologies, scenarios
