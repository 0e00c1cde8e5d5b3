"""Minting and relaying per request: each decode's KV parameters equal what the contract derives from the
prefill that computed the request (docs/DESIGN.md §2), judged request by request from the engines' records.

Mooncake (the router mints): the decode's `transfer_id` is the one its prefill leg carried; its
`remote_engine_id` is an id that prefill reported (a metadata read or its bootstrap `/query`), and the
prefill's id in force once the router had time to learn it: a restart must be noticed within the
identity-check bound (`identity_check_interval_s` plus two probe timeouts and a probe interval's tick),
counted from when a read could give the new id (after a fault that hid it), else the dead id goes on being
minted. A router that knows an id (some read of it returned one) must mint: a read never clears a known id.
NIXL (the router relays): the decode gets the prefill's answer verbatim, so its `remote_engine_id` and
`remote_request_id` name that prefill's computation (an engine id of "" where the harness had the prefill
report none, fault `no_engine_id`: that is what its answer said).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import yarl

from harness.checkers._common import cap, judged_from_engines
from harness.contract.evidence import EngineView, Leg, misreported
from harness.history import History
from harness.topology import CONNECTORS
from harness.verdict import Verdict

NAME = "handoff_params"
# A found line that is the engine's doing, not the router's (evidence says `engine side:`).
ENGINE_SIDE = "engine side: "


@dataclass(frozen=True)
class HandoffParamsExpect:
    """`slack_s`: observation slack around each moment compared."""

    slack_s: float = 0.1


def _id_since(view: EngineView, engine: str, engine_id: str) -> float | None:
    """When `engine` started serving as `engine_id`."""
    for state in view.history.engines.get(engine, []):
        if state.engine_id == engine_id:
            return state.t
    return None


# Faults that keep the router from reading an engine's id: it reports none, its read fails or is held.
_ID_HIDDEN = ("no_engine_id", "fail_server_info")
_READ_SURFACES = ("all", "metadata", "server_info")
# The links a router reads an engine's id over: its serving port (GetServerInfo, /v1/models, /version) and the
# Mooncake bootstrap server (`/query`).
_ID_LINKS = (None, "serve", "bootstrap")


def _id_readable_since(history: History, engine: str, since: float | None, until: float) -> float | None:
    """When the router could first read the id `engine` has served since `since`: the refresh bound runs from
    the end of the last fault meanwhile that hid it, on the engine or on a link the id is read over (a router
    keeps minting the id it knows until a read gives it another)."""
    if since is None:
        return None
    for f in history.fault_list():
        kind = (f.kind or "").split(":")[-1]
        hides = kind in _ID_HIDDEN or (
            kind in ("wedge", "latency") and f.params.get("surface", "all") in _READ_SURFACES) or (
            kind.startswith("link_") and f.params.get("link") in _ID_LINKS)
        if f.target != engine or f.applied_t is None or not hides:
            continue
        start, end = f.window(history.end_t)
        if start <= until and end >= since:
            since = max(since, end)
    return since


def refresh_bound_s(view: EngineView) -> float | None:
    c = view.contract
    rule = c.rules.get("id_refresh_bound_s")
    if isinstance(rule, int | float):
        return float(rule)
    if c.identity_check_interval_s is None:
        return None
    return c.identity_check_interval_s + 2 * c.probe_timeout_s + c.interval_s / 10


def _bootstrap_addr_problem(view: EngineView, prefill: str, addr: object) -> str | None:
    """What keeps `addr` from naming `prefill`'s bootstrap server as an HTTP client reads it (None: nothing
    wrong that the records show): a URL that does not parse, or another host than the prefill's."""
    url = (view.history.settings.get("engines_layout") or {}).get(prefill, {}).get("url")
    if not isinstance(url, str) or addr is None:
        return None
    try:
        host = yarl.URL(str(addr)).host
    except ValueError as exc:
        return f"the decode was told bootstrap address {addr!r}, which is no URL ({exc})"
    want = yarl.URL(url).host
    if host != want:
        return f"the decode was told bootstrap address {addr!r}, but {prefill} runs on host {want}"
    return None


def _mooncake(view: EngineView, tag: str, p: Leg, d: Leg, slack: float) -> list[str]:
    out: list[str] = []
    kv = d.leg.get("kv_transfer_params") if d.leg else None
    told = p.leg.get("kv_transfer_params") if p.leg else None
    known = [(t, i) for t, i in view.ids_reported(p.engine) if t <= p.at + slack]
    if not isinstance(kv, dict) or not kv:
        if known and not isinstance(told, dict):
            last_t, last = known[-1]
            out.append(f"{tag} was not minted, though {p.engine} reported id {last} at t={last_t:.3f}: "
                       "a read never clears a known id")
        return out
    if isinstance(told, dict) and kv.get("transfer_id") != told.get("transfer_id"):
        out.append(f"{tag}: the decode was told transfer {kv.get('transfer_id')}, the prefill leg carried "
                   f"{told.get('transfer_id')}")
    wrong_addr = _bootstrap_addr_problem(view, p.engine, kv.get("remote_bootstrap_addr"))
    if wrong_addr is not None:
        out.append(f"{tag}: {wrong_addr}")
    minted = kv.get("remote_engine_id")
    base = minted.split("_dp")[0] if isinstance(minted, str) else minted
    if base not in {i for _, i in view.ids_reported(p.engine)} | {s.engine_id for s in
                                                                   view.history.engines.get(p.engine, [])}:
        out.append(f"{tag}: minted engine id {minted}, which {p.engine} never had nor reported")
        return out
    if p.engine_id and base != p.engine_id:
        since = _id_readable_since(view.history, p.engine, _id_since(view, p.engine, p.engine_id), d.at)
        bound = refresh_bound_s(view)
        lied = misreported(view.history, p.engine, base)
        if lied is not None:
            out.append(f"{ENGINE_SIDE}{tag}: minted {minted}, the id {p.engine} itself reported in its "
                       f"{lied.call} at t={lied.at:.3f} while it served as {lied.engine_id}")
        elif since is not None and (bound is None or d.at - since > bound + slack):
            limit = "no refresh bound: the router never re-reads it" if bound is None else f"bound {bound:g}s"
            out.append(f"{tag}: minted {minted} at t={d.at:.3f}, but {p.engine} serves as {p.engine_id} "
                       f"since t={since:.3f} ({limit})")
    return out


