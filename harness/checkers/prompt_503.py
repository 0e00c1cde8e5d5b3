"""A sole-leg outage is answered with a prompt 503, never 404/500 or a hang (bug #8, #9, #12)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.checkers._common import cap, rounded, select_faults
from harness.history import READY, FaultView, History
from harness.verdict import Verdict

NAME = "prompt_503"


@dataclass(frozen=True)
class Prompt503Expect:
    """Requests sent during the outage must get 503 within `max_503_latency_s` (a 2xx is tolerated: e.g. a
    request the router served before it noticed).

    The outage window of each selected fault starts when the router is seen to drop the target (first
    non-Ready status after the fault, when `from_router_notice` and the status is observed), else
    `settle_s` after the fault was applied; it ends at the heal (or the run's end)."""

    max_503_latency_s: float = 1.0
    faults: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    settle_s: float = 0.0
    from_router_notice: bool = True


def outage_window(history: History, fault: FaultView, exp: Prompt503Expect) -> tuple[float, float]:
    applied, end = fault.window(history.end_t)
    start = applied + exp.settle_s
    if exp.from_router_notice:
        notices = []
        for w in history.workers_for(fault.target):
            notices += [p.t for p in history.status_timeline(w) if p.t >= applied and p.status != READY]
        if notices:
            start = max(applied, min(notices))
    return start, end


def _judge(r_status: int | None, latency: float | None, timed_out: bool, limit: float) -> str | None:
    if r_status is None:
        return "hang (no completion)"
    if timed_out or r_status == 0:
        return "hang (no response)" if timed_out else "no HTTP response"
    if 200 <= r_status < 300:
        return None
    if r_status != 503:
        return f"status {r_status}"
    if latency is None or latency > limit:
        return f"503 after {latency}s"
    return None


def check_prompt_503(history: History, exp: Prompt503Expect | None = None) -> Verdict:
    exp = exp or Prompt503Expect()
    faults = select_faults(history, exp.faults, exp.kinds)
    if not faults:
        return Verdict.unknown_(NAME, "no outage faults in the history")
    per: dict[str, Any] = {}
    evidence: list[str] = []
    judged = 0
    for f in faults:
        start, end = outage_window(history, f, exp)
        reqs = history.requests_started_in(start, end)
        counts = {"503": 0, "2xx": 0, "bad": 0, "pending": 0}
        worst = 0.0
        for r in reqs:
            if not r.completed and (r.deadline_t is None or r.deadline_t > history.end_t):
                counts["pending"] += 1
                continue
            problem = _judge(r.status, r.latency_s, r.timed_out, exp.max_503_latency_s)
            if r.status == 503 and r.latency_s is not None:
                worst = max(worst, r.latency_s)
            if problem is None:
                counts["2xx" if r.status and r.status < 300 else "503"] += 1
            else:
                counts["bad"] += 1
                evidence.append(f"{f.fault}: request {r.req}: {problem}")
        judged += counts["503"] + counts["2xx"] + counts["bad"]
        per[f.fault] = {
            "window": [rounded(start, 3), rounded(end, 3)],
            "requests": len(reqs),
            **counts,
            "max_503_latency_s": rounded(worst),
        }
    numbers = {"max_503_latency_s": exp.max_503_latency_s, "faults": per}
    if evidence:
        return Verdict.fail(
            NAME, f"{len(evidence)} request(s) not answered with a prompt 503", numbers, cap(evidence)
        )
    if judged == 0:
        return Verdict.unknown_(NAME, "no requests completed inside an outage window", numbers)
    if sum(p["503"] for p in per.values()) == 0:
        return Verdict.unknown_(
            NAME, "no 503 seen during the outage (did the fault take the leg down?)", numbers
        )
    return Verdict.ok(NAME, f"{judged} request(s) in outage windows answered promptly", numbers)
