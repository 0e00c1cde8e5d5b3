"""The router's counters agree with its own events (CONTRACTS §2): what its `/metrics` says it did is what
its events say it did, label by label. An operator's dashboards and alerts read the counters; a router
whose counters miscount (a wrong label, an outcome counted under another) misleads them while its events,
and every other check, look right.

A prefill leg run again is counted when it runs and named in its request's `dispatch` (`retried_from`) when
the request ends, so that counter is held to at least what the dispatches name (a request its client left
may end with none).

Judged where the router documents both (the counters below and their events): the counters are read at the
run's end, just before the last read of its events, so each counter lies between the events before the
read began and those before it ended. A router without them (a gateway of its own metrics) passes with
nothing to hold it to, as `router_events` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.checkers._common import cap
from harness.history import History
from harness.verdict import Verdict

NAME = "router_metrics"

Labels = tuple[tuple[str, str], ...]
# (counter, the event type it counts, the labels an event is counted under; None: not counted).
_COUNTED: tuple[tuple[str, str, Callable[[Mapping[str, Any]], dict[str, str] | None]], ...] = (
    ("pdchaos_router_dispatches_total", "dispatch",
     lambda f: {"connector": str(f.get("connector")), "outcome": str(f.get("outcome"))}),
    ("pdchaos_router_breaker_transitions_total", "breaker", lambda f: {"to": str(f.get("to"))}),
    ("pdchaos_router_mint_skipped_total", "mint_skipped", lambda f: {"reason": str(f.get("reason"))}),
    ("pdchaos_router_probes_total", "probe",
     lambda f: {"outcome": "ok" if f.get("ok") is True else "failed"}),
    ("pdchaos_router_metadata_reads_total", "metadata_read", lambda f: {"outcome": str(f.get("outcome"))}),
)
# Counted at the moment, told by a later event: a prefill leg run again is counted when it is, and named in
# its request's `dispatch` (`retried_from`) when the request ends; a request its client left mid-way may end
# with no dispatch. So these counters are held to at least what the events say.
_AT_LEAST: tuple[tuple[str, str, dict[str, str], Callable[[Mapping[str, Any]], int]], ...] = (
    ("pdchaos_router_leg_retries_total", "dispatch", {"leg": "prefill", "outcome": "retried"},
     lambda f: len(f.get("retried_from") or ())),
)
# Label values the contract documents (CONTRACTS §2) for counters no event counts label by label: a value
# outside them (a retry counted under no outcome, a delivered failure counted as a retry outcome) is a
# miscount an operator's alert on the documented values never sees.
_DOCUMENTED_LABELS: dict[str, dict[str, frozenset[str]]] = {
    "pdchaos_router_leg_retries_total": {
        "leg": frozenset({"prefill"}),
        "outcome": frozenset({"retried", "no_other_ready_worker", "deadline_passed"}),
    },
}
# Counted with no event of their own (identity checks say nothing unless the id moved).
_UNEVENTED_PREFIX = {"pdchaos_router_metadata_reads_total": ("outcome", "identity_")}
# The router's wall clock and the harness's are one machine's; this covers their rounding.
_EPSILON_S = 0.002


@dataclass(frozen=True)
class RouterMetricsExpect:
    """No parameter: the counters' meanings are the contract's."""


def _key(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _unevented(name: str, key: Labels) -> bool:
    rule = _UNEVENTED_PREFIX.get(name)
    return rule is not None and any(k == rule[0] and v.startswith(rule[1]) for k, v in key)


def check_router_metrics(history: History, exp: RouterMetricsExpect | None = None) -> Verdict:
    metrics = history.router_metrics
    if metrics is None:
        return Verdict.ok(NAME, "no counters read (a router without events or /metrics): nothing to hold")
    evidence: list[str] = []
    judged = 0
    for name, event, labels_of in _COUNTED:
        shown = {_key(lab): v for lab, v in metrics.of(name)}
        if not shown:
            continue
        before: Counter[Labels] = Counter()
        by_end: Counter[Labels] = Counter()
        for ev in history.router_events_of(event):
            labels = labels_of(ev.fields)
            if labels is None or ev.at > metrics.end + _EPSILON_S:
                continue
            by_end[_key(labels)] += 1
            if ev.at < metrics.start - _EPSILON_S:
                before[_key(labels)] += 1
        for key in sorted(set(shown) | set(by_end)):
            if _unevented(name, key):
                continue
            judged += 1
            value, low, high = shown.get(key, 0.0), before[key], by_end[key]
            if not low <= value <= high:
                what = ",".join(f"{k}={v}" for k, v in key) or "no labels"
                events = f"{high}" if low == high else f"{low} to {high}"
                evidence.append(f"router side: {name}{{{what}}} is {value:g}, but its {event} events say "
                                f"{events}")
    for name, event, labels, count_of in _AT_LEAST:
        shown = {_key(lab): v for lab, v in metrics.of(name)}
        told = sum(count_of(ev.fields) for ev in history.router_events_of(event)
                   if ev.at < metrics.start - _EPSILON_S)
        if not shown and not told:
            continue
        judged += 1
        value = shown.get(_key(labels), 0.0)
        if value < told:
            what = ",".join(f"{k}={v}" for k, v in _key(labels))
            evidence.append(f"router side: {name}{{{what}}} is {value:g}, but its {event} events name {told} "
                            "before the read")
    for name, documented in _DOCUMENTED_LABELS.items():
        for labels, value in metrics.of(name):
            bad = {k: v for k, v in labels.items() if k in documented and v not in documented[k]}
            if bad:
                what = ",".join(f"{k}={v}" for k, v in _key(labels))
                evidence.append(f"router side: {name}{{{what}}} is {value:g}: "
                                + ", ".join(f"{k} {v!r} is none of {sorted(documented[k])}"
                                            for k, v in sorted(bad.items())))
    numbers = {"counters": judged, "wrong": len(evidence)}
    if evidence:
        what = f"{len(evidence)} counter(s) disagree with the router's own events"
        return Verdict.fail(NAME, what, numbers, cap(evidence))
    if not judged:
        return Verdict.ok(NAME, "none of the documented counters exposed: nothing to hold", numbers)
    return Verdict.ok(NAME, f"{judged} counter(s) agree with the router's events", numbers)
