"""What a real-time run of a search case showed, kept for its bug report: the failing checkers' reasons,
numbers and evidence, the router's command line as launched, and what the client saw (requests answered,
failed, lost; how long failures went on after the last heal).

Read from the run's history right after the run, since the next run of the seed reuses its folder. Plain
data (tuples, dicts of JSON values), so that it comes back from a pool worker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.history import History, RequestView, load_history
from harness.text import clip

# Evidence items kept per failing checker (a report shows a few; the run folder has them all).
EVIDENCE_KEPT = 8
# The history note that carries the router's argv (`harness.worlds.real.world`).
LAUNCH_NOTE = "router launch"


@dataclass(frozen=True)
class VerdictFacts:
    checker: str
    status: str
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClientView:
    """The run as its client saw it. `failed_by` counts failures by what came back (`HTTP 503`, `no
    answer: <error>`); requests carrying a client's deliberate mistake are left out of every count."""

    requests: int = 0
    succeeded: int = 0
    failed_by: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    slowest_success_s: float | None = None
    # The longest a failed request waited for its answer (a held request is a failure the user waits for).
    slowest_failure_s: float | None = None
    # After the last heal: when it was, requests sent since then, how many failed, and the last failure's
    # answer time (seconds after the heal; None: none failed).
    last_heal_t: float | None = None
    after_heal: int = 0
    failed_after_heal: int = 0
    last_failure_after_heal_s: float | None = None
    run_end_t: float = 0.0

    @property
    def failed(self) -> int:
        return sum(self.failed_by.values())


@dataclass(frozen=True)
class RunFacts:
    verdicts: tuple[VerdictFacts, ...] = ()
    router_argv: tuple[str, ...] = ()
    client: ClientView = field(default_factory=ClientView)
    run_dir: str = ""

    def verdict(self, checker: str) -> VerdictFacts | None:
        """The checker's failing verdict if it failed (a checker may be judged twice), else its first."""
        mine = [v for v in self.verdicts if v.checker == checker]
        return next((v for v in mine if v.status == "fail"), mine[0] if mine else None)


def _evidence_line(item: Any) -> str:
    if isinstance(item, dict):
        why = item.get("why") or item.get("reason")
        tag = item.get("tag") or item.get("request") or ""
        text = f"{tag}: {why}" if why and tag else str(why or item)
        return clip(text, 300)
    return clip(str(item), 300)


def verdict_facts(verdicts: Iterable[Any]) -> tuple[VerdictFacts, ...]:
    """Every verdict's status and reason; numbers and a few evidence lines for those that did not pass."""
    out = []
    for v in verdicts:
        keep = v.status != "pass"
        out.append(VerdictFacts(v.name, v.status, v.reason, dict(v.numbers) if keep else {},
                                tuple(_evidence_line(e) for e in v.evidence[:EVIDENCE_KEPT]) if keep else ()))
    return tuple(out)


def _failure_label(r: RequestView) -> str:
    if not r.completed:
        return "never answered"
    if r.timed_out:
        return "client gave up at its deadline"
    if r.status and r.ok and r.text_ok is False:
        return f"HTTP {r.status} with wrong output"
    if r.status and r.status < 400:
        # A stream that began well and then broke or carried an error.
        return f"HTTP {r.status}, then an error"
    if r.status:
        return f"HTTP {r.status}"
    return clip(f"no answer: {r.error or 'connection failed'}", 80)


def client_view(history: History) -> ClientView:
    reqs = [r for r in history.request_list() if r.mistake is None]
    failed = [r for r in reqs if not r.succeeded]
    heals = [f.healed_t for f in history.fault_list() if f.healed_t is not None]
    last_heal = max(heals) if heals else None
    after = [r for r in reqs if last_heal is not None and (r.start_t or 0.0) >= last_heal]
    failed_after = [r for r in after if not r.succeeded]
    ends = [r.completed_t if r.completed_t is not None else history.end_t for r in failed_after]
    ok_latencies = [r.latency_s for r in reqs if r.succeeded and r.latency_s is not None]
    failed_latencies = [r.latency_s for r in failed if r.latency_s is not None]
    return ClientView(
        requests=len(reqs),
        succeeded=len(reqs) - len(failed),
        failed_by=dict(Counter(_failure_label(r) for r in failed).most_common()),
        lost=sum(1 for r in failed if not r.completed or r.timed_out),
        slowest_success_s=round(max(ok_latencies), 3) if ok_latencies else None,
        slowest_failure_s=round(max(failed_latencies), 3) if failed_latencies else None,
        last_heal_t=None if last_heal is None else round(last_heal, 3),
        after_heal=len(after),
        failed_after_heal=len(failed_after),
        last_failure_after_heal_s=(round(max(ends) - last_heal, 3)
                                   if failed_after and last_heal is not None else None),
        run_end_t=round(history.end_t, 3),
    )


def router_argv(history: History) -> tuple[str, ...]:
    for r in history.of_type("note"):
        if r.get("message") == LAUNCH_NOTE and isinstance(r.get("argv"), list):
            return tuple(str(a) for a in r["argv"])
    return ()


def run_facts(verdicts: Iterable[Any], history_path: Path, run_dir: Path) -> RunFacts:
    """The facts of a finished run; a history that cannot be read leaves the client view empty."""
    facts = verdict_facts(verdicts)
    try:
        history = load_history(history_path)
    except OSError:
        return RunFacts(facts, run_dir=str(run_dir))
    return RunFacts(facts, router_argv(history), client_view(history), str(run_dir))
