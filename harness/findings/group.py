"""Findings: the distinct problems a run's failing cells show, each once, with the cells that show it.

A cell often fails several checkers for one cause: a stale engine id fails `handoff_params`, then the pulls
time out (`handoff`, `transfer_timeout`), then `availability` drops. Checkers come in three tiers:

- contract rules (what the router decided: `handoff_params`, `status_contract`, `legs_once`...);
- outcomes on the engines (`handoff`, `output`, `no_local_compute`...);
- symptoms a client sees (`availability`, `recovery`, `latency`, `nothing_lost`...).

In each failing cell the highest tier that explains the rest leads; the lower tiers' failures in that cell are
its consequences. A few contract rules explain no consequence (a leg run twice does not lose a request), so
they lead alone and the next tier leads beside them. A finding is keyed by its lead's checker, reason class
(`harness.search.signature`) and the side its evidence blames, so the same problem in twelve cells is one
finding.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.findings.known import known_signatures
from harness.findings.statements import statement
from harness.result import ScenarioResult
from harness.search.signature import HARNESS_VERDICTS, Signature, reason_class
from harness.verdict import Verdict

CONTRACT = 0
OUTCOME = 1
SYMPTOM = 2
_OUTCOMES = frozenset({"handoff", "prompt_503"})
# Symptoms, strongest first: when only symptoms failed, the first present leads.
SYMPTOMS = ("nothing_lost", "output", "availability", "recovery", "transfer_timeout", "latency", "balance")
# Contract rules that explain only some failures further down (the rest: all of them). A worker list that
# shows an old id breaks nothing else; a request run again is only slower.
EXPLAINS: dict[str, frozenset[str]] = {
    "reported_engine_id": frozenset(),
    "error_answers": frozenset(),
    "router_metrics": frozenset(),
    "legs_once": frozenset({"latency"}),
}
# What the router says of itself (its events, its worker list): at a tie, a rule about what it decided leads.
SELF_REPORTS = frozenset({"router_events", "reported_engine_id"})
# One fact under two names: the strict form judges the same handoffs with no grace window, and a local
# compute is one of the handoff problems.
_SAME_AS = {"handoff_strict": ("handoff", None), "no_local_compute": ("handoff", "local_compute")}
# Handoff problems a user cannot tell apart: the pull did not bring the KV.
_PULL_FAILED = frozenset({"timed_out", "failed"})
EVIDENCE_LINES = 3
# A race (a check that failed in some repeated runs and passed in others) is a finding too.
FAILING = ("fail", "race")
_SIDE = re.compile(r"\b(router|engine) side\b|'side': '(router|engine)'")
_KIND_PREFIX = re.compile(r"^[a-z_]+(?= (after|during):)|^[a-z_]+: ")


def tier(checker: str) -> int:
    if checker in SYMPTOMS:
        return SYMPTOM
    if checker in _OUTCOMES:
        return OUTCOME
    return CONTRACT


def side_of(v: Verdict) -> str:
    """The side the verdict's evidence blames first: router, engine, or "" when it names none."""
    for item in v.evidence:
        if isinstance(item, Mapping) and item.get("side") in ("router", "engine"):
            return str(item["side"])
        # "router side: ...", also behind a prefix ("run 2 failed: router side: ..." of a race)
        found = _SIDE.search(str(item))
        if found:
            return found.group(1) or found.group(2)
    for side in ("router", "engine"):
        if f"{side} side" in v.reason:
            return side
    return ""


def explains(lead: str, other: str) -> bool:
    """A failure of `lead` in a cell can cause a failure of `other` there (a lower tier)."""
    if tier(other) <= tier(lead):
        return False
    allowed = EXPLAINS.get(lead)
    return allowed is None or other in allowed


def finding_class(checker: str, v: Verdict) -> str:
    """The reason class, less the fault kind a symptom names first ("cut: ...", "restart after: ...") and
    any bracket the class cut open."""
    return class_as_finding(checker, reason_class(checker, v.reason, v.numbers))


