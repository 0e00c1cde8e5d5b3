"""Every health probe and engine-id read a router makes has a deadline (CONTRACTS §2), judged from the
engines' records for any router: each such call ends within the router's probe timeout, answered or let go.

The engine records how long it held each call: until it answered, or until the caller hung up (status
CLIENT_GONE). A router whose read has no deadline holds it open for as long as the engine does not answer (a
wedged metadata surface), while its probe slot, its connection and whatever waits on the read wait too.

Not judged: a call in a window where the engine's own clock cannot tell when the router let go (the process
stopped or gone, its serving link cut or bent, the router paused, before the engine first served). A wedged
or slowed surface is judged: there the engine sees the caller leave.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers._common import cap, judged_from_engines
from harness.contract.evidence import EngineView
from harness.verdict import Verdict

NAME = "call_deadlines"


@dataclass(frozen=True)
class CallDeadlinesExpect:
    """`slack_s`: how much longer than the bound the engine may see a call (its own clock and the hop)."""

    slack_s: float = 0.25


def _bound_s(view: EngineView) -> float:
    rule = view.contract.rules.get("read_timeout_s")
    return float(rule) if isinstance(rule, int | float) else view.contract.probe_timeout_s


@judged_from_engines(NAME, CallDeadlinesExpect)
def check_call_deadlines(view: EngineView, exp: CallDeadlinesExpect) -> Verdict:
    bound = _bound_s(view)
    judged = [c for engine in view.workers() for c in view.timed_router_calls(engine)]
    if not judged:
        return Verdict.unknown_(NAME, "no probe or id read of the router's that the engines could time")
    late = [c for c in judged if (c.duration_s or 0.0) > bound + exp.slack_s]
    longest = max(c.duration_s or 0.0 for c in judged)
    numbers = {"calls": len(judged), "late": len(late), "bound_s": bound, "longest_s": round(longest, 3)}
    if late:
        evidence = [
            f"router side: {c.engine} held the router's {c.call} from t={c.at:.3f} for {c.duration_s:.3f}s "
            f"({'let go' if c.status == 499 else f'answered {c.status}'}), past its deadline of {bound:g}s "
            "(the probe timeout)"
            for c in late
        ]
        return Verdict.fail(NAME, f"{len(late)} probe(s) or read(s) held past the router's deadline", numbers,
                            cap(evidence))
    return Verdict.ok(NAME, f"{len(judged)} probe(s) and read(s) ended within {bound:g}s", numbers)
