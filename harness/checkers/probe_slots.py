"""The router keeps to its probe slots (CONTRACTS §2), judged from the engines' records for any router: at no
moment are more of its health probes and engine-id reads open than `max_concurrent_health_checks` allows.

A router takes a slot before it sends a probe or a read and frees it once it has the answer or has given up.
An engine times the same call from its arrival to its answer, or to the caller hanging up. So an answered
call lies inside the router's slot, and the engines never see more answered calls open than the router held.
A call the router let go is seen to end up to the engine's watch interval late: `slack_s` covers that.

Calls the engines could not time are left out, as in `call_deadlines`: that can only lower the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from fake_engines.core.calls import CLIENT_GONE
from harness.checkers._common import cap, judged_from_engines
from harness.contract.evidence import EngineView
from harness.history import EngineCall
from harness.verdict import Verdict

NAME = "probe_slots"
# Two calls that meet within this are in turn, not at once: the records' times carry clock rounding.
TOUCH_S = 1e-3


@dataclass(frozen=True)
class ProbeSlotsExpect:
    """`slack_s`: how late an engine may see a caller that let its call go."""

    slack_s: float = 0.03


def _span(call: EngineCall, slack_s: float) -> tuple[float, float]:
    end = call.at + (call.duration_s or 0.0) - TOUCH_S
    if call.status == CLIENT_GONE:
        end -= slack_s
    return call.at, max(call.at, end)


def _crowded(calls: list[EngineCall], limit: int, slack_s: float) -> tuple[list[list[EngineCall]], int]:
    """Each moment more than `limit` calls were open (the calls open then, one list per episode), and the
    most ever open at once."""
    edges = []
    for call in calls:
        start, end = _span(call, slack_s)
        if end > start:
            edges += [(start, 1, id(call), call), (end, 0, id(call), call)]
    edges.sort(key=lambda e: e[:3])  # at one instant, ends before starts
    open_calls: dict[int, EngineCall] = {}
    episodes: list[list[EngineCall]] = []
    crowded = False
    most = 0
    for _, starts, key, call in edges:
        if starts:
            open_calls[key] = call
        else:
            open_calls.pop(key, None)
        most = max(most, len(open_calls))
        over = len(open_calls) > limit
        if over and not crowded:
            episodes.append(sorted(open_calls.values(), key=lambda c: c.at))
        crowded = over
    return episodes, most


@judged_from_engines(NAME, ProbeSlotsExpect)
def check_probe_slots(view: EngineView, exp: ProbeSlotsExpect) -> Verdict:
    limit = view.contract.max_probes_in_flight
    if limit is None:
        return Verdict.ok(NAME, "no probe-slot limit was set: nothing to hold")
    calls = [c for engine in view.workers() for c in view.timed_router_calls(engine)]
    if not calls:
        return Verdict.unknown_(NAME, "no probe or id read of the router's that the engines could time")
    episodes, most = _crowded(calls, limit, exp.slack_s)
    numbers = {"calls": len(calls), "limit": limit, "episodes": len(episodes), "most_open": most}
    if episodes:
        evidence = [
            f"router side: at t={max(c.at for c in e):.3f} {len(e)} probes or reads were open, over the "
            f"router's {limit} slot(s): " + ", ".join(f"{c.call}@{c.engine} from t={c.at:.3f}" for c in e)
            for e in episodes
        ]
        why = f"more than {limit} probe(s) or read(s) open at once, {len(episodes)} time(s)"
        return Verdict.fail(NAME, why, numbers, cap(evidence))
    return Verdict.ok(NAME, f"{len(calls)} probe(s) and read(s), at most {most} open at once (limit {limit})",
                      numbers)