def class_as_finding(checker: str, cls: str) -> str:
    """A reason class (`harness.search.signature`) as findings key it (see finding_class)."""
    if tier(checker) == SYMPTOM:
        cls = _KIND_PREFIX.sub("", cls)
    cls = cls.split(" (", 1)[0] if cls.count("(") > cls.count(")") else cls
    if checker == "handoff" and cls in _PULL_FAILED:
        cls = "pull_failed"
    return cls.strip(" :")


def evidence_text(item: Any) -> str:
    """One evidence item as a line: a blame (`{side, why}`) as "<side> side: why", another mapping as its
    first fields, anything else as text ("" for nothing)."""
    if isinstance(item, Mapping):
        if item.get("why"):
            return f"{item.get('side', 'unknown')} side: {item['why']}"
        return ", ".join(f"{k}={item[k]}" for k in list(item)[:6])
    return str(item) if item else ""


def sided_first(lines: Sequence[str]) -> list[str]:
    """The lines that say which side is at fault first, the others after, in their order."""
    sided = [x for x in lines if "router side" in x or "engine side" in x]
    return sided + [x for x in lines if x not in sided]


def evidence_lines(v: Verdict, limit: int = EVIDENCE_LINES) -> list[str]:
    lines = [line for e in v.evidence if (line := evidence_text(e))]
    return sided_first(lines)[:limit] or [v.reason]


@dataclass
class Finding:
    """One distinct problem. `cells` show it; `clean_cells` are cells of the same scenarios that did not."""

    id: str
    checker: str
    reason_class: str
    side: str
    statement: str
    cells: list[str] = field(default_factory=list)
    clean_cells: list[str] = field(default_factory=list)
    consequences: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    switches: list[str] = field(default_factory=list)
    replay: str = ""
    # race: seen only in checks that split over repeated runs (`harness.races`); fail: failed in every run.
    status: str = "fail"

    @property
    def signature(self) -> str:
        return f"{self.checker}: {self.reason_class}"

    @property
    def title(self) -> str:
        blame = f" ({self.side} side)" if self.side and f"{self.side} side" not in self.statement else ""
        return f"{self.statement}{blame}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "status": self.status, "statement": self.title, "checker": self.checker,
            "reason_class": self.reason_class, "side": self.side or None, "cells": list(self.cells),
            "clean_cells": list(self.clean_cells), "consequences": list(self.consequences),
            "evidence": list(self.evidence), "switches": list(self.switches), "replay": self.replay,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Finding:
        checker = str(d.get("checker", "?"))
        cls_ = str(d.get("reason_class", ""))
        return cls(
            id=str(d.get("id") or finding_id(checker, cls_, str(d.get("side") or ""))), checker=checker,
            reason_class=cls_, side=str(d.get("side") or ""), statement=statement(checker, cls_),
            cells=_strings(d, "cells"), clean_cells=_strings(d, "clean_cells"),
            consequences=_strings(d, "consequences"), evidence=_strings(d, "evidence"),
            switches=_strings(d, "switches"),
            replay=str(d.get("replay") or ""), status=str(d.get("status") or "fail"),
        )


def _strings(d: Mapping[str, Any], key: str) -> list[str]:
    return [str(x) for x in d.get(key) or []]


def finding_id(checker: str, cls: str, side: str) -> str:
    """Stable across runs and machines: the same problem gets the same id in a baseline and a new run."""
    return hashlib.sha1(f"{checker}\0{cls}\0{side}".encode()).hexdigest()[:8]


def cell_label(r: ScenarioResult) -> str:
    return f"{r.scenario}[{'/'.join(x for x in (r.topology, r.connector, r.transport) if x)}]"


@dataclass(frozen=True)
class _Item:
    checker: str
    verdict: Verdict
    cls: str
    side: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.checker, self.cls, self.side)


