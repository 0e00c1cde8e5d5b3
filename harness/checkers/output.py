"""Output correctness: a completion whose text differs from the expected one means wrong KV was used."""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers._common import cap
from harness.history import History
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
        ids = [f"{r.req} ({r.tag})" for r in wrong]
        return Verdict.fail(NAME, f"{len(wrong)} completion(s) with wrong output", numbers, cap(ids))
    if len(checked) < exp.min_checked:
        return Verdict.unknown_(
            NAME, f"only {len(checked)} output(s) checked, need {exp.min_checked}", numbers
        )
    return Verdict.ok(NAME, f"{len(checked)} output(s) correct", numbers)