def ids_answered(history: History, p: Leg, slack: float) -> set[str | None]:
    """The engine ids a NIXL prefill's answer may have carried for leg `p`: its id, and "" where the
    harness had it report none (fault `no_engine_id`) at some moment within `slack` of the leg; only ""
    when that fault held throughout."""
    end = history.end_t
    silent = [f.window(end) for f in history.fault_list()
              if f.target == p.engine and (f.kind or "").split(":")[-1] == "no_engine_id"]
    near = any(a <= p.at + slack and p.at - slack <= b for a, b in silent)
    throughout = any(a <= p.at - slack and p.at + slack <= b for a, b in silent)
    return ({""} if near else set()) | (set() if throughout else {p.engine_id})


def _nixl(history: History, tag: str, p: Leg, d: Leg, request_id: str | None, slack: float) -> list[str]:
    kv = d.leg.get("kv_transfer_params") if d.leg else None
    if not isinstance(kv, dict) or not kv:
        if p.leg.get("stop"):
            # The router's doing still, one step earlier: a stop string may end the prefill short of its
            # length cap, and vLLM's prefill then answers no params to relay.
            return [f"{tag}: {p.engine}'s prefill leg kept stop strings {p.leg['stop']!r}, so it may end "
                    f"short of its length cap and answer no params: {d.engine} got none"]
        return [f"{tag}: {p.engine} computed the prefill but its params were not relayed to {d.engine}"]
    out = []
    answered = ids_answered(history, p, slack)
    if kv.get("remote_engine_id") not in answered:
        said = " or ".join(repr(i) for i in sorted(answered, key=str))
        out.append(f"{tag}: the decode was told engine {kv.get('remote_engine_id')!r}, the prefill ran as "
                   f"{p.engine_id} and its answer said {said}")
    if request_id is not None and kv.get("remote_request_id") not in (None, request_id):
        out.append(f"{tag}: the decode was told request {kv.get('remote_request_id')}, the prefill's was "
                   f"{request_id}")
    return out


@judged_from_engines(NAME, HandoffParamsExpect)
def check_handoff_params(view: EngineView, exp: HandoffParamsExpect) -> Verdict:
    history = view.history
    connector = view.contract.connector
    if view.workers("regular") and not view.workers("prefill"):
        return Verdict.ok(NAME, "a router in regular mode: no handoff to judge (leg_shape holds its legs to "
                          "none)", {"requests": 0})
    if connector not in CONNECTORS:
        return Verdict.unknown_(NAME, f"no handoff contract for connector {connector!r}")
    by_tag: dict[str, dict[str, list[Leg]]] = defaultdict(lambda: defaultdict(list))
    for leg in view.legs():
        if leg.tag is not None and leg.leg:
            by_tag[leg.tag][view.roles.get(leg.engine, "")].append(leg)
    request_ids = {h.tag: h.request_id for h in history.handoffs if h.kind == "prefill"}
    evidence: list[str] = []
    judged = 0
    for tag, legs in by_tag.items():
        prefills = [p for p in legs.get("prefill", []) if p.kind == "prefill" and p.outcome == "computed"]
        decodes = [d for d in legs.get("decode", []) if d.kind != "refused"]
        if len(prefills) != 1 or not decodes:
            continue  # no computed prefill, or run twice: legs_once and status_contract judge those
        judged += 1
        p, d = prefills[0], decodes[0]
        found = (_mooncake(view, tag, p, d, exp.slack_s) if connector == "mooncake"
                 else _nixl(history, tag, p, d, request_ids.get(tag), exp.slack_s))
        evidence.extend(line if line.startswith(ENGINE_SIDE) else f"router side: {line}" for line in found)
    numbers = {"requests": judged, "bad": len(evidence), "refresh_bound_s": refresh_bound_s(view)}
    if evidence:
        what = f"{len(evidence)} handoff parameter(s) not what the contract derives"
        return Verdict.fail(NAME, what, numbers, cap(evidence))
    if judged == 0:
        return Verdict.unknown_(NAME, "no request with a computed prefill and a decode leg", numbers)
    return Verdict.ok(NAME, f"{judged} requests handed off with the parameters the contract derives", numbers)
