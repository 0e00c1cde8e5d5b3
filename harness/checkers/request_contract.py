"""Each request's path against the router's request contract (docs/DESIGN.md §2), from the engines' legs and
the client's answer, for any router:
- refused before any leg: a 503 the router decides at once (no Ready worker for a leg, every one kept out),
  never after a wait;
- within the router's own deadline: a request answered by the router within its request timeout for the
  prefill legs plus one for the decode leg (a client that waits longer must not be the one that ends it);
- a client error is the client's: a leg an engine refused as the client's mistake (4xx), with no leg after
  it, is answered to the client as a 4xx, never as a server error or a success; a request carrying a
  client's mistake (the workload's `mistake_fraction`) never gets a server error. Not judged where a fault
  on the engine (its link cut, its process stopped or gone) may have kept the refusal from the router.
Time the harness had the router's process stopped (`PauseRouter`) is not counted as the router's.
(Legs run once and in order: `legs_once`, `legs_sequenced`.)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from harness.checkers._common import cap, judged_from_engines
from harness.contract.evidence import REFUSED, EngineView, Leg
from harness.contract.reach import EDGE_S, paused_within
from harness.history import History, RequestView
from harness.verdict import Verdict

NAME = "request_contract"


@dataclass(frozen=True)
class RequestContractExpect:
    """`refusal_s`: how long a router may take to refuse a request before any leg; `slack_s`: the
    observation slack on the router's deadline."""

    refusal_s: float = 1.0
    slack_s: float = 0.5


def _late_refusals(history: History, legs: dict[str, list[Leg]], exp: RequestContractExpect) -> list[str]:
    out = []
    for req in history.request_list():
        if req.status != 503 or req.tag in legs or req.latency_s is None:
            continue
        # A stopped router decides nothing: the time it was paused is not its own.
        own = req.latency_s - _paused(history, req)
        if own > exp.refusal_s:
            out.append(f"router side: {req.tag} was refused 503 before any leg after {req.latency_s:.3f}s "
                       f"({own:.3f}s its own; a refusal is decided at once; at most {exp.refusal_s:g}s)")
    return out


def _paused(history: History, req: RequestView) -> float:
    if req.invoked_t is None:
        return 0.0
    return paused_within(history, req.invoked_t, req.completed_t or history.end_t)


def _over_deadline(history: History, view: EngineView, exp: RequestContractExpect) -> tuple[int, list[str]]:
    bound = 2 * view.contract.request_timeout_s + exp.slack_s
    judged, out = 0, []
    for req in history.request_list():
        start = req.invoked_t
        if start is None or req.deadline_s is None or req.deadline_s <= bound:
            continue  # the client gives up first: the router's own deadline cannot show
        judged += 1
        answered = req.completed and not req.timed_out
        took = req.latency_s if answered else (req.completed_t or history.end_t) - start
        if took is not None and took - _paused(history, req) > bound:
            how = f"answered {req.status}" if answered else "not answered by the router"
            out.append(f"router side: {req.tag} {how} after {took:.3f}s, past the router's own deadline "
                       f"({bound:g}s: a request timeout of {view.contract.request_timeout_s:g}s per leg)")
    return judged, out


def _answer_may_be_lost(view: EngineView, leg: Leg) -> bool:
    """Whether a fault on the engine (its link cut, the process stopped or gone) may have kept its answer
    to `leg` from the router: then the router never heard the refusal, and a 502 is what it knew."""
    end = leg.ended if leg.ended is not None else leg.at
    return any(w.start - EDGE_S <= end and leg.at <= w.end + EDGE_S for w in view.windows(leg.engine))


def _refused_as_the_clients(leg: Leg) -> bool:
    """The engine refused the leg as the client's mistake: a 4xx, but not 499 (the router hung up on it)."""
    return leg.kind == REFUSED and leg.status is not None and 400 <= leg.status < 500 and leg.status != 499


def _client_errors(view: EngineView, legs: dict[str, list[Leg]]) -> tuple[int, list[str]]:
    history = view.history
    judged, out = 0, []
    for req in history.request_list():
        if req.mistake is None or not req.completed or req.timed_out:
            continue
        mine = legs.get(req.tag or "", [])
        if not mine or not all(_refused_as_the_clients(leg) for leg in mine):
            # No engine saw the mistake (refused before any leg, or gRPC carries no model name): nothing
            # says the answer had to be the client's.
            continue
        if any(_answer_may_be_lost(view, leg) for leg in mine):
            continue
        judged += 1
        if (req.status or 0) >= 500:
            out.append(f"router side: {req.tag} carried the client's mistake ({req.mistake}) and got "
                       f"{req.status}, a server error")
    for tag, mine in legs.items():
        last = mine[-1]
        if not _refused_as_the_clients(last):
            continue
        req: RequestView | None = history.request_by_tag(tag)
        if req is None or not req.completed or req.timed_out or _answer_may_be_lost(view, last):
            continue
        judged += 1
        if not 400 <= (req.status or 0) < 500:
            out.append(f"router side: {last.engine} refused {tag}'s leg {last.status} (the client's "
                       f"mistake), but the client got {req.status}")
    return judged, out


@judged_from_engines(NAME, RequestContractExpect)
def check_request_contract(view: EngineView, exp: RequestContractExpect) -> Verdict:
    history = view.history
    if not history.requests:
        return Verdict.unknown_(NAME, "no request was made")
    legs: dict[str, list[Leg]] = defaultdict(list)
    for leg in view.legs():
        if leg.tag is not None:
            legs[leg.tag].append(leg)
    evidence = _late_refusals(history, legs, exp)
    refusals = sum(1 for r in history.request_list() if r.status == 503 and r.tag not in legs)
    deadlines, found = _over_deadline(history, view, exp)
    evidence += found
    client, found = _client_errors(view, legs)
    evidence += found
    numbers = {"requests": len(history.requests), "refusals": refusals, "deadline_judged": deadlines,
               "client_errors": client, "refusal_s": exp.refusal_s,
               "router_deadline_s": 2 * view.contract.request_timeout_s}
    if evidence:
        what = f"{len(evidence)} request(s) not handled as the request contract says"
        return Verdict.fail(NAME, what, numbers, cap(evidence))
    what = f"{len(history.requests)} request(s) handled as the request contract says"
    return Verdict.ok(NAME, what, numbers)
