"""No request waited out a KV transfer timeout (bug #2491's hang, scaled down)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers._common import cap, find_setting, rounded
from harness.checkers.attribution import blame, sides_summary
from harness.checkers.handoff import source_lost
from harness.checkers.stats import percentiles
from harness.history import History
from harness.verdict import Verdict

NAME = "transfer_timeout"
SETTING_NAMES = ("transfer_timeout_s", "transfer_timeout")


@dataclass(frozen=True)
class TransferTimeoutExpect:
    """`transfer_timeout_s`: the decode's transfer timeout (None: read from run settings). `margin`: a request
    counts as having waited it out when its latency >= transfer_timeout_s * margin. `excuse_in_flight`: a
    wait whose prefill was faulted mid-handoff (`handoff.source_lost`) is not the router's doing: counted
    apart, not failed. A router that keeps sending decodes to a dead source still fails (stale id)."""

    transfer_timeout_s: float | None = None
    margin: float = 1.0
    excuse_in_flight: bool = True
    race_s: float = 0.25


def check_transfer_timeout(history: History, exp: TransferTimeoutExpect | None = None) -> Verdict:
    exp = exp or TransferTimeoutExpect()
    timeout = exp.transfer_timeout_s
    if timeout is None:
        timeout = find_setting(history.settings, SETTING_NAMES)
    evidence: list[str] = []

    def lost_source(tag: str | None) -> bool:
        return exp.excuse_in_flight and any(
            d.kind == "decode" and source_lost(history, d, exp.race_s) for d in history.handoffs_by_tag(tag)
        )

    timed_out = [h for h in history.handoffs if h.outcome == "timed_out" and not lost_source(h.tag)]
    excused = {h.tag for h in history.handoffs if h.outcome == "timed_out"} - {h.tag for h in timed_out}
    blames = [blame(history, h, "timed_out") for h in timed_out]
    evidence += [f"handoff {h.tag} on {h.engine} timed_out after {rounded(h.duration_s, 3)}s: {b.text()}"
                 for h, b in zip(timed_out, blames, strict=True)]
    slow: list[str] = []
    # One request may show twice (its decode's timed_out handoff and its own latency): counted once.
    waiting: set[object] = {h.tag if h.tag is not None else ("handoff", id(h)) for h in timed_out}
    if timeout is not None:
        limit = timeout * exp.margin
        for r in history.request_list():
            start = r.start_t
            if r.tag is not None and lost_source(r.tag):
                excused.add(r.tag)
                continue
            if r.completed and r.latency_s is not None and r.latency_s >= limit:
                slow.append(f"request {r.req} took {r.latency_s:.2f}s")
            elif not r.completed and start is not None and history.end_t - start >= limit:
                slow.append(f"request {r.req} still open {history.end_t - start:.2f}s at the end")
            else:
                continue
            waiting.add(r.tag if r.tag is not None else ("req", r.req))
    evidence += slow
    numbers = {
        "transfer_timeout_s": timeout,
        "timed_out_handoffs": len(timed_out),
        "slow_requests": len(slow),
        "excused_in_flight": len(excused),
        "max_latency_s": rounded(max((r.latency_s or 0.0 for r in history.requests.values()), default=None)),
        "latency_s": percentiles(r.latency_s for r in history.requests.values() if r.completed),
    }
    if evidence:
        sides = f" (handoffs: {sides_summary(blames)}; first: {blames[0].text()})" if blames else ""
        return Verdict.fail(
            NAME, f"{len(waiting)} request(s) waited out the transfer timeout{sides}", numbers, cap(evidence)
        )
    if not history.requests:
        return Verdict.unknown_(NAME, "no requests in the history", numbers)
    if timeout is None and not history.handoffs:
        return Verdict.unknown_(NAME, "transfer timeout unknown and no handoff records: cannot tell", numbers)
    return Verdict.ok(NAME, "no request waited out the transfer timeout", numbers)
