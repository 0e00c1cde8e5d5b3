"""Handoff correctness, judged from the engines' provenance records (works for any router under test).

Problems: a stale engine id (the decode was told an id that is not the prefill's id in force), a silent
recompute (the decode prefilled locally although a handoff was expected), a digest mismatch (KV of another
prompt), failed or timed-out pulls. Right after a fault (from its application until `grace_s` after its heal)
stale ids, recomputes and failed pulls are allowed: the router cannot know yet. Wrong KV is never allowed.
Every problem counted says which side is at fault (`attribution`: the router told the decode something wrong,
or the engines got a correct handoff wrong) and why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from harness.checkers._common import cap, kind_matches, rounded
from harness.checkers.attribution import Blame, blame, sides_summary
from harness.history import Handoff, History, base_engine_id
from harness.verdict import Verdict

NAME = "handoff"


@dataclass(frozen=True)
class HandoffExpect:
    """`grace_s` after each fault's heal (and during it) stale ids, recomputes and failed pulls are excused;
    `excuse_kinds` limits which fault kinds open such a window (None: every fault). `excuse_in_flight`: a
    failed or timed-out pull whose prefill was faulted mid-handoff (see `source_lost`) is excused anyway:
    the router told the truth and could not undo it. `race_s`: how long before the prefill computed its
    fault may have been recorded (fault records are written just before the action takes effect)."""

    grace_s: float = 3.0
    allow_recompute: bool = False
    allow_failed: bool = False
    check_stale: bool = True
    excuse_kinds: tuple[str, ...] | None = None
    excuse_in_flight: bool = True
    race_s: float = 0.25


@dataclass(frozen=True)
class HandoffStrictExpect(HandoffExpect):
    """`handoff_strict`: no fault excuses anything unless its kind is listed in `excuse_kinds`."""

    excuse_kinds: tuple[str, ...] | None = ()


# A fault's `fault_applied` is stamped once its action returned (a kill, a proxy call): on a loaded machine
# the fault has already broken a pull a few milliseconds before that stamp. Windows open this much earlier.
FAULT_STAMP_SLACK_S = 0.05


def grace_windows(
    history: History, grace_s: float, kinds: tuple[str, ...] | None = None
) -> list[tuple[float, float]]:
    return [
        (start - FAULT_STAMP_SLACK_S, end + grace_s)
        for f, start, end in history.fault_windows()
        if kinds is None or kind_matches(f.kind, kinds)
    ]


def _in_windows(t: float, windows: list[tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in windows)


def expected_prefill_ids(history: History, d: Handoff) -> set[str] | None:
    """Engine ids the decode should have been told: the id of the prefill that computed this request (same
    tag), else the ids in force on prefill engines at the time. None when the history cannot say."""
    prefills = [p for p in history.handoffs_by_tag(d.tag) if p.kind == "prefill" and p.engine_id]
    if prefills:
        return {base_engine_id(p.engine_id) or "" for p in prefills}
    ids: set[str] = set()
    for engine in history.engines:
        if engine == d.engine or history.engine_role(engine) not in ("prefill", "both", None):
            continue
        eid = history.engine_id_at(engine, d.at)
        if eid:
            ids.add(base_engine_id(eid) or "")
    return ids or None


def source_lost(history: History, d: Handoff, race_s: float = 0.25) -> bool:
    """The decode was told the right id but its KV source went away mid-handoff: the prefill that computed
    this request was faulted (restart, crash, ...) between computing it and the decode's end."""
    prefills = [p for p in history.handoffs_by_tag(d.tag) if p.kind == "prefill"]
    if not prefills:
        return False
    p = prefills[-1]
    if (
        d.remote_engine_id
        and p.engine_id
        and base_engine_id(d.remote_engine_id) != base_engine_id(p.engine_id)
    ):
        return False
    return any(
        f.target == p.engine and f.applied_t is not None and p.at - race_s <= f.applied_t <= d.at
        for f in history.fault_list()
    )


def decode_lost(history: History, d: Handoff, race_s: float = 0.25) -> bool:
    """The decode engine itself was faulted while this record's request was on it. A fake decode killed
    mid-request writes no record at all; a recorder outside the engine (real vLLM's relay) writes the failed
    leg, which the fault explains."""
    return any(
        f.target == d.engine and f.applied_t is not None and decode_start(d) - race_s <= f.applied_t <= d.at
        for f in history.fault_list()
    )


def decode_start(d: Handoff) -> float:
    """When the decode began (records are stamped at their end)."""
    return d.at - (d.duration_s or 0.0)


def local_on_decodes(history: History) -> list[Handoff]:
    """`local` records on decode engines: a PD request that reached the decode with no KV parameters (e.g.
    Mooncake with no engine id to mint) and was computed there from scratch: a silent recompute too."""
    return [
        h
        for h in history.handoffs
        if h.kind == "local" and h.engine and history.engine_role(h.engine) == "decode"
    ]


