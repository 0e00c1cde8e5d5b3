"""Small helpers shared by the checkers: fault selection, settings lookup, evidence capping, and the
preamble of the contract checkers that judge from the engines' view."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from harness.contract.evidence import EngineView
from harness.history import FaultView, History
from harness.verdict import Verdict

P = TypeVar("P")

MAX_EVIDENCE = 25


def cap(items: Sequence[Any], limit: int = MAX_EVIDENCE) -> list[Any]:
    """At most `limit` evidence items, with a final marker saying how many were left out."""
    out = list(items[:limit])
    if len(items) > limit:
        out.append(f"... {len(items) - limit} more")
    return out


def kind_matches(kind: str | None, wanted: Iterable[str]) -> bool:
    """`wedge` matches fault kinds `wedge` and `fault:wedge` (the runner prefixes engine-fault kinds)."""
    if kind is None:
        return False
    short = kind.split(":")[-1]
    return any(kind == w or short == w for w in wanted)


def select_faults(
    history: History, faults: Sequence[str] | None, kinds: Sequence[str] | None
) -> list[FaultView]:
    """Faults by explicit id, else by kind, else all of them; only faults that were applied."""
    chosen = []
    for f in history.fault_list():
        if f.applied_t is None:
            continue
        if faults is not None and f.fault not in faults:
            continue
        if kinds is not None and not kind_matches(f.kind, kinds):
            continue
        chosen.append(f)
    return chosen


def find_setting(settings: Mapping[str, Any], names: Sequence[str]) -> float | None:
    """First numeric value under any of `names`, searching nested dicts (settings are run_started.settings,
    whose exact nesting is the runner's choice)."""
    stack: list[Mapping[str, Any]] = [settings]
    found: dict[str, float] = {}
    while stack:
        cur = stack.pop()
        for key, value in cur.items():
            if isinstance(value, Mapping):
                stack.append(value)
            elif key in names and isinstance(value, int | float) and not isinstance(value, bool):
                found.setdefault(key, float(value))
    for n in names:
        if n in found:
            return found[n]
    return None


def rounded(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def judged_from_engines(
    name: str, defaults: Callable[[], P]
) -> Callable[[Callable[[EngineView, P], Verdict]], Callable[[History, P | None], Verdict]]:
    """A contract checker's preamble: `judge` gets the history's engine view and its expectation (the
    defaults when none is given); a history without the router's settings is unknown."""

    def wrap(judge: Callable[[EngineView, P], Verdict]) -> Callable[[History, P | None], Verdict]:
        @functools.wraps(judge)
        def check(history: History, exp: P | None = None) -> Verdict:
            view = EngineView.of(history)
            if view is None:
                return Verdict.unknown_(name, "the router's settings are not in the run's settings")
            return judge(view, exp if exp is not None else defaults())

        return check

    return wrap
