"""Leg shape: every leg reached its engine as the PD contract says it must (docs/DESIGN.md §2).

A prefill leg is sanitised: not streamed, one token (`max_tokens` 1), one choice, no `min_tokens` above
its `max_tokens`, no `stream_options` nor stop strings, `ignore_eos` (or `min_tokens` 1), and tagged for a
remote decode (`do_remote_decode` true, `do_remote_prefill` false; Mooncake: the minted `transfer_id`).
A decode leg carries the client's own parameters (stream, max_tokens, min_tokens, n) and, when it hands off,
`do_remote_prefill` true. A router in regular mode sends its one leg with the client's parameters and no
handoff parameters at all. No leg carries a field the engine does not know, nor a KV key no connector
reads: vLLM passes them by (a warning at most), so a misspelt name is a setting silently lost. The harness's
client sends only fields vLLM knows, so such a field on a leg is the router's. Judged from
what the engines recorded of each leg (`leg` on their records), so it holds for any router; a gateway
that documents another shape says so through its adapter's rules (`prefill_max_tokens`,
`prefill_ignore_eos`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from harness.checkers._common import cap, judged_from_engines
from harness.contract.evidence import EngineView, Leg
from harness.history import RequestView
from harness.verdict import Verdict

NAME = "leg_shape"


@dataclass(frozen=True)
class LegShapeExpect:
    """`roles`: which legs to judge."""

    roles: tuple[str, ...] = ("prefill", "decode", "regular")


def _client_value(req: RequestView, view: EngineView, key: str) -> Any:
    """What the client asked for (the request record, else the run's workload)."""
    own = getattr(req, key, None)
    if own is not None:
        return own
    return (view.history.settings.get("workload") or {}).get(key)


def prefill_problems(leg: Leg, view: EngineView) -> list[str]:
    shape, rules = leg.leg, view.contract.rules
    out = []
    if shape.get("stream"):
        out.append("streamed")
    wanted = rules.get("prefill_max_tokens", 1)
    if shape.get("max_tokens") != wanted:
        out.append(f"max_tokens {shape.get('max_tokens')} (contract: {wanted})")
    if shape.get("n") not in (None, 1):
        out.append(f"n {shape.get('n')}")
    # A min_tokens the leg cannot reach (the client's, carried over) is refused by vLLM; one within the
    # one-token cap (vllm-router sets min_tokens 1 beside max_tokens 1) changes nothing.
    low, cap_ = shape.get("min_tokens"), shape.get("max_tokens")
    if isinstance(low, int) and low > (cap_ if isinstance(cap_, int) else wanted):
        top = cap_ if cap_ is not None else wanted
        out.append(f"min_tokens {low} above max_tokens {top} (vLLM refuses it)")
    if shape.get("stream_options"):
        out.append("stream_options kept")
    if shape.get("stop"):
        # It may end the prefill before its length cap, and vLLM's prefill then frees the KV at once.
        out.append(f"stop strings kept {shape['stop']!r} (the prefill may stop short and free its KV)")
    out.extend(_ignored(shape))
    # End of sequence ends a prefill before its length cap as a stop string does (vLLM checks it first) and
    # frees the KV: `ignore_eos`, or `min_tokens` 1 (end of sequence masked for the first token), keeps it.
    guarded = shape.get("ignore_eos") or (isinstance(low, int) and low >= 1)
    if rules.get("prefill_ignore_eos", True) and not guarded:
        out.append("ignore_eos not set, nor min_tokens 1 (end of sequence may end it and free its KV)")
    kv = shape.get("kv_transfer_params")
    if kv is None:
        if view.contract.connector == "nixl":
            out.append("no kv_transfer_params (a NIXL prefill must be told do_remote_decode)")
        return out
    if not isinstance(kv, dict):
        return [*out, f"kv_transfer_params not an object: {kv!r}"]
    if kv.get("do_remote_decode") is not True or kv.get("do_remote_prefill") not in (False, None):
        out.append(f"not tagged for a remote decode: {_brief(kv)}")
    if view.contract.connector == "mooncake" and not isinstance(kv.get("transfer_id"), str):
        out.append(f"no transfer_id: {_brief(kv)}")
    return out


def decode_problems(leg: Leg, req: RequestView, view: EngineView) -> list[str]:
    out = _client_parameter_problems(leg.leg, req, view)
    kv = leg.leg.get("kv_transfer_params")
    remote = isinstance(kv, dict) and kv.get("do_remote_prefill") is True and not kv.get("do_remote_decode")
    if isinstance(kv, dict) and kv and not remote:
        out.append(f"handoff params not for a remote prefill: {_brief(kv)}")
    return out


def regular_problems(leg: Leg, req: RequestView, view: EngineView) -> list[str]:
    out = _client_parameter_problems(leg.leg, req, view)
    kv = leg.leg.get("kv_transfer_params")
    if kv is not None:
        out.append(f"handoff params on a regular leg: {_brief(kv) if isinstance(kv, dict) else kv!r}")
    return out


def _client_parameter_problems(shape: dict[str, Any], req: RequestView, view: EngineView) -> list[str]:
    """The leg whose answer the client sees carries the client's own parameters."""
    out = []
    stream = bool(req.stream)
    if bool(shape.get("stream")) != stream:
        out.append(f"stream {bool(shape.get('stream'))} (the client asked {stream})")
    for key in ("max_tokens", "min_tokens"):
        asked = _client_value(req, view, key)
        if asked is not None and shape.get(key) != asked:
            out.append(f"{key} {shape.get(key)} (the client asked {asked})")
    if shape.get("n") not in (None, 1):
        out.append(f"n {shape.get('n')} (the client asked 1)")
    out.extend(_ignored(shape))
    return out


def _ignored(shape: dict[str, Any]) -> list[str]:
    # vLLM passes an unknown field or KV key by with at most a warning, so a misspelt one is a setting lost.
    names = shape.get("ignored")
    return [f"fields the engine ignores {names}"] if names else []


def _kind(problem: str) -> str:
    """A problem's kind: its words before the first value it quotes ("max_tokens 6 (contract: 1)" ->
    "max_tokens")."""
    return re.split(r"[\d\[{(:'\"]", problem, maxsplit=1)[0].strip()


def _brief(kv: dict[str, Any]) -> str:
    keys = ("do_remote_decode", "do_remote_prefill", "transfer_id", "remote_engine_id")
    return "{" + ", ".join(f"{k}: {kv.get(k)!r}" for k in keys if k in kv) + "}"


@judged_from_engines(NAME, LegShapeExpect)
def check_leg_shape(view: EngineView, exp: LegShapeExpect) -> Verdict:
    history = view.history
    evidence: list[str] = []
    kinds: set[str] = set()
    judged = 0
    for leg in view.legs():
        role = view.roles.get(leg.engine)
        req = history.request_by_tag(leg.tag)
        if role not in exp.roles or req is None or not leg.leg:
            continue
        judged += 1
        if role == "prefill":
            problems = prefill_problems(leg, view)
        elif role == "regular":
            problems = regular_problems(leg, req, view)
        else:
            problems = decode_problems(leg, req, view)
        if problems:
            evidence.append(f"router side: {leg.tag}'s {role} leg to {leg.engine} at t={leg.at:.3f}: "
                            + "; ".join(problems))
            kinds.update(f"{role} {_kind(p)}" for p in problems)
    numbers = {"legs": judged, "bad": len(evidence)}
    if evidence:
        # The kinds name the finding (outside parentheses, which a finding's signature drops): two routers
        # that get different parts of the shape wrong give two findings.
        what = (f"{len(evidence)} of {judged} legs not shaped as the contract says: "
                f"{', '.join(sorted(kinds))}")
        return Verdict.fail(NAME, what, numbers, cap(evidence))
    if judged == 0:
        return Verdict.unknown_(NAME, "no engine recorded the shape of a leg", numbers)
    return Verdict.ok(NAME, f"{judged} legs shaped as the contract says", numbers)
