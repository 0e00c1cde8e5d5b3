"""Output correctness: a completion whose text differs from the expected one means wrong KV was used. Each
wrong completion says which side is at fault when the decode's record shows where its KV came from
(`attribution`)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers._common import cap
from harness.checkers.attribution import Blame, blame, sides_summary
from harness.history import History, RequestView
from harness.verdict import Verdict

NAME = "output"


@dataclass(frozen=True)
class OutputExpect:
    """`min_checked`: how many OK completions must have had their text checked for a pass."""

    min_checked: int = 1


def check_output(history: History, exp: OutputExpect | None = None) -> Verdict:
    exp = exp or OutputExpect()
    checked = [r for r in history.request_list() if r.text_ok is not None]
    wrong = [r for r in checked if r.text_ok is False]
    numbers = {"checked": len(checked), "wrong": len(wrong)}
    if wrong:
        blames = [_blame(history, r) for r in wrong]
        ids = [f"{r.req} ({r.tag})" + (f": {b.text()}" if b else "")
               for r, b in zip(wrong, blames, strict=True)]
        known = [b for b in blames if b]
        sides = f" ({sides_summary(known)}; first: {known[0].text()})" if known else ""
        return Verdict.fail(NAME, f"{len(wrong)} completion(s) with wrong output{sides}", numbers, cap(ids))
    if len(checked) < exp.min_checked:
        return Verdict.unknown_(
            NAME, f"only {len(checked)} output(s) checked, need {exp.min_checked}", numbers
        )
    return Verdict.ok(NAME, f"{len(checked)} output(s) correct", numbers)


def _blame(history: History, r: RequestView) -> Blame | None:
    """Why a completion's text is wrong, from its decode record (None: no record that says)."""
    for d in history.handoffs_by_tag(r.tag):
        if d.kind == "decode" and d.kv_digest and d.prompt_digest and d.kv_digest != d.prompt_digest:
            return blame(history, d, "digest_mismatch")
    return None
