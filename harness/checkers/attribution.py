"""Whose fault a bad handoff is, from the engines' provenance records and the fault ledger.

The router's side of a handoff is what it told the decode: the prefill's engine id (minted for Mooncake,
relayed for NIXL) and the transfer (Mooncake `transfer_id`, NIXL `remote_request_id`). When those match the
prefill that computed the request (same tag) and the id was in force, the router told the truth and whatever
went wrong after is the engines' (wrong KV handed out, a pull sent to another peer, a stop that did not wait
for its pulls) or an injected fault's (the prefill was restarted or cut mid-handoff). Sides: `router`,
`engine`, `fault` (the scenario's own fault, nobody's bug), `unknown` (the records cannot say).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.checkers._common import find_setting, kind_matches
from harness.contract.evidence import misreported
from harness.history import FaultView, Handoff, History, base_engine_id

SIDES = ("router", "engine", "fault", "unknown")
# Faults a prefill survives by design: a graceful stop promises to serve the KV it handed out.
GRACEFUL_KINDS = ("graceful_stop",)


@dataclass(frozen=True)
class Blame:
    side: str
    why: str

    def text(self) -> str:
        return f"{_label(self.side)}: {self.why}"


def _label(side: str) -> str:
    return f"{side} side" if side in ("router", "engine") else side


def short(engine_id: str | None) -> str:
    """An engine id as evidence shows it (its first 8 characters: enough to tell two starts apart)."""
    return (engine_id or "none")[:8]


def prefill_of(history: History, d: Handoff) -> Handoff | None:
    """The prefill record of the decode's request (same tag), the last one if the request was retried."""
    prefills = [p for p in history.handoffs_by_tag(d.tag) if p.kind == "prefill"]
    return prefills[-1] if prefills else None


def decode_started(d: Handoff) -> float:
    return d.at - (d.duration_s or 0.0)


def blame(history: History, d: Handoff, problem: str) -> Blame:
    """Which side `problem` (a `handoff.classify` problem) of decode record `d` is on, and why."""
    if problem == "local_compute":
        why = f"{d.engine} got {d.tag} with no kv_transfer_params: the router sent no handoff"
        return Blame("router", why)
    if problem == "recomputed" and (d.error or "").startswith("incomplete kv_transfer_params"):
        return Blame("router", f"{d.engine} got incomplete kv_transfer_params for {d.tag} ({d.error})")
    p = prefill_of(history, d)
    if p is None:
        why = f"no prefill record for {d.tag}: cannot tell what the router should have sent"
        return Blame("unknown", why)
    lie = _engine_told_wrong(history, d, p)
    if lie is not None:
        return Blame("engine", lie)
    wrong = _router_told_wrong(history, d, p)
    if wrong is not None:
        return Blame("router", wrong)
    if problem == "digest_mismatch":
        return _wrong_kv(history, d, p)
    if problem in ("failed", "timed_out", "recomputed"):
        return _lost_pull(history, d, p)
    return Blame("unknown", f"{problem} with the router's parameters right")


def _engine_told_wrong(history: History, d: Handoff, p: Handoff) -> str | None:
    """The router passed on an engine id the prefill itself reported while it served as another: the
    engine's word was wrong, not the router (None: not so)."""
    told, real = base_engine_id(d.remote_engine_id), base_engine_id(p.engine_id)
    if not told or not real or told == real:
        return None
    call = misreported(history, p.engine or "", told)
    if call is None:
        return None
    return (f"{d.engine} was told engine id {short(told)} for {d.tag}, the id {p.engine} itself reported in "
            f"its {call.call} at t={call.at:.2f} while it served as {short(call.engine_id)}: the router "
            "passed on what the engine told it")


def _router_told_wrong(history: History, d: Handoff, p: Handoff) -> str | None:
    """What the router told the decode that does not match the prefill that computed the request, or None."""
    told, real = base_engine_id(d.remote_engine_id), base_engine_id(p.engine_id)
    if told and real and told != real:
        return (f"{d.engine} was told engine id {short(told)} for {d.tag}, but {p.engine} computed it as "
                f"{short(real)} (its id in force)")
    mine, theirs = _transfer(d), _transfer(p, prefill=True)
    if mine and theirs and mine != theirs:
        prefills = (h for h in history.handoffs if h.kind == "prefill")
        owner = next((h for h in prefills if _transfer(h, prefill=True) == mine), None)
        whose = f"which {owner.engine} computed for {owner.tag}" if owner else "which no prefill computed"
        return f"{d.engine} was given transfer {mine} for {d.tag}, {whose} (its own is {theirs})"
    return None


def _transfer(h: Handoff, prefill: bool = False) -> str | None:
    """The key the KV is held under: Mooncake transfer id, else (NIXL) the prefill's request id."""
    if h.transfer_id:
        return h.transfer_id
    return h.request_id if prefill else h.remote_request_id


def _in_force(history: History, d: Handoff, p: Handoff) -> str:
    now_id = base_engine_id(history.engine_id_at(p.engine or "", decode_started(d)))
    return "in force then" if now_id == base_engine_id(p.engine_id) else f"replaced by {short(now_id)} since"


