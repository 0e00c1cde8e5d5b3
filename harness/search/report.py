"""A real-time finding as a bug report: `found/<checker>-<hash>.md` beside its scenario file.

What a gateway team needs to act on it: the router (release, the settings it was given and the command
line it ran with), the case (cell, load, fault schedule), the symptom as a client sees it (from the run's
requests and the failing checker's reason), the evidence lines, what the reference router did in the same
case, how it was confirmed, and the one-line replay. Every sentence is built from the runs' facts
(`harness.search.facts`); nothing here knows a particular bug.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.scenario import RouterSettings
from harness.search.case import SearchCase, bound_of, duration_s
from harness.search.execute import RunOutcome, scenario_of
from harness.search.facts import ClientView, RunFacts
from harness.search.found import replay_command
from harness.search.signature import Signature

# Evidence lines shown per failing checker.
EVIDENCE_SHOWN = 6


@dataclass(frozen=True)
class Finding:
    """What the report is written from."""

    signature: Signature
    seed: int
    router: str
    bugs: tuple[str, ...]
    original: SearchCase
    shrunk: SearchCase
    outcome: RunOutcome
    reference: RunOutcome | None
    scenario_file: Path


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:g} s"


def router_lines(router: str, bugs: tuple[str, ...], settings: RouterSettings, argv: tuple[str, ...],
                 adjustments: list[str]) -> list[str]:
    """The router: which, what it was told, and what it ran."""
    breaker = ("none" if settings.circuit_breaker_failures is None else
               f"{settings.circuit_breaker_failures} failures, open {settings.circuit_breaker_open_s:g} s")
    identity = ("off" if settings.identity_check_interval_s is None
                else f"every {settings.identity_check_interval_s:g} s")
    router_bugs = list(settings.inject_bugs)
    lines = [
        f"- Router: `{router}`" + (f", bug switches on: {', '.join(router_bugs)}" if router_bugs else "")
        + (f"; engine switches on: {', '.join(b for b in bugs if b not in router_bugs)}"
           if any(b not in router_bugs for b in bugs) else "") + ".",
        f"- Settings it was given (the scaled preset): health probes every {settings.health_interval_s:g} s "
        f"(timeout {settings.health_timeout_s:g} s, out after {settings.failure_threshold} failed, back "
        f"after {settings.success_threshold} passed), request timeout {settings.request_timeout_s:g} s, "
        f"circuit breaker {breaker}, identity checks {identity}, policies {settings.prefill_policy}/"
        f"{settings.decode_policy}.",
    ]
    lines += [f"- Taken approximately: {a}." for a in adjustments]
    if argv:
        lines.append(f"- Command line in the failing run: `{shlex.join(argv)}`")
    return lines


def case_lines(original: SearchCase, shrunk: SearchCase) -> list[str]:
    ld = shrunk.load
    load = (f"{_n(ld.concurrency, 'closed-loop client')}" if ld.rate_rps is None
            else f"open loop at {ld.rate_rps:g} requests/s")
    lines = [
        f"- Cell: {shrunk.topology}, {shrunk.connector} connector, {shrunk.transport} workers; run seed "
        f"{shrunk.run_seed}; {duration_s(shrunk):g} s of load ({load}, {ld.stream_fraction:g} streamed, "
        f"{ld.chat_fraction:g} chat, {ld.prompt_words[0]}-{ld.prompt_words[1]} prompt words, up to "
        f"{_n(ld.max_tokens, 'token')}).",
        "- Fault schedule (timeline seconds; kind@target[start+length]):",
        *[f"    - `{f.label()}`" for f in shrunk.faults],
    ]
    if original != shrunk:
        lines.append(f"- As first found: {_n(len(original.faults), 'fault')} on {original.topology}; shrunk "
                     "to the schedule above, which fails the same way.")
    return lines


def client_sentences(c: ClientView, bound_s: float) -> list[str]:
    """What the client saw, in sentences; `bound_s`: how soon after a heal a correct router serves again
    (the case's recovery bound)."""
    if c.requests == 0:
        return ["The client's requests were not recorded."]
    failures = ", ".join(f"{k} x{v}" for k, v in c.failed_by.items())
    out = [f"Of {_n(c.requests, 'request')}, {c.succeeded} succeeded and {c.failed} failed"
           + (f" ({failures})" if failures else "") + "."]
    if c.lost:
        out.append(f"{_n(c.lost, 'request')} got no answer before the client's deadline.")
    if c.slowest_failure_s is not None:
        out.append(f"The slowest failure came {_seconds(c.slowest_failure_s)} after its request was sent.")
    if c.last_heal_t is not None and c.after_heal:
        if c.failed_after_heal:
            out.append(f"After the last fault healed (t={c.last_heal_t:g} s), {c.failed_after_heal} of "
                       f"{_n(c.after_heal, 'request')} sent failed; the last of those ended "
                       f"{_seconds(c.last_failure_after_heal_s)} after the heal (the run ended "
                       f"{c.run_end_t - c.last_heal_t:.3g} s after it; a correct router serves again "
                       f"within {bound_s:g} s).")
        else:
            out.append(f"Every request sent after the last fault healed (t={c.last_heal_t:g} s) succeeded.")
    if c.slowest_success_s is not None:
        out.append(f"The slowest successful request took {_seconds(c.slowest_success_s)}.")
    return out


def _reason(sig: Signature, facts: RunFacts | None) -> str:
    """The failing verdict's own reason (with its numbers), else the signature's class of it."""
    v = facts.verdict(sig.checker) if facts is not None else None
    return v.reason if v is not None and v.reason else sig.reason


def symptom_lines(sig: Signature, facts: RunFacts | None, bound_s: float) -> list[str]:
    client = client_sentences(facts.client, bound_s) if facts is not None else []
    return [*client, f"The `{sig.checker}` check: {_reason(sig, facts)}."]


def evidence_lines(sig: Signature, facts: RunFacts | None) -> list[str]:
    if facts is None:
        return ["(no evidence kept)"]
    lines = []
    v = facts.verdict(sig.checker)
    if v is not None:
        lines += [f"- `{sig.checker}`: {v.reason}", *[f"    - {e}" for e in v.evidence[:EVIDENCE_SHOWN]]]
    others = [o for o in facts.verdicts if o.status == "fail" and o.checker != sig.checker]
    if others:
        lines.append("- Other checks that failed in the same run:")
        lines += [f"    - `{o.checker}`: {o.reason}" for o in others]
    if facts.run_dir:
        lines.append(f"- The run (history, engine records, logs): `{facts.run_dir}`")
    return lines


def reference_lines(sig: Signature, ref: RunOutcome | None, bound_s: float) -> list[str]:
    if ref is None:
        return ["Not run."]
    state = "passed every check" if ref.passed else "did not pass"
    lines = [f"The reference router, the same case in real time (router switches off): {state} "
             f"({_n(len(ref.verdicts), 'verdict')})."]
    mine = [(s, r) for c, s, r in ref.verdicts if c == sig.checker]
    if mine:
        status, reason = mine[0]
        lines.append(f"Its `{sig.checker}`: {status}" + (f" ({reason})" if reason else "") + ".")
    if ref.facts is not None:
        lines += client_sentences(ref.facts.client, bound_s)
        if ref.facts.run_dir:
            lines.append(f"Its run: `{ref.facts.run_dir}`.")
    return lines


def render_report(f: Finding, adjustments: list[str]) -> str:
    scenario = scenario_of(f.shrunk, f.bugs)
    facts = f.outcome.facts
    replay = replay_command(f.scenario_file, f.shrunk, "real", f.router)
    return "\n".join([
        f"# {f.signature.checker} fails on `{f.router}`: {_reason(f.signature, facts)}",
        "",
        f"Found by `pdchaos search --world real` (seed {f.seed}), shrunk and confirmed in real time. "
        f"Scenario file: `{f.scenario_file.name}`.",
        "",
        "## Router",
        "",
        *router_lines(f.router, f.bugs, scenario.router, facts.router_argv if facts else (), adjustments),
        "",
        "## The case",
        "",
        *case_lines(f.original, f.shrunk),
        "",
        "## What a user sees",
        "",
        " ".join(symptom_lines(f.signature, facts, bound_of(f.shrunk))),
        "",
        "## Evidence",
        "",
        *evidence_lines(f.signature, facts),
        "",
        "## What the reference router does",
        "",
        " ".join(reference_lines(f.signature, f.reference, bound_of(f.shrunk))),
        "",
        "## Confirmed",
        "",
        f"The case failed `{f.signature.text}` in 2 of 2 runs on `{f.router}` (the run that found it and a "
        "replay), and the reference router passed it.",
        "",
        "## Replay",
        "",
        "```",
        replay,
        "```",
        "",
    ])


def adjustments_of(router: str, settings: RouterSettings) -> list[str]:
    """The settings a gateway takes only approximately (none for other routers)."""
    from harness.routers.gateways.adapters import GatewayAdapter
    from harness.search.realtime import router_adapter

    adapter = router_adapter(router)
    return adapter.adjustments(settings) if isinstance(adapter, GatewayAdapter) else []


def write_report(f: Finding) -> Path:
    """`<scenario file>.md` beside the scenario file."""
    settings = scenario_of(f.shrunk, f.bugs).router
    path = f.scenario_file.with_suffix(".md")
    path.write_text(render_report(f, adjustments_of(f.router, settings)))
    return path
