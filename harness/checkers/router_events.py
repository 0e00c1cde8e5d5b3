"""A router that exposes its own events is held to them: each must agree with what the engines saw.

The reference router (and any router with an event stream) says what it did: every probe and its outcome,
every status change, every metadata read and engine id it took, every circuit breaker move. An operator
reads these to debug an outage, so a router whose account is wrong misleads. Each event has the documented
shape (`harness.contract.event_schema`: its fields, their values, a re-read's outcome that fits the read) and
is matched to the engines' records (`harness.contract`):
- a `probe` counted ok needs a probe the engine answered healthy in time, one counted failed a probe the
  engine did not answer healthy in time (where no fault could hide or bend it);
- a `status_change` goes to a status the contract allows at that moment;
- a `metadata_read` read complete needs a read the engine answered, one read failed an engine that did not;
- an `engine_id` names an id the engine reported, never clears a known one, and one that says the id changed
  names another id;
- a `breaker` move goes to a state the breaker model allows then;
- a `dispatch` names workers of the roles its legs need, a status that fits its outcome, the error of a
  failed one (none for one that went well), and the engines that served its minted transfer (and the
  remote engine id the decode got);
- and nothing is left out: every probe the engines saw from the router, every status change its worker
  list showed, is in its account, and each worker's status changes and breaker moves chain (each starts
  where the one before it ended).
A router that exposes no events has nothing to be held to here (the other contract checkers judge it).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import pairwise

from harness.checkers._common import cap
from harness.checkers.breaker_contract import BreakerTimeline, breaker_timeline
from harness.contract.breaker_model import CLOSED, HALF, OPEN, BreakerRules
from harness.contract.event_schema import event_problems
from harness.contract.evidence import EngineView, Leg, reported_ids
from harness.contract.reach import Window
from harness.contract.settings import ID_READ_CALLS
from harness.contract.status_model import STATUSES, Outcome
from harness.contract.timeline import ProbeSeen, probe_outcome
from harness.history import EngineCall, History, RouterEvent, base_engine_id
from harness.verdict import Verdict

NAME = "router_events"
_BREAKER_KINDS = {"closed": CLOSED, "open": OPEN, "half_open": HALF}


@dataclass(frozen=True)
class RouterEventsExpect:
    """`slack_s`: how far the router's stamps may lie from the engines' (seconds, both sides)."""

    slack_s: float = 0.1


def _inside(windows: list[Window], a: float, b: float) -> bool:
    return any(w.start - 1e-9 <= b and a <= w.end + 1e-9 for w in windows)


class _Judge:
    def __init__(self, history: History, view: EngineView, slack: float) -> None:
        self.h, self.view, self.slack = history, view, slack
        layout = history.settings.get("engines_layout") or {}
        self.by_url = {str(spec.get("url")): name for name, spec in layout.items()}
        # The router may know an engine by another address (a proxy in front of it): its worker list says.
        for points in history.status.values():
            for point in points:
                if point.url and point.engine in view.roles:
                    self.by_url[point.url] = point.engine
        self.windows = {e: view.windows(e) for e in view.roles}
        self.evidence: list[str] = []
        self.judged = 0
        # The router's events are read on a poll: what it did after the last one read is not in them yet.
        self.horizon = max((ev.at for ev in history.router_events), default=0.0) - slack
        self._breakers: dict[str, BreakerTimeline] = {}
        self._by_transfer: dict[str, list[Leg]] | None = None

    def say(self, ev: RouterEvent, what: str) -> None:
        self.evidence.append(f"router side: its {ev.event} event at t={ev.at:.3f} {what}")

    def engine(self, ev: RouterEvent) -> str | None:
        return self.by_url.get(str(ev.get("url")))

    def _calls(self, engine: str, names: tuple[str, ...], ev: RouterEvent) -> tuple[list[EngineCall], float,
                                                                                     float]:
        """The engine's calls of `names` that may be the one `ev` stands for: it is stamped as it ended, so
        the call reached the engine as it began."""
        start = ev.at - float(ev.get("duration_s") or 0.0)
        a, b = start - self.slack, start + self.slack
        return [c for c in self.h.engine_calls_of(engine, *names) if a <= c.at <= b], a, b

    def probe(self, ev: RouterEvent, engine: str) -> None:
        timeout = self.view.contract.probe_timeout_s
        calls, a, b = self._calls(engine, self.view.contract.probe_calls, ev)
        ok = bool(ev.get("ok"))
        # A failed probe may have been failed by a fault at any moment of its life, not only as it began: an
        # answer still on its way back when a link wedges never arrives.
        if _inside(self.windows[engine], a, b if ok else ev.at + self.slack):
            return
        self.judged += 1
        outcomes = {probe_outcome(ProbeSeen(c.at, c.duration_s or 0.0,
                                            c.status == 200 and c.detail.get("healthy", True) is not False),
                                  timeout) for c in calls}
        if ok and not outcomes & {Outcome.OK, Outcome.EITHER}:
            what = "never saw it" if not calls else "did not answer it healthy in time"
            self.say(ev, f"counted {engine} healthy, but {engine} {what}")
        if not ok and outcomes and outcomes <= {Outcome.OK}:
            self.say(ev, f"counted {engine} failed, but {engine} answered it healthy in time")

    def status_change(self, ev: RouterEvent, engine: str) -> None:
        to = ev.get("to")
        if to not in STATUSES:
            return  # registration's pending from nothing, a removal
        self.judged += 1
        allowed = self.view.timeline(engine).statuses_in(ev.at - self.slack, ev.at + self.slack)
        if to not in allowed:
            self.say(ev, f"moved {engine} to {to}; the contract allows {'/'.join(sorted(allowed))} then")

    def metadata_read(self, ev: RouterEvent, engine: str) -> None:
        c = self.view.contract
        if c.transport != "grpc" and not (c.connector == "mooncake" and self.view.roles[engine] == "prefill"):
            return  # over HTTP only a Mooncake prefill has an id to read (its bootstrap `/query`)
        read = ev.get("read")
        calls, a, b = self._calls(engine, ID_READ_CALLS, ev)
        life_end = b if read == "complete" else ev.at + self.slack  # as a failed probe's (above)
        if read not in ("complete", "partial", "error", "timeout"):
            return
        if _inside(self.windows[engine], a, life_end):
            return
        self.judged += 1
        answered = [c for c in calls if c.status == 200]
        if read == "complete" and not answered:
            self.say(ev, f"read {engine} complete, but no read of it was answered then")
        quick = [c for c in answered if (c.duration_s or 0.0) < 0.9 * self.view.contract.probe_timeout_s]
        if read in ("error", "partial", "timeout") and quick:
            self.say(ev, f"read {engine} {read}, but {engine} answered a read at t={quick[0].at:.3f} in time")

    def engine_id(self, ev: RouterEvent, engine: str) -> None:
        old, new = base_engine_id(ev.get("old")), base_engine_id(ev.get("new"))
        self.judged += 1
        if new is None and old is not None:
            self.say(ev, f"cleared {engine}'s id {old} (a read never clears a known id)")
            return
        if new is not None and new == old and str(ev.get("reason") or "").endswith("id_changed"):
            self.say(ev, f"says {engine}'s id changed ({ev.get('reason')}), but names the same id {new} "
                         "before and after")
            return
        if new is None or new == old:
            return
        reported = {base_engine_id(i) for c in self.h.engine_calls_of(engine, *ID_READ_CALLS)
                    if c.at <= ev.at + self.slack for i in reported_ids(c)}
        if new not in reported:
            self.say(ev, f"took id {new} for {engine}, which it never reported")

    def dispatch(self, ev: RouterEvent) -> None:
        """A dispatch names the workers its legs ran on, the status the client got for its outcome, and (with
        a minted transfer id) the engines that served that transfer and the id the decode was sent."""
        status, outcome = ev.get("status"), ev.get("outcome")
        if outcome in ("ok", "decode_stream_failed") and status != 200:
            self.say(ev, f"says {outcome} with status {status} (the client got 200 then)")
        if outcome in ("prefill_failed", "decode_failed") and not (isinstance(status, int) and status >= 400):
            self.say(ev, f"says {outcome} with status {status} (a failed leg is answered as an error)")
        if outcome is not None:
            # What an operator reads for a failed request: the failure, named; none for one that went well.
            # A router that tells the outcome (the extension) names the error with it.
            error = ev.get("error")
            if outcome != "ok" and not (isinstance(error, str) and error):
                self.say(ev, f"says {outcome} without naming the error ({error!r})")
            if outcome == "ok" and error is not None:
                self.say(ev, f"says ok with an error ({error!r})")
        named: dict[str, str | None] = {}
        for role in ("prefill", "decode"):
            url = ev.get(f"{role}_url")
            named[role] = self.by_url.get(str(url)) if url else None
            # Regular mode names its one worker as the decode: the one whose answer the client sees.
            allowed = (role, "both", "regular") if role == "decode" else (role, "both")
            if named[role] is not None and self.view.roles.get(str(named[role])) not in allowed:
                self.say(ev, f"names {named[role]} ({self.view.roles.get(str(named[role]))}) as its {role}")
        xfer = ev.get("transfer_id")
        if not xfer:
            return
        if self._by_transfer is None:
            self._by_transfer = {}
            for leg in self.view.legs():
                if leg.transfer_id:
                    self._by_transfer.setdefault(leg.transfer_id, []).append(leg)
        for leg in self._by_transfer.get(str(xfer), []):
            want = named.get(leg.kind)
            if want is not None and leg.engine != want:
                self.say(ev, f"names {want} as its {leg.kind}, but {leg.engine} served transfer {xfer}")
            sent = ev.get("remote_engine_id")
            if leg.kind == "decode" and sent and leg.remote_engine_id and \
                    base_engine_id(leg.remote_engine_id) != base_engine_id(str(sent)):
                self.say(ev, f"says it sent remote engine id {sent}, but {leg.engine} got "
                             f"{leg.remote_engine_id} for transfer {xfer}")

    def breaker(self, ev: RouterEvent, engine: str) -> None:
        c = self.view.contract
        kind = _BREAKER_KINDS.get(str(ev.get("to")))
        if kind is None or c.breaker_failures is None:
            return
        if engine not in self._breakers:
            legs = [leg for leg in self.view.legs() if leg.engine == engine]
            self._breakers[engine] = breaker_timeline(self.view, engine, legs,
                                                      BreakerRules(c.breaker_failures, c.breaker_open_s),
                                                      self.slack)
        self.judged += 1
        kinds = self._breakers[engine].kinds_in(ev.at - self.slack, ev.at + self.slack)
        if kind not in kinds:
            self.say(ev, f"moved {engine}'s breaker to {ev.get('to')} ({ev.get('reason')}); the breaker "
                         f"contract allows {'/'.join(sorted(kinds))} then")


def _unreported_probes(judge: _Judge) -> None:
    """Every probe the engines saw from the router (where nothing bent it) is in the router's account."""
    events = judge.h.router_events_of("probe")
    if not events:
        return  # a router whose events leave probes out (it says nothing of them, rightly or wrongly)
    by_engine: dict[str, list[float]] = {}
    for ev in events:
        engine = judge.engine(ev)
        if engine is not None:
            by_engine.setdefault(engine, []).append(ev.at - float(ev.get("duration_s") or 0.0))
    for engine in judge.view.roles:
        starts = sorted(by_engine.get(engine, []))
        for call in judge.h.engine_calls_of(engine, *judge.view.contract.probe_calls):
            a, b = call.at - judge.slack, call.at + judge.slack
            if _inside(judge.windows[engine], a, b) or not call.ended_at < judge.horizon:
                continue
            judge.judged += 1
            i = bisect_left(starts, a)
            if i == len(starts) or starts[i] > b:
                judge.evidence.append(f"router side: {engine} answered a probe of the router's at "
                                      f"t={call.at:.3f} that the router's events never report")


