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
        req = history.request_by_tag(tag)
        client = "" if req is None else f"; the client got {req.status} after {rounded(req.latency_s, 3)}s"
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