def classify(history: History, d: Handoff, exp: HandoffExpect) -> list[str]:
    """Problems with one decode-side record (empty: fine)."""
    if d.kind == "local":
        return [] if exp.allow_recompute else ["local_compute"]
    problems = []
    if d.kv_digest is not None and d.prompt_digest is not None and d.kv_digest != d.prompt_digest:
        problems.append("digest_mismatch")
    if d.outcome == "recomputed" and not exp.allow_recompute:
        problems.append("recomputed")
    if d.outcome in ("failed", "timed_out") and not exp.allow_failed:
        problems.append(d.outcome)
    if exp.check_stale and d.remote_engine_id:
        expected = expected_prefill_ids(history, d)
        if expected is not None and base_engine_id(d.remote_engine_id) not in expected:
            problems.append("stale_engine_id")
    return problems


def check_handoff(history: History, exp: HandoffExpect | None = None) -> Verdict:
    exp = exp or HandoffExpect()
    decodes = sorted(
        [h for h in history.handoffs if h.kind == "decode"] + local_on_decodes(history), key=lambda h: h.at
    )
    if not decodes:
        return Verdict.unknown_(NAME, "no decode-side handoff records (engine provenance not collected?)")
    windows = grace_windows(history, exp.grace_s, exp.excuse_kinds)
    outcomes = Counter(str(d.outcome) if d.kind == "decode" else "local" for d in decodes)
    counts: Counter[str] = Counter()
    excused: Counter[str] = Counter()
    in_flight: Counter[str] = Counter()
    evidence: list[dict[str, Any]] = []
    blames: list[Blame] = []
    for d in decodes:
        for problem in classify(history, d, exp):
            if problem != "digest_mismatch" and _in_windows(decode_start(d), windows):
                excused[problem] += 1
                continue
            if (
                problem in ("failed", "timed_out")
                and exp.excuse_in_flight
                and (source_lost(history, d, exp.race_s) or decode_lost(history, d, exp.race_s))
            ):
                in_flight[problem] += 1
                continue
            counts[problem] += 1
            who = blame(history, d, problem)
            blames.append(who)
            evidence.append(
                {
                    "problem": problem,
                    # Whose fault first: a summary line of this evidence then names the mechanism.
                    "side": who.side,
                    "why": who.why,
                    "tag": d.tag,
                    "engine": d.engine,
                    "at": rounded(d.at, 3),
                    "remote_engine_id": d.remote_engine_id,
                    "outcome": d.outcome,
                    "error": d.error,
                }
            )
    numbers = {
        "decodes": len(decodes),
        "outcomes": dict(outcomes),
        "problems": dict(counts),
        "excused_in_grace": dict(excused),
        "excused_in_flight": dict(in_flight),
        "sides": {b.side: sum(1 for x in blames if x.side == b.side) for b in blames},
        "grace_s": exp.grace_s,
        "excuse_kinds": None if exp.excuse_kinds is None else list(exp.excuse_kinds),
    }
    if counts:
        summary = ", ".join(f"{n} {p}" for p, n in counts.most_common())
        sides = f"{sides_summary(blames)}; first: {blames[0].text()}"
        reason = f"bad handoffs outside grace windows: {summary} ({sides})"
        return Verdict.fail(NAME, reason, numbers, cap(evidence))
    return Verdict.ok(NAME, f"{len(decodes)} decode handoffs correct", numbers)


NO_LOCAL_NAME = "no_local_compute"
RESTART_KINDS = ("restart", "slow_start", "crash", "die", "respawn")


@dataclass(frozen=True)
class NoLocalComputeExpect:
    """`no_local_compute`: in a PD run no decode computes a request locally, except within `grace_s` after a
    fault of `excuse_kinds` (default: the process-level faults that change an engine id)."""

    grace_s: float = 2.0
    excuse_kinds: tuple[str, ...] | None = RESTART_KINDS


def check_no_local_compute(history: History, exp: NoLocalComputeExpect | None = None) -> Verdict:
    exp = exp or NoLocalComputeExpect()
    if not history.handoffs:
        return Verdict.unknown_(NO_LOCAL_NAME, "no engine handoff records")
    windows = grace_windows(history, exp.grace_s, exp.excuse_kinds)
    local = local_on_decodes(history)
    bad = [h for h in local if not _in_windows(decode_start(h), windows)]
    numbers = {
        "local_on_decodes": len(local),
        "outside_windows": len(bad),
        "excuse_kinds": None if exp.excuse_kinds is None else list(exp.excuse_kinds),
    }
    if bad:
        # A local compute is a decode leg that came with no handoff parameters: the router's doing.
        evidence = [f"router side: {h.engine} computed {h.tag} itself at t={h.at:.2f} (the router sent it no "
                    "kv_transfer_params)" for h in bad]
        reason = f"{len(bad)} request(s) computed locally on a decode (no handoff)"
        return Verdict.fail(NO_LOCAL_NAME, reason, numbers, cap(evidence))
    return Verdict.ok(NO_LOCAL_NAME, f"{len(local)} local compute(s), all excused", numbers)
