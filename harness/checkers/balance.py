"""Load balance across the engines of a leg (bug #10: one policy instance shared by both legs sends every
request to the same prefill/decode pair under round robin)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from harness.checkers._common import rounded
from harness.history import History
from harness.verdict import Verdict

NAME = "balance"


@dataclass(frozen=True)
class BalanceExpect:
    """Each engine of a judged role handles its fair share within `max_skew` (largest relative distance
    from the mean, 0.5 = +-50%) over requests in [`start_s`, `end_s`) (None: the whole run). Roles with
    fewer than two engines are not judged; fewer than `min_requests` handoffs on a role is unknown."""

    roles: tuple[str, ...] = ("prefill", "decode")
    max_skew: float = 0.5
    min_requests: int = 20
    start_s: float | None = None
    end_s: float | None = None


def share_counts(history: History, role: str, start: float, end: float) -> Counter[str]:
    """Handoff records per engine of `role` (every engine of the role listed, zero when it got nothing)."""
    engines = [e for e in history.engines if history.engine_role(e) == role]
    counts: Counter[str] = Counter({e: 0 for e in engines})
    kinds = ("prefill",) if role == "prefill" else ("decode", "local")
    for h in history.handoffs:
        if h.engine in counts and h.kind in kinds and start <= h.at < end:
            counts[h.engine] += 1
    return counts


def check_balance(history: History, exp: BalanceExpect | None = None) -> Verdict:
    exp = exp or BalanceExpect()
    start = exp.start_s if exp.start_s is not None else 0.0
    end = exp.end_s if exp.end_s is not None else history.end_t + 1e-9
    per: dict[str, Any] = {}
    fails: list[str] = []
    unknowns: list[str] = []
    for role in exp.roles:
        counts = share_counts(history, role, start, end)
        if len(counts) < 2:
            continue
        total = sum(counts.values())
        mean = total / len(counts)
        skew = max(abs(n - mean) for n in counts.values()) / mean if mean else None
        per[role] = {"counts": dict(counts), "skew": rounded(skew, 3)}
        if total < exp.min_requests or skew is None:
            unknowns.append(f"{role}: {total} handoff(s), need {exp.min_requests}")
        elif skew > exp.max_skew:
            fails.append(f"{role}: skew {skew:.2f} > {exp.max_skew} ({dict(counts)})")
    numbers = {"max_skew": exp.max_skew, "roles": per}
    if fails:
        return Verdict.fail(NAME, "; ".join(fails), numbers, fails)
    if unknowns:
        return Verdict.unknown_(NAME, "; ".join(unknowns), numbers)
    if not per:
        return Verdict.unknown_(NAME, "no role with two or more engines to balance", numbers)
    return Verdict.ok(NAME, "load within skew on " + ", ".join(per), numbers)
