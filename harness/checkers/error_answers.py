"""Every error answer a router gives carries the OpenAI error body (CONTRACTS §2), whoever's the error:
`{"error": {"message", "type", "code"}}` with a message and a type that are text. A client reads the message
to learn what went wrong and the type to tell its own mistake from the server's; an OpenAI client library
parses that object. Both worlds' clients record what keeps a body from that shape (`body_problem` on the
request's `request_completed`, from `harness.value_checks.error_body_problem`).

A wrong body breaks nothing else a checker sees: a finding of its own, never the cause of another.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers._common import cap
from harness.history import History
from harness.verdict import Verdict

NAME = "error_answers"


@dataclass(frozen=True)
class ErrorAnswersExpect:
    """No parameter: the body is the contract's."""


def check_error_answers(history: History, exp: ErrorAnswersExpect | None = None) -> Verdict:
    answered = [r for r in history.request_list() if r.completed and (r.status or 0) >= 400]
    evidence = [f"router side: {r.tag} got {r.status}, but {r.body_problem}"
                for r in answered if r.body_problem]
    numbers = {"error_answers": len(answered), "without_body": len(evidence)}
    if evidence:
        return Verdict.fail(NAME, f"{len(evidence)} error answer(s) without the OpenAI error body", numbers,
                            cap(evidence))
    if not answered:
        return Verdict.ok(NAME, "no error answer to judge", numbers)
    return Verdict.ok(NAME, f"{len(answered)} error answer(s) with the OpenAI error body", numbers)