def _unreported_status_changes(judge: _Judge) -> None:
    """Every status change its worker list showed is in the router's account too."""
    changes: dict[str, list[tuple[float, str]]] = {}
    for ev in judge.h.router_events_of("status_change"):
        engine = judge.engine(ev)
        if engine is not None:
            changes.setdefault(engine, []).append((ev.at, str(ev.get("to"))))
    for points in judge.h.status.values():
        shown = [p for p in points if p.engine in judge.view.roles and p.status in STATUSES]
        for before, after in pairwise(shown):
            if before.status == after.status or after.t >= judge.horizon:
                continue
            judge.judged += 1
            engine = str(after.engine)
            a, b = before.t - judge.slack, after.t + judge.slack
            if not any(a <= t <= b and to == after.status for t, to in changes.get(engine, [])):
                judge.evidence.append(f"router side: its worker list showed {engine} go {before.status} -> "
                                      f"{after.status} by t={after.t:.3f}; no status_change event says so")


def _broken_chains(judge: _Judge) -> None:
    """Each worker's account chains: a status change or breaker move starts where the one before it ended.
    A move the router made and did not write breaks the chain at the next one."""
    last: dict[tuple[str, str], str] = {}
    for ev in judge.h.router_events:
        if ev.event not in ("status_change", "breaker") or ev.worker is None:
            continue
        key = (ev.event, ev.worker)
        before, now = ev.get("from"), ev.get("to")
        if key in last and before is not None:
            judge.judged += 1
            if before != last[key]:
                judge.say(ev, f"moved {ev.worker} from {before}, but its last {ev.event} event left it "
                              f"{last[key]}: a move in between is missing")
        if isinstance(now, str):
            last[key] = now


