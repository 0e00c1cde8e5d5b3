"""Bug switches as a scenario sees them: every switch of the reference router (`reference_router.core.bugs`)
and of the fake engines (`fake_engines.core.bugs`) under one namespace, and how a set of names goes into a
scenario (router switches into RouterSettings.inject_bugs, engine switches into EngineSettings.inject_bugs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from fake_engines.core.bugs import ENGINE_BUGS
from pdchaos.bugs import BugSwitch
from reference_router.core.bugs import ROUTER_BUGS

# A scenario is `harness.scenario.model.Scenario`, not imported: the model checks names against this module.
Scenario = Any


def _merged() -> dict[str, BugSwitch]:
    both = set(ROUTER_BUGS) & set(ENGINE_BUGS)
    if both:
        raise RuntimeError(f"bug switch names used by both the router and the engines: {sorted(both)}")
    return {**ROUTER_BUGS, **ENGINE_BUGS}


SWITCHES: dict[str, BugSwitch] = _merged()
INJECTABLE_BUGS: tuple[str, ...] = tuple(sorted(SWITCHES))


def unknown_bugs(names: Iterable[str]) -> list[str]:
    return sorted(set(names) - set(SWITCHES))


def absent_bug(names: Iterable[str], places: Iterable[tuple[str, str]], what: str) -> str | None:
    """Why a switch of `names` cannot occur in any of `places` ((connector, transport) pairs: `what` they
    are, for the message), or None when each can somewhere. A switch put where it cannot occur leaves the run
    as it would be without it: a pass that proves nothing, or a hole the matrix never ran."""
    where = sorted(set(places))
    for name in dict.fromkeys(names):
        sw = SWITCHES.get(name)
        if sw is not None and not any(sw.occurs_in(c, t) for c, t in where):
            have = ", ".join(f"{c}/{t}" for c, t in where)
            return (f"{name} cannot occur in any of the {what} ({have}): it needs connector "
                    f"{'/'.join(sw.connectors)} and transport {'/'.join(sw.transports)}")
    return None


def split_bugs(names: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(router switches, engine switches) among `names`, each in the given order, deduplicated; ValueError
    naming unknown ones."""
    names = tuple(dict.fromkeys(names))
    bad = unknown_bugs(names)
    if bad:
        raise ValueError(f"unknown bug {', '.join(map(repr, bad))} (known: {', '.join(INJECTABLE_BUGS)})")
    router = tuple(n for n in names if SWITCHES[n].side == "router")
    engine = tuple(n for n in names if SWITCHES[n].side == "engine")
    return router, engine


def with_bugs(scenario: Scenario, names: Iterable[str]) -> Scenario:
    """The scenario with these switches on (added to any it already has)."""
    router, engine = split_bugs(names)
    out = scenario
    if router:
        merged = tuple(dict.fromkeys((*scenario.router.inject_bugs, *router)))
        out = replace(out, router=replace(out.router, inject_bugs=merged))
    if engine:
        merged = tuple(dict.fromkeys((*scenario.engines.inject_bugs, *engine)))
        out = replace(out, engines=replace(out.engines, inject_bugs=merged))
    return out


def injected_bugs(scenario: Scenario) -> tuple[str, ...]:
    """Every switch the scenario runs with: the router's, then the engines'."""
    return (*scenario.router.inject_bugs, *scenario.engines.inject_bugs)
