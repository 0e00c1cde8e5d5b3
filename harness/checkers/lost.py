"""Nothing lost: every request ends with a response or a clear error before its deadline."""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers._common import cap
from harness.history import History
from harness.verdict import Verdict

NAME = "nothing_lost"


@dataclass(frozen=True)
class NothingLostExpect:
    """`tolerance_s`: slack on the deadline for the completion record to be written. `no_response_is_lost`:
    a completion with status 0 (connection dropped, no HTTP answer) counts as lost, not as a clear error."""

    tolerance_s: float = 0.5
    no_response_is_lost: bool = True


def check_nothing_lost(history: History, exp: NothingLostExpect | None = None) -> Verdict:
    exp = exp or NothingLostExpect()
    reqs = history.request_list()
    if not reqs:
        return Verdict.unknown_(NAME, "no requests in the history")
    lost: list[str] = []
    pending: list[str] = []
    for r in reqs:
        rid = str(r.req)
        deadline = r.deadline_t
        if not r.completed:
            if (deadline is not None and deadline + exp.tolerance_s <= history.end_t) or (
                deadline is None and history.complete
            ):
                lost.append(f"{rid}: never completed")
            else:
                pending.append(rid)
        elif r.timed_out:
            lost.append(f"{rid}: client gave up at its deadline")
        elif exp.no_response_is_lost and r.status == 0:
            lost.append(f"{rid}: no HTTP response ({r.error})")
        elif (
            deadline is not None and r.completed_t is not None and r.completed_t > deadline + exp.tolerance_s
        ):
            lost.append(f"{rid}: completed {r.completed_t - deadline:.2f}s after its deadline")
    numbers = {"requests": len(reqs), "lost": len(lost), "pending_at_end": len(pending)}
    if lost:
        return Verdict.fail(NAME, f"{len(lost)} of {len(reqs)} request(s) lost", numbers, cap(lost))
    if pending:
        return Verdict.unknown_(
            NAME, f"history ended with {len(pending)} request(s) before their deadline", numbers, cap(pending)
        )
    return Verdict.ok(NAME, f"all {len(reqs)} request(s) ended before their deadline", numbers)