def _wrong_kv(history: History, d: Handoff, p: Handoff) -> Blame:
    """The router sent the right id and transfer, and the KV that came back belongs to another prompt."""
    verb = "minted" if d.transfer_id else "relayed"
    why = (f"{d.engine} pulled transfer {_transfer(d)} from {p.engine} (engine id {short(p.engine_id)}, "
           f"the one the router {verb}, {_in_force(history, d, p)}) and got another prompt's KV (digest "
           f"{d.kv_digest}, the prompt's is {d.prompt_digest}")
    other = next((h for h in history.handoffs if h.kind == "prefill" and h.prompt_digest == d.kv_digest
                  and h.tag != d.tag), None)
    why += f": the KV of {other.tag}, computed at t={other.at:.2f})" if other else ")"
    abort = find_setting(history.settings, ("kv_abort_timeout_s",))
    late = decode_started(d) - p.at
    if abort is not None and late > abort:
        why += (f"; the decode reached it {late:.2f} s after the prefill computed it, past the KV abort "
                f"timeout ({abort:g} s): the prefill gave out blocks a decode still had to read")
    return Blame("engine", why)


def _lost_pull(history: History, d: Handoff, p: Handoff) -> Blame:
    """The router sent the right id and transfer, and the pull failed or timed out."""
    told, asked = base_engine_id(d.remote_engine_id), base_engine_id(d.peer_engine_id)
    if told and asked and told != asked:
        where = d.peer or "?"
        earlier = _start_of(history, asked)
        return Blame("engine", f"{d.engine} was told {p.engine}'s engine id {short(told)} "
                               f"({_in_force(history, d, p)}) but pulled from the peer it had cached as "
                               f"{short(asked)}{earlier} at {where}: its handshake/bootstrap cache follows "
                               "the address, not the engine id")
    for f in history.fault_list():
        if f.target != p.engine or f.applied_t is None or not (p.at - 0.25 <= f.applied_t <= d.at):
            continue
        end = _stop_end(history, f.fault) if kind_matches(f.kind, GRACEFUL_KINDS) else None
        if end is not None and not end.get("killed_after_grace"):
            exited = end.get("exited_after_s")
            after = f" and exited {exited:.2f} s later" if isinstance(exited, int | float) else ""
            start = decode_started(d)
            return Blame("engine", f"{p.engine} held the KV of {d.tag} (computed at t={p.at:.2f}) when it "
                                   f"was stopped gracefully at t={f.applied_t:.2f} ({f.fault}){after}, "
                                   f"without waiting for {d.engine}'s pull (started t={start:.2f}): a "
                                   "graceful stop must let in-flight KV pulls finish")
        return Blame("fault", f"{p.engine} had fault {f.fault} ({f.kind}) at t={f.applied_t:.2f}, while "
                              f"{d.engine} was to pull {d.tag}")
    link = _pull_link_fault(history, d, p)
    if link is not None:
        start, end = link.window(history.end_t)
        return Blame("fault", f"{p.engine}'s {link.params.get('link')} link had fault {link.fault} "
                              f"({link.kind}) from t={start:.2f} to t={end:.2f}, while {d.engine} pulled "
                              f"{d.tag} (t={decode_started(d):.2f} to t={d.at:.2f})")
    return Blame("unknown", f"{d.outcome} pull of {d.tag} from {p.engine} with the router's parameters "
                            f"right (engine id {short(told)}, transfer {_transfer(d)}) and no fault on it: "
                            f"{d.error}")


# The links a decode's pull crosses to its prefill (a fault on `serve` does not touch a pull).
PULL_LINKS = ("side_channel", "bootstrap")


def _pull_link_fault(history: History, d: Handoff, p: Handoff) -> FaultView | None:
    """A fault on a link the pull of `d` crosses to prefill `p`, in force at some time during the pull
    (applied before the prefill computed, it is not caught by the applied-during-handoff rule)."""
    began = decode_started(d)
    for f in history.fault_list():
        if f.target != p.engine or f.applied_t is None or f.params.get("link") not in PULL_LINKS:
            continue
        start, end = f.window(history.end_t)
        if start <= d.at and end >= began:
            return f
    return None


def _stop_end(history: History, fault: str) -> dict[str, Any] | None:
    """How a graceful stop ended (the world's note: `exited_after_s`, `killed_after_grace`), or None."""
    for r in history.of_type("note"):
        if r.get("fault") == fault and "exited_after_s" in r:
            return r
    return None


def _start_of(history: History, engine_id: str) -> str:
    """", an earlier start of prefill-0" when some engine had that id, else ""."""
    for name, states in history.engines.items():
        if any(base_engine_id(s.engine_id) == engine_id for s in states):
            return f", an earlier start of {name}"
    return ""


def sides_summary(blames: list[Blame]) -> str:
    """`engine side: 3, router side: 1` (the sides present, most first)."""
    counts: dict[str, int] = {}
    for b in blames:
        counts[b.side] = counts.get(b.side, 0) + 1
    order = sorted(counts.items(), key=lambda kv: (-kv[1], SIDES.index(kv[0])))
    return ", ".join(f"{_label(side)}: {n}" for side, n in order)