def leads(verdicts: Iterable[Verdict]) -> list[tuple[_Item, list[_Item]]]:
    """A cell's failing verdicts as (lead, the consequences it absorbs), leads in verdict order."""
    items = []
    for v in verdicts:
        if v.status not in FAILING or v.name in HARNESS_VERDICTS:
            continue
        name, fixed = _SAME_AS.get(v.name, (v.name, None))
        items.append(_Item(name, v, fixed or finding_class(name, v), side_of(v)))  # as verdict_signature
    out: list[tuple[_Item, list[_Item]]] = []
    done: set[tuple[str, str, str]] = set()
    explained: set[tuple[str, str, str]] = set()
    for level in (CONTRACT, OUTCOME):
        here = [i for i in items if tier(i.checker) == level and i.key not in done | explained]
        for lead in here:
            done.add(lead.key)
            below = [i for i in items if explains(lead.checker, i.checker)]
            explained.update(i.key for i in below)
            out.append((lead, below))
        if any(EXPLAINS.get(lead.checker) is None for lead in here):
            return out
    symptoms = sorted((i for i in items if tier(i.checker) == SYMPTOM and i.key not in explained),
                      key=lambda i: SYMPTOMS.index(i.checker))
    if symptoms:
        out.append((symptoms[0], symptoms[1:]))
    return out


def _size(r: ScenarioResult) -> tuple[int, float, str]:
    engines = sum(int(n) for n in re.findall(r"(\d+)[pd]", r.topology)) or 99
    return (engines, r.duration_s or 0.0, cell_label(r))


def verdict_signature(v: Verdict) -> str | None:
    """A failing verdict's signature as findings key it (`checker: reason class`); None for a pass or a
    verdict about the run itself."""
    if v.status not in FAILING or v.name in HARNESS_VERDICTS:
        return None
    return search_signature_as_finding(v.name, reason_class(v.name, v.reason, v.numbers))


def search_signature_as_finding(checker: str, cls: str) -> str:
    """A failure signature (checker, reason class: a search's, or a verdict's) as findings key it, so that
    a search's failure can be looked up among a report's findings."""
    name, fixed = _SAME_AS.get(checker, (checker, None))
    return f"{name}: {fixed or class_as_finding(name, cls)}"


def absorbed_by_lead(verdicts: Iterable[Verdict]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A run's failures as findings group them: (lead's key, the keys of the consequences it absorbs)."""
    return tuple((f"{lead.checker}: {lead.cls}", tuple(f"{i.checker}: {i.cls}" for i in below))
                 for lead, below in leads(verdicts))


def known_as(key: str, known: Container[str],
             absorbed: Iterable[tuple[str, Sequence[str]]] = ()) -> list[str]:
    """The finding keys among `known` that show a failure keyed `key`: itself, else the leads of the same run
    that absorb it (`absorbed_by_lead`: a symptom of a known problem is not a new one). Empty: new."""
    if key in known:
        return [key]
    return [lead for lead, below in absorbed if key in below and lead in known]


def unknown_signatures(signatures: Iterable[Signature], known: frozenset[str],
                       absorbed: Iterable[tuple[str, Sequence[str]]] = ()) -> list[Signature]:
    """Those of a search's failure `signatures` that `known` (finding keys) does not show (`known_as`)."""
    absorbed = tuple(absorbed)
    return [s for s in signatures
            if not known_as(search_signature_as_finding(s.checker, s.reason), known, absorbed)]


def _lead_verdict(r: ScenarioResult, checker: str) -> Verdict | None:
    failed = (v for v in r.verdicts if v.status in FAILING)
    return next((v for v in failed if _SAME_AS.get(v.name, (v.name,))[0] == checker), None)


def _absorbs(a: Finding, b: Finding, shows: Mapping[str, set[str]]) -> bool:
    """`b` is `a` seen through another checker: every cell that shows `b` shows `a`, and `b` either caused
    `a` there or is a contract rule beside a contract rule that explains everything."""
    if (a.checker, a.reason_class) == (b.checker, b.reason_class) and not b.side:
        return True  # the same problem where no evidence line named a side
    if not shows[b.signature] <= shows[a.signature]:
        return False
    if a.signature in b.consequences:
        return True
    return tier(a.checker) == tier(b.checker) == CONTRACT and EXPLAINS.get(a.checker) is None


