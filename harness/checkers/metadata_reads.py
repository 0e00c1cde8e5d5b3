"""Metadata re-reads stay bounded (bug #5: an engine that reports no id must not be re-read every probe).

Counts the router's reads of the target's engine id from a timeline step on (the step's time: its
fault_applied, or the note a heal step leaves) until another step or the end: from the router's own
`metadata_read` events when it exposes them, else from the engines' side (each `GetServerInfo` or bootstrap
`/query` the router made: any router; its low-rate identity checks are allowed on top, as the engine cannot
tell them from re-reads).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from harness.checkers._common import rounded
from harness.contract.settings import ID_READ_CALLS, contract_of
from harness.history import History
from harness.verdict import Verdict

NAME = "metadata_reads"


@dataclass(frozen=True)
class MetadataReadsExpect:
    """`target`: engine name (or worker id/url); `from_fault`/`until_fault`: step names bounding the window
    (None: run start / run end); at most `max_reads` and at least `min_reads` reads inside it."""

    target: str = ""
    from_fault: str | None = None
    until_fault: str | None = None
    max_reads: int = 3
    min_reads: int = 0


def check_metadata_reads(history: History, exp: MetadataReadsExpect | None = None) -> Verdict:
    exp = exp or MetadataReadsExpect()
    if not exp.target:
        return Verdict.unknown_(NAME, "no target given")
    # The router's own events tell a re-read from an identity check; the engines cannot (both are reads).
    engine_side = not history.router_events and bool(history.router_calls())
    if not engine_side and not history.router_events:
        return Verdict.unknown_(NAME, "the engines recorded no router call and the router exposes no events")
    workers = set(history.workers_for(exp.target))
    if not engine_side and not workers:
        return Verdict.unknown_(NAME, f"no router worker observed for {exp.target!r}")
    start = 0.0
    if exp.from_fault is not None:
        t = history.step_time(exp.from_fault)
        if t is None:
            return Verdict.unknown_(NAME, f"step {exp.from_fault!r} never happened")
        start = t
    end = history.end_t
    if exp.until_fault is not None:
        t = history.step_time(exp.until_fault)
        end = t if t is not None else end
    allowed = exp.max_reads
    if engine_side:
        # One read is one GetServerInfo (a partial read adds a GetModelInfo) or one bootstrap `/query`. The
        # engine cannot tell a re-read from the router's low-rate identity check: those are allowed on top.
        calls = [c for c in history.engine_calls_of(exp.target, *ID_READ_CALLS) if start <= c.at <= end]
        outcomes = Counter(f"{c.call} {c.status}" for c in calls)
        evidence = [f"t={c.at:.2f} {c.call} answered {c.status}" for c in calls[:25]]
        count = len(calls)
        contract = contract_of(history)
        identity = contract.identity_check_interval_s if contract is not None else None
        if identity:
            allowed += math.ceil((end - start) / identity) + 1
    else:
        reads = [e for e in history.router_events_of("metadata_read")
                 if e.worker in workers and start <= e.at <= end]
        outcomes = Counter(str(e.get("outcome")) for e in reads)
        evidence = [f"t={e.at:.2f} {e.get('outcome')}" for e in reads[:25]]
        count = len(reads)
    numbers = {
        "reads": count,
        "outcomes": dict(outcomes),
        "window": [rounded(start, 3), rounded(end, 3)],
        "max_reads": exp.max_reads,
        "allowed": allowed,
        "source": "engines" if engine_side else "router events",
    }
    if count > allowed:
        extra = "" if allowed == exp.max_reads else f": {exp.max_reads} and the identity checks"
        return Verdict.fail(
            NAME, f"{count} metadata reads of {exp.target} (at most {allowed}{extra})", numbers, evidence
        )
    if count < exp.min_reads:
        return Verdict.fail(
            NAME, f"{count} metadata reads of {exp.target} (at least {exp.min_reads})", numbers, evidence
        )
    return Verdict.ok(NAME, f"{count} metadata read(s) of {exp.target}", numbers)