def check_router_events(history: History, exp: RouterEventsExpect | None = None) -> Verdict:
    exp = exp or RouterEventsExpect()
    if not history.router_events:
        return Verdict.ok(NAME, "the router exposes no events: nothing of its own to hold it to",
                          {"events": 0})
    view = EngineView.of(history)
    if view is None:
        return Verdict.unknown_(NAME, "the router's settings are not in the run's settings")
    if not history.engine_calls:
        return Verdict.unknown_(NAME, "the engines recorded no call to hold the router's events against")
    judge = _Judge(history, view, exp.slack_s)
    handlers = {"probe": judge.probe, "status_change": judge.status_change,
                "metadata_read": judge.metadata_read, "engine_id": judge.engine_id, "breaker": judge.breaker}
    for ev in history.router_events:
        judge.judged += 1
        for problem in event_problems(ev.event, ev.fields):
            judge.say(ev, problem)
        if ev.event == "dispatch":
            judge.dispatch(ev)
            continue
        handle = handlers.get(ev.event or "")
        engine = judge.engine(ev)
        if handle is not None and engine is not None:
            handle(ev, engine)
    for t, worker, problems in history.worker_shapes:
        judge.judged += 1
        judge.evidence.append(f"router side: its worker list at t={t:.3f} showed {worker} not as the worker "
                              f"API documents it: {', '.join(problems)}")
    _unreported_probes(judge)
    _unreported_status_changes(judge)
    _broken_chains(judge)
    numbers = {"events": len(history.router_events), "judged": judge.judged, "slack_s": exp.slack_s}
    if judge.evidence:
        what = f"{len(judge.evidence)} router event(s) wrong (engines' records, documented shape)"
        return Verdict.fail(NAME, what, numbers, cap(judge.evidence))
    return Verdict.ok(NAME, f"{judge.judged} router events agree with the engines' records", numbers)
