"""Metadata re-reads stay bounded (bug #5: an engine that reports no id must not be re-read every probe).

Counts the router's `metadata_read` events for the target's worker(s) from a timeline step on (the step's
time: its fault_applied, or the note a heal step leaves) until another step or the end.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from harness.checkers._common import rounded
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
    if not history.router_events:
        return Verdict.unknown_(NAME, "the router under test exposes no events")
    workers = set(history.workers_for(exp.target))
    if not workers:
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
    reads = [
        e for e in history.router_events_of("metadata_read") if e.worker in workers and start <= e.at <= end
    ]
    outcomes = Counter(str(e.get("outcome")) for e in reads)
    numbers = {
        "reads": len(reads),
        "outcomes": dict(outcomes),
        "window": [rounded(start, 3), rounded(end, 3)],
        "max_reads": exp.max_reads,
    }
    evidence = [f"t={e.at:.2f} {e.get('outcome')}" for e in reads[:25]]
    if len(reads) > exp.max_reads:
        return Verdict.fail(
            NAME, f"{len(reads)} metadata reads of {exp.target} (at most {exp.max_reads})", numbers, evidence
        )
    if len(reads) < exp.min_reads:
        return Verdict.fail(
            NAME, f"{len(reads)} metadata reads of {exp.target} (at least {exp.min_reads})", numbers, evidence
        )
    return Verdict.ok(NAME, f"{len(reads)} metadata read(s) of {exp.target}", numbers)
