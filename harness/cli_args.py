"""The flags several commands share, defined once as argparse parents: which cells of each scenario to run,
and in which world at which settings preset (`pdchaos run`, `zoo`, `matrix`, `bisect`, `search`)."""

from __future__ import annotations

import argparse

from harness.scenario.model import WORLDS
from harness.scenario.presets import PRESET_NAMES
from harness.topology import CONNECTORS, TRANSPORTS
from harness.usage_parser import at_least_one

SETTINGS_HELP = ("settings preset: scaled (the scenarios as written, probes every 0.3 s: the real-time "
                 "default) or production (smg's defaults, 60 s probes, vLLM's 480 s transfer timeout; "
                 "scenario times x600: the simulation default)")


def cell_filters(topology: str = "many") -> argparse.ArgumentParser:
    """--topology (`many`: repeatable or comma separated; `one`: a single shape; `none`: no flag),
    --connector and --transport: a subset of each scenario's own cells."""
    p = argparse.ArgumentParser(add_help=False)
    if topology == "many":
        p.add_argument("--topology", action="append", metavar="T",
                       help="run only these of each scenario's own NpMd shapes (1p1d, 1p2d, 2p1d...); "
                       "repeatable or comma separated (default: all of them)")
    elif topology == "one":
        p.add_argument("--topology", metavar="T", help="NpMd shape (default: the scenario's first)")
    p.add_argument("--connector", choices=CONNECTORS,
                   help="run only this of each scenario's own connectors (default: all of them)")
    p.add_argument("--transport", choices=TRANSPORTS,
                   help="how the router talks to the engines: run only this of each scenario's own "
                   "transports (default: all of them)")
    return p


def world_and_settings(world: str | None) -> argparse.ArgumentParser:
    """--world (default `world`; None: no flag, real time only) and --settings (default: the world's)."""
    p = argparse.ArgumentParser(add_help=False)
    if world is not None:
        p.add_argument("--world", choices=WORLDS, default=world,
                       help="real: processes on loopback in real time; sim: the same scenarios in simulated "
                       "time (simpy; the reference router's and the fake engines' own cores; exact replay "
                       f"from the seed) (default: {world})")
    p.add_argument("--settings", choices=PRESET_NAMES, default=None, help=SETTINGS_HELP)
    return p


repeat_arg = at_least_one("--repeat")


def repeats() -> argparse.ArgumentParser:
    """--repeat N and --fail-on: each cell run N times; a checker that split is a race (`harness.races`)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--repeat", type=repeat_arg, default=1, metavar="N",
                   help="run each cell N times (real time only: a simulated run repeats exactly). Per "
                   "checker: pass, fail (in every run) or race (both seen); a cell fails when a checker "
                   "failed in every run and races when one split (default 1)")
    p.add_argument("--fail-on", choices=("race", "fail"), default="race",
                   help="with --repeat: whether a race is red (exit 1; the default) or only a fail is")
    return p
