"""The router's worker API held to its contract on a client's mistakes (CONTRACTS §2).

A call the scenario makes as a mistake must be refused: `PatchWorker(..., refused=FIELD)` (a priority that is
not an integer, labels that are not text, a field no update may change) or `AddWorker(..., mistake=...,
refused=FIELD)` (a url that is none, a port out of range). It must be refused:
- with a 4xx, never a success or a server error;
- with an error body whose message names the field at fault, in any case (an operator fixing the call reads
  it): the OpenAI body `{"error": {"message", ...}}`, or a management API's own `{"error": "..."}` or
  `{"message": "..."}` (the worker API is no OpenAI endpoint: smg answers `{"error": TEXT, "code": ...}`);
- changing nothing: after a refused update the worker's labels, priority and the rest are what they were;
  after a refused registration the router lists no more workers than before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.checkers._common import cap
from harness.history import FaultView, History
from harness.value_checks import error_body_problem
from harness.verdict import Verdict

NAME = "worker_api"
_KEPT = ("labels", "priority", "connector", "bootstrap_port", "role", "url")


@dataclass(frozen=True)
class WorkerApiExpect:
    """No parameter: the contract is fixed."""


def _message(answer: Any) -> str | None:
    """The error message of an error body of one of the shapes the module doc names (None: none)."""
    if error_body_problem(answer) is None:
        return str(answer["error"]["message"])
    if isinstance(answer, dict):
        for key in ("error", "message"):
            if isinstance(answer.get(key), str) and answer[key]:
                return str(answer[key])
    return None


def _problems(f: FaultView, field: str) -> list[str]:
    status, answer = f.changed.get("status"), f.changed.get("answer")
    where = f"router side: its answer to {f.fault} ({f.kind} {f.target}, a mistake in {field})"
    if not (isinstance(status, int) and 400 <= status < 500):
        return [f"{where} was {status}, not a 4xx"]
    message = _message(answer)
    if message is None:
        return [f"{where}: its body says nothing of what is wrong ({error_body_problem(answer)})"]
    out = []
    if field.lower() not in message.lower():
        out.append(f"{where}: its message {message!r} does not name {field}")
    ev: Any = f.evidence if isinstance(f.evidence, dict) else {}
    before, after = ev.get("before"), ev.get("after")
    if isinstance(before, dict) and isinstance(after, dict):
        changed = [k for k in _KEPT if before.get(k) != after.get(k)]
        if changed:
            out.append(f"{where}: the refused call changed the worker's {', '.join(changed)}")
    if before is None and after is not None:
        out.append(f"{where}: the refused call registered the worker ({after.get('url')})")
    count, later = ev.get("workers_before"), ev.get("workers_after")
    if isinstance(count, int) and isinstance(later, int) and later > count:
        out.append(f"{where}: the router listed {count} worker(s) before the refused call, {later} after it")
    return out


def check_worker_api(history: History, exp: WorkerApiExpect | None = None) -> Verdict:
    mistakes = [f for f in history.fault_list() if f.applied_t is not None and f.changed.get("refused")]
    if not mistakes:
        return Verdict.unknown_(NAME, "no worker API call was made as a mistake: nothing to judge")
    evidence = [p for f in mistakes for p in _problems(f, str(f.changed["refused"]))]
    numbers = {"mistakes": len(mistakes)}
    if evidence:
        return Verdict.fail(NAME, f"{len(evidence)} worker API mistake(s) not refused as the contract says",
                            numbers, cap(evidence))
    return Verdict.ok(NAME, f"{len(mistakes)} worker API mistake(s) refused with a 4xx naming the field",
                      numbers)
