"""PD legs are sequenced: a decode leg runs only for a request whose prefill leg succeeded (bug #9: legs sent
together, or the decode sent anyway after the prefill failed).

Judged from the engines' provenance records, so it works for any router: every decode-side record of a
request (a handoff, a local prefill on the decode, a failed or timed-out pull) needs a prefill-side record of
the same request (same prompt tag) that computed it. A decode that pulled its KV proves the prefill ran even
if that record was lost with a crashed engine. A decode leg without one is the router's doing: it sent a
decode for KV no prefill computed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from harness.checkers._common import cap, rounded
from harness.contract.evidence import REFUSED, Leg, engine_legs
from harness.history import Handoff, History
from harness.verdict import Verdict

NAME = "legs_sequenced"


@dataclass(frozen=True)
class LegsSequencedExpect:
    """`max_unsequenced`: decode legs without a computed prefill that are tolerated (0: none)."""

    max_unsequenced: int = 0


def _decode_side(h: Handoff) -> bool:
    return h.role == "decode" and h.kind in ("decode", "local")


def _prefill_computed(h: Handoff) -> bool:
    return h.role == "prefill" and h.kind == "prefill" and h.outcome == "computed"


def _client_saw(history: History, tag: str) -> str:
    req = history.request_by_tag(tag)
    return "" if req is None else f"; the client got {req.status} after {rounded(req.latency_s, 3)}s"


def check_legs_sequenced(history: History, exp: LegsSequencedExpect | None = None) -> Verdict:
    exp = exp or LegsSequencedExpect()
    decodes = [h for h in history.handoffs if _decode_side(h) and h.tag]
    if not decodes:
        return Verdict.unknown_(NAME, "no decode-side handoff records with a request tag")
    unsequenced: list[str] = []
    outcomes: Counter[str] = Counter()
    tags = {h.tag for h in decodes}
    for tag in sorted(t for t in tags if t):
        records = history.handoffs_by_tag(tag)
        if any(_prefill_computed(h) for h in records):
            continue
        mine = [h for h in records if _decode_side(h)]
        if any(h.kind == "decode" and h.outcome == "pulled" for h in mine):
            continue  # the KV arrived: a prefill computed it (its record may have gone with a crash)
        client = _client_saw(history, tag)
        for h in mine:
            outcomes[f"{h.kind}/{h.outcome}"] += 1
            xfer = f", transfer {h.transfer_id}" if h.transfer_id else ""
            unsequenced.append(
                f"router side: {h.engine} ran the decode leg of {tag} ({h.kind}, {h.outcome}{xfer}) although "
                f"no prefill computed that request{client}"
            )
    numbers = {"decode_requests": len(tags), "unsequenced": len(unsequenced), "outcomes": dict(outcomes)}
    if len(unsequenced) > exp.max_unsequenced:
        what = f"{len(unsequenced)} decode leg(s) ran for requests no prefill computed (legs not sequenced)"
        return Verdict.fail(NAME, what, numbers, cap(unsequenced))
    what = f"every decode leg of {len(tags)} request(s) followed a computed prefill"
    return Verdict.ok(NAME, what, numbers)


NAME_ONCE = "legs_once"


@dataclass(frozen=True)
class LegsOnceExpect:
    """`max_repeated`: client requests whose legs reached engines of one role more than once that are
    tolerated (0: none)."""

    max_repeated: int = 0


def _side(leg: Leg) -> str | None:
    """Which side of a request a leg an engine got stands for: prefill, decode, or the one leg of a router
    in regular mode (an engine in both roles running the request whole)."""
    if leg.role == "prefill" and leg.kind in ("prefill", REFUSED):
        return "prefill"
    if leg.role == "decode" and leg.kind in ("decode", "local", REFUSED):
        return "decode"
    if leg.role == "both" and leg.kind in ("local", REFUSED):
        return "regular"
    return None


def _what(leg: Leg) -> str:
    return f"refused {leg.status}" if leg.kind == REFUSED else str(leg.outcome)


def check_legs_once(history: History, exp: LegsOnceExpect | None = None) -> Verdict:
    """Each client request reaches the prefills once and the decodes once (in regular mode: its engines
    once). A correct router runs a leg again
    only when its engine never saw it (no record of it: not served, not refused), so a second leg of one
    request on one side means the router ran the request again after an engine had it: during an outage
    every retry is more load on the engines and more charges to their circuit breakers, and a failure that
    repeats costs each request several times over (bug retry_failed_requests). A leg an engine refused
    counts: it saw the request."""
    exp = exp or LegsOnceExpect()
    seen: dict[str, dict[str, list[Leg]]] = {}
    for leg in engine_legs(history):
        side = _side(leg)
        if leg.tag and side is not None:
            seen.setdefault(leg.tag, {}).setdefault(side, []).append(leg)
    if not seen:
        return Verdict.unknown_(NAME_ONCE, "no handoff records with a request tag")
    repeated: list[str] = []
    most = 0
    for tag in sorted(seen):
        for side, legs in sorted(seen[tag].items()):
            most = max(most, len(legs))
            if len(legs) < 2:
                continue
            client = _client_saw(history, tag)
            runs = ", ".join(f"{leg.engine} {_what(leg)} at {rounded(leg.at, 3)}s" for leg in legs)
            repeated.append(f"router side: {tag} reached the {side}s {len(legs)} times ({runs}){client}")
    numbers = {"requests": len(seen), "repeated": len(repeated), "most_records_per_side": most}
    if len(repeated) > exp.max_repeated:
        what = f"{len(repeated)} request leg(s) ran more than once on an engine (requests run again)"
        return Verdict.fail(NAME_ONCE, what, numbers, cap(repeated))
    what = f"each of {len(seen)} request(s) reached each role's engines once"
    return Verdict.ok(NAME_ONCE, what, numbers)
