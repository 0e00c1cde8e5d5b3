"""Status machine conformance (docs/DESIGN.md §2), judged from the engines' side for any router.

The probes each engine answered are replayed through the contract's state machine (`harness.contract`),
with the faults that could hide a probe's true outcome widening what the router may have seen. Then:
- every leg an engine got must have gone to a worker the router may have had Ready at some moment between
  the client's request and the leg's arrival (a leg to a worker the contract keeps out is a violation);
- a request the router refused with 503 before any leg ran, while a worker of every role was surely Ready
  all along (and no breaker could keep it out), kept routable workers out;
- every status the router's worker list showed must be one the contract allows at that moment.
`slack_s` covers the observation (a probe's answer reaches the router a little after the engine sent it,
the worker list is read on a poll); the verdict states it, with the contract's detection and recovery bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers._common import cap, judged_from_engines
from harness.contract.evidence import EngineView
from harness.contract.status_model import READY, STATUSES
from harness.history import History
from harness.verdict import Verdict

NAME = "status_contract"


@dataclass(frozen=True)
class StatusContractExpect:
    """`slack_s`: how far a router's view may lag the engines' (seconds, both sides of each moment)."""

    slack_s: float = 0.1
    check_legs: bool = True
    check_kept_out: bool = True
    check_shown: bool = True


def _pd_roles(view: EngineView) -> list[str]:
    roles = sorted(set(view.roles.values()))
    return [r for r in roles if r in ("prefill", "decode")] or roles


def _legs_to_workers_out(history: History, view: EngineView, slack: float) -> tuple[int, list[str]]:
    judged, out = 0, []
    for leg in view.legs():
        req = history.request_by_tag(leg.tag)
        if req is None or req.invoked_t is None or leg.engine not in view.roles:
            continue
        judged += 1
        timeline = view.timeline(leg.engine)
        seen = timeline.statuses_in(req.invoked_t - slack, leg.at + slack)
        if READY not in seen:
            since = timeline.since_not(leg.at, READY)
            out.append(
                f"router side: {leg.tag} sent a {leg.kind} leg to {leg.engine} at t={leg.at:.3f}; the "
                f"contract had it {'/'.join(sorted(seen))} from the request (t={req.invoked_t:.3f}) on"
                + ("" if since is None else f", not Ready since t={since:.3f}"))
    return judged, out


def _kept_out(history: History, view: EngineView, slack: float) -> tuple[int, list[str]]:
    tags_with_legs = {leg.tag for leg in view.legs()}
    roles = _pd_roles(view)
    judged, out = 0, []
    for req in history.request_list():
        if req.status != 503 or req.invoked_t is None or req.completed_t is None or req.tag in tags_with_legs:
            continue
        judged += 1
        ready: dict[str, str] = {}
        for role in roles:
            sure = [w for w in view.workers(role)
                    if view.timeline(w).surely(READY, req.invoked_t - slack, req.completed_t + slack)]
            if sure:
                ready[role] = sure[0]
        if len(ready) == len(roles):
            out.append(f"router side: {req.tag} was refused 503 at t={req.completed_t:.3f} "
                       f"({req.error or 'no error'}) while {', '.join(ready.values())} stayed Ready")
    return judged, out


def _shown(history: History, view: EngineView, slack: float) -> tuple[int, list[str]]:
    judged, out = 0, []
    for points in history.status.values():
        for p in points:
            if p.engine not in view.roles or p.status not in STATUSES:
                continue
            judged += 1
            allowed = view.timeline(p.engine).statuses_in(p.t - slack, p.t + slack)
            if p.status not in allowed:
                out.append(f"router side: the worker list showed {p.engine} {p.status} at t={p.t:.3f}; the "
                           f"contract allows {'/'.join(sorted(allowed))} then")
    return judged, out


def _removals(history: History, view: EngineView, slack: float) -> tuple[int, list[str]]:
    """Each worker taken out through the worker API leaves the worker list once it is idle: by the end of
    the last leg it had begun, plus a read of the list. Not judged where the run (or the worker's next
    registration) comes sooner than that."""
    poll = float(history.settings.get("observe_interval_s") or 0.0)
    if poll <= 0:
        return 0, []
    judged, out = 0, []
    for engine in view.roles:
        calls = view.worker_api_times(engine)
        for i, (removed, call) in enumerate(calls):
            if call != "removed":
                continue
            again = next((t for t, c in calls[i + 1:] if c == "added"), history.end_t)
            # The requests it had begun: a Mooncake prefill stays in use until its decode has pulled.
            tags = {leg.tag for leg in view.legs() if leg.engine == engine and leg.at <= removed + slack}
            idle = max([removed, *((leg.ended if leg.ended is not None else leg.at) for leg in view.legs()
                                   if leg.tag in tags)])
            due = idle + poll + 2 * slack
            if due >= again:
                continue
            judged += 1
            gone = [p.t for w in history.workers_for(engine) for p in history.status.get(w, [])
                    if p.status == "absent" and removed - slack <= p.t]
            if not gone or min(gone) > due:
                seen = f"at t={min(gone):.3f}" if gone else "never"
                out.append(f"router side: {engine} was removed at t={removed:.3f} and idle from "
                           f"t={idle:.3f}, but left the worker list {seen} (due by t={due:.3f})")
    return judged, out


@judged_from_engines(NAME, StatusContractExpect)
def check_status_contract(view: EngineView, exp: StatusContractExpect) -> Verdict:
    history = view.history
    if not view.roles:
        return Verdict.unknown_(NAME, "the run names no engines (engines_layout)")
    if not history.router_calls(*view.contract.probe_calls):
        return Verdict.unknown_(NAME, f"no engine recorded a probe ({', '.join(view.contract.probe_calls)})")
    slack = exp.slack_s
    evidence: list[str] = []
    counts = {"legs": 0, "refusals": 0, "shown": 0, "removals": 0}
    if exp.check_legs:
        counts["legs"], found = _legs_to_workers_out(history, view, slack)
        evidence += found
    if exp.check_kept_out and view.contract.breaker_failures is None:
        counts["refusals"], found = _kept_out(history, view, slack)
        evidence += found
    if exp.check_shown and view.contract.shows_statuses:
        counts["shown"], found = _shown(history, view, slack)
        evidence += found
    counts["removals"], found = _removals(history, view, slack)
    evidence += found
    numbers = {**counts, "slack_s": slack, "detection_bound_s": view.contract.detection_bound_s,
               "recovery_bound_s": view.contract.recovery_bound_s}
    if evidence:
        return Verdict.fail(NAME, f"{len(evidence)} action(s) the status contract does not allow", numbers,
                            cap(evidence))
    if not any(counts.values()):
        return Verdict.unknown_(NAME, "no leg, refusal or worker status to judge", numbers)
    judged = ", ".join(f"{v} {k}" for k, v in counts.items())
    return Verdict.ok(NAME, f"every routing decision allowed by the status contract ({judged})", numbers)