def _merge(found: list[Finding], shows: Mapping[str, set[str]], own: dict[str, list[str]]) -> list[Finding]:
    """Fold each finding into a larger one it is a view of (smallest first, into the largest; at a tie, the
    router's account of itself into a rule about what it decided). `own`: where each led; the same problem
    with no side named leads where its host does."""
    order = sorted(found, key=lambda f: (len(shows[f.signature]), f.checker not in SELF_REPORTS, f.signature))
    alive = list(order)
    for b in order:
        hosts = [a for a in alive if a is not b and _absorbs(a, b, shows)]
        if not hosts:
            continue
        a = max(hosts, key=lambda f: (len(shows[f.signature]), f.checker not in SELF_REPORTS, f.signature))
        a.cells.extend(c for c in b.cells if c not in a.cells)
        if b.status == "fail":
            a.status = "fail"
        if (a.checker, a.reason_class) == (b.checker, b.reason_class):
            own[a.id].extend(c for c in own[b.id] if c not in own[a.id])
        for sig in (b.signature, *b.consequences):
            if sig != a.signature and sig not in a.consequences:
                a.consequences.append(sig)
        alive.remove(b)
    return alive


def _matching(f: Finding, catalogue: Mapping[str, Iterable[str]]) -> list[str]:
    """The switches whose known symptom this is: they produce its lead signature, and of those the ones that
    share the most of what failed with it."""
    mine = {f.signature, *f.consequences}
    scores = {name: len(mine & set(theirs)) for name, theirs in catalogue.items() if f.signature in theirs}
    best = max(scores.values(), default=0)
    return sorted(name for name, score in scores.items() if score == best)


def compute_findings(results: Sequence[ScenarioResult],
                     known: Mapping[str, Iterable[str]] | None = None) -> list[Finding]:
    """The distinct problems of `results`, most cells first. `known` maps a bug switch to the signatures
    (`checker: reason class`) it is known to produce (default: the shipped catalogue); a finding whose
    signature is one of them names the switch."""
    catalogue = known_signatures() if known is None else known
    by_key: dict[tuple[str, str, str], Finding] = {}
    shows: dict[str, set[str]] = {}
    failing = [r for r in results if r.status in FAILING]
    for r in failing:
        label = cell_label(r)
        for lead, below in leads(r.verdicts):
            f = by_key.get(lead.key)
            if f is None:
                f = by_key[lead.key] = Finding(finding_id(*lead.key), lead.checker, lead.cls, lead.side,
                                               statement(lead.checker, lead.cls), status="race")
            if lead.verdict.status == "fail":
                f.status = "fail"
            if label not in f.cells:
                f.cells.append(label)
            shows.setdefault(f.signature, set()).add(label)
            for c in below:
                sig = f"{c.checker}: {c.cls}"
                shows.setdefault(sig, set()).add(label)
                if sig not in f.consequences:
                    f.consequences.append(sig)
    # Where each finding led before the merge: its replay is the smallest of those (a cell folded in from
    # another finding shows it only through that one).
    own = {f.id: list(f.cells) for f in by_key.values()}
    found = _merge(list(by_key.values()), shows, own)
    by_label = {cell_label(r): r for r in failing}
    for f in found:
        cells = [by_label[c] for c in f.cells]
        smallest = min((by_label[c] for c in own[f.id]), key=_size)
        f.replay = smallest.replay
        lead = _lead_verdict(smallest, f.checker)
        f.evidence = evidence_lines(lead) if lead is not None else [smallest.overall.reason]
        scenarios = {r.scenario for r in cells}
        f.clean_cells = [label for r in results if r.scenario in scenarios
                         and (label := cell_label(r)) not in f.cells]
        f.switches = _matching(f, catalogue)
    return sorted(found, key=lambda f: (-len(f.cells), f.checker, f.reason_class))
