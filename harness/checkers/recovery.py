"""Recovery latency per fault: fault healed -> worker seen Ready again -> first correct handoff through it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from harness.checkers._common import cap, rounded, select_faults
from harness.contract.settings import probe_slack_s
from harness.history import READY, FaultView, Handoff, History
from harness.verdict import Verdict

NAME = "recovery"


@dataclass(frozen=True)
class RecoveryExpect:
    """`max_recovery_s`: heal -> first correct handoff. `faults`/`kinds` pick the faults judged
    (default: every applied fault). `require_ready`: the faulted worker must be seen Ready in the router
    status first. A history with no router status at all (worker list not observable) is judged on
    heal -> handoff alone, with `ready_observed: false` in the numbers."""

    max_recovery_s: float = 10.0
    faults: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    require_ready: bool = True


def is_correct_handoff(history: History, ho: Handoff) -> bool:
    """A handoff that did its job: the decode pulled KV with the prompt's digest, or the prefill computed and
    the decode side of the same request (when recorded) pulled it correctly; the request completed OK. For a
    router in regular mode, its one leg: an engine in both roles computed the request whole."""
    req = history.request_by_tag(ho.tag)
    if req is None or not req.succeeded:
        return False
    if ho.role == "both":
        return ho.kind == "local" and ho.outcome == "computed"
    if ho.kind == "decode":
        return ho.outcome == "pulled" and _digest_ok(ho)
    if ho.kind == "prefill":
        if ho.outcome != "computed":
            return False
        decodes = [d for d in history.handoffs_by_tag(ho.tag) if d.kind == "decode"]
        # A prefill whose decode recomputed or failed did not hand anything off.
        return not decodes or any(d.outcome == "pulled" and _digest_ok(d) for d in decodes)
    return False


def _digest_ok(ho: Handoff) -> bool:
    return ho.kv_digest is None or ho.prompt_digest is None or ho.kv_digest == ho.prompt_digest


def _judge_fault(history: History, fault: FaultView, exp: RecoveryExpect) -> tuple[str, str, dict[str, Any]]:
    nums: dict[str, Any] = {
        "target": fault.target,
        "kind": fault.kind,
        "healed_t": rounded(fault.healed_t),
        "heal_to_ready_s": None,
        "ready_to_handoff_s": None,
        "heal_to_handoff_s": None,
    }
    if fault.healed_t is None:
        return "unknown", f"fault {fault.fault} was never healed", nums
    healed = fault.healed_t
    deadline = healed + exp.max_recovery_s
    # A new fault on the same target after the heal makes this one's recovery unmeasurable from then on.
    # (Actions between applied and healed, e.g. the respawn that ends a crash, are part of the outage.)
    later = [
        f.applied_t
        for f in history.fault_list()
        if f.target == fault.target
        and f.fault != fault.fault
        and f.applied_t is not None
        and f.applied_t > healed
    ]
    horizon = min([history.end_t, *later])
    ran_long_enough = horizon >= deadline

    ready_t: float | None = None
    workers = history.workers_for(fault.target)
    # A router whose worker list is not observable at all: measure heal -> handoff only.
    observed = bool(history.status)
    nums["ready_observed"] = observed
    # A router pause has no worker of its own: the router is back once it hands off again, through any.
    paused = fault.kind == "pause_router"
    if exp.require_ready and observed and not paused:
        if not workers:
            return "unknown", f"no router worker observed for target {fault.target!r}", nums
        # A worker the router still held Ready at the heal (a fault shorter than its probe could see,
        # e.g. a 2.5 s freeze under a 1 s interval and 2 s timeout) is back at once; the handoff
        # below still has to show it serving.
        seen = [healed if (p := history.status_at(w, healed)) is not None and p.status == READY
                else history.first_status_after(w, healed, READY) for w in workers]
        found = [t for t in seen if t is not None and t <= horizon]
        if not found:
            if ran_long_enough:
                return "fail", f"{fault.target} not seen Ready within {exp.max_recovery_s}s of heal", nums
            left = horizon - healed
            why = (f"run ended before {fault.target} was seen Ready again: it had {left:.2f} s after the "
                   f"heal (to the end or the next fault), the bound is {exp.max_recovery_s}s "
                   "(run longer: min_duration_s)")
            return "unknown", why, nums
        ready_t = min(found)
        nums["heal_to_ready_s"] = rounded(ready_t - healed)

    after = ready_t if ready_t is not None else healed
    first = next(
        (
            ho
            for ho in (history.handoffs if paused else history.handoffs_of(fault.target or ""))
            if after <= ho.at <= horizon and is_correct_handoff(history, ho)
        ),
        None,
    )
    if first is None:
        # Only traffic sent once the router could route to the worker again tells us anything.
        traffic = history.requests_started_in(after, deadline)
        if ran_long_enough and traffic:
            return (
                "fail",
                f"no correct handoff through {fault.target} within {exp.max_recovery_s}s of heal",
                nums,
            )
        if ran_long_enough:
            return "unknown", f"no requests sent within {exp.max_recovery_s}s after heal", nums
        return "unknown", f"run ended before a correct handoff through {fault.target}", nums
    nums["heal_to_handoff_s"] = rounded(first.at - healed)
    if ready_t is not None:
        nums["ready_to_handoff_s"] = rounded(first.at - ready_t)
    nums["first_handoff_tag"] = first.tag
    if first.at - healed > exp.max_recovery_s:
        return "fail", f"{fault.target} recovered in {first.at - healed:.2f}s > {exp.max_recovery_s}s", nums
    return "pass", "", nums


def check_recovery(history: History, exp: RecoveryExpect | None = None) -> Verdict:
    exp = exp or RecoveryExpect()
    faults = select_faults(history, exp.faults, exp.kinds)
    if not faults:
        return Verdict.unknown_(NAME, "no faults to recover from")
    asked = exp.max_recovery_s
    # A bound is written for the probe times the scenario asks; a router that took longer ones (a gateway's
    # whole seconds) gets the difference, as its contract explains it. What no setting explains still fails.
    slack = probe_slack_s(history)
    if slack > 0:
        exp = replace(exp, max_recovery_s=round(asked + slack, 3))
    per: dict[str, Any] = {}
    problems: dict[str, list[str]] = {"fail": [], "unknown": []}
    for f in faults:
        status, reason, nums = _judge_fault(history, f, exp)
        nums["status"] = status
        per[f.fault] = nums
        if status != "pass":
            problems[status].append(f"{f.fault}: {reason}")
    numbers = {"max_recovery_s": exp.max_recovery_s, "faults": per}
    widened = ""
    if slack > 0:
        numbers.update(asked_max_recovery_s=asked, probe_slack_s=slack)
        widened = f" (bound {asked:g}s + {slack:g}s for the probe times the router took)"
    if problems["fail"]:
        return Verdict.fail(
            NAME, "; ".join(problems["fail"]) + widened, numbers, cap(problems["fail"] + problems["unknown"])
        )
    if problems["unknown"]:
        return Verdict.unknown_(NAME, "; ".join(problems["unknown"]), numbers, cap(problems["unknown"]))
    worst = max(n["heal_to_handoff_s"] for n in per.values())
    return Verdict.ok(NAME, f"{len(per)} fault(s) recovered, slowest {worst:.2f}s{widened}", numbers)
