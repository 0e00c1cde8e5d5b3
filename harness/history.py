"""Run history, read back: one JSONL stream per scenario run (written by `harness.history_writer`) as a typed
view.

Reading: `load_history(path)` / `History.from_records(records)` join the stream into views the checkers
use: requests (invoked + completed, by `req`), faults (applied + verified + healed, by `fault`), router
status timelines per worker, handoff records by tag and by engine, engine identities over time. A history
cut short (crash, kill) is read as far as it goes; `History.complete` tells whether `run_ended` was seen.

Two timestamps: `t` is when the harness wrote the record. Router events and engine handoff records also
carry their own wall-clock `ts` (they may be fetched late, e.g. from `/control/records`);
`run_started.wall_start` maps `ts` back onto the scenario clock (`Handoff.at`, `RouterEvent.at`).

Size: a 64p64d run at 1000 requests/s writes millions of records. The per-request ones (`PER_REQUEST_TYPES`)
live in the view as typed objects only, not also as the dicts they were read from; `History.records` keeps
every other record (a few per fault, probe or note).
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.evidence_schema import record_problems
from pdchaos.jsonl import jsonl_lines

Clock = Callable[[], float]
ReqId = str | int
Record = dict[str, Any]

# One or more per client request: held by the view as `RequestView`s and `Handoff`s, never as dicts (a dict
# per record is most of a large run's memory).
MALFORMED_SHOWN = 10
PER_REQUEST_TYPES = frozenset({"request_invoked", "request_completed", "handoff", "engine_call"})

# Router statuses that may carry traffic; anything else means the router will not route to the worker.
READY = "ready"
_DP_SUFFIX = re.compile(r"_dp\d+$")


def base_engine_id(engine_id: str | None) -> str | None:
    """Engine id without the data-parallel suffix `_dp<rank>` (what identifies the engine process)."""
    if not engine_id:
        return None
    return _DP_SUFFIX.sub("", engine_id)


# --------------------------------------------------------------------------------------------------- reading


_LEGACY_COLLECTED = re.compile(r"collected \d+ handoff records")
_NORMAL_ENDS = frozenset({"done", "completed", "complete", "finished", "ok", "end"})


def _f(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass(slots=True)
class RequestView:
    """A client request: invoked and (maybe) completed. Times are on the scenario clock."""

    req: ReqId
    tag: str | None = None
    invoked_t: float | None = None
    stream: bool | None = None
    endpoint: str | None = None
    deadline_s: float | None = None
    prompt_chars: int | None = None
    completed_t: float | None = None
    status: int | None = None
    ok: bool | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    error: str | None = None
    text_ok: bool | None = None
    timed_out: bool = False
    mistake: str | None = None  # the client's mistake it carried (None: a right request)
    body_problem: str | None = None  # what keeps its error answer's body from the documented shape

    @property
    def completed(self) -> bool:
        return self.completed_t is not None

    @property
    def start_t(self) -> float | None:
        """When the request was sent (invoked record, else completion time minus latency)."""
        if self.invoked_t is not None:
            return self.invoked_t
        if self.completed_t is not None and self.latency_s is not None:
            return self.completed_t - self.latency_s
        return self.completed_t

    @property
    def deadline_t(self) -> float | None:
        if self.invoked_t is None or self.deadline_s is None:
            return None
        return self.invoked_t + self.deadline_s

    @property
    def succeeded(self) -> bool:
        """Completed OK with output not known to be wrong."""
        return bool(self.ok) and self.text_ok is not False


@dataclass(slots=True)
class FaultView:
    """A fault: applied, verified, healed. `healed_t` None means still active when the history ends."""

    fault: str
    kind: str | None = None
    target: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, Any] = field(default_factory=dict)
    applied_t: float | None = None
    verified_ok: bool | None = None
    evidence: Any = None
    healed_t: float | None = None

    def window(self, end_t: float) -> tuple[float, float]:
        """[applied, healed] with an unhealed fault running to `end_t`."""
        start = self.applied_t if self.applied_t is not None else 0.0
        return start, self.healed_t if self.healed_t is not None else end_t


@dataclass(frozen=True, slots=True)
class StatusPoint:
    """One router `/workers` observation of one worker."""

    t: float
    worker: str
    url: str | None
    role: str | None
    status: str
    kv_engine_id: str | None
    engine: str | None = None


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    t: float
    engine: str
    engine_id: str | None
    generation: int | None
    side_channel_port: int | None
    role: str | None = None
    url: str | None = None
    # Whether it was serving (None: the record does not say).
    serving: bool | None = None


@dataclass(frozen=True, slots=True)
class Handoff:
    """An engine handoff provenance record. `at` = the engine's `ts` on the scenario clock (else `t`)."""

    t: float
    at: float
    engine: str | None
    engine_id: str | None
    generation: int | None
    role: str | None
    kind: str | None
    request_id: str | None
    tag: str | None
    connector: str | None
    transfer_id: str | None
    remote_engine_id: str | None
    remote_request_id: str | None
    prompt_digest: str | None
    kv_digest: str | None
    outcome: str | None
    error: str | None
    duration_s: float | None
    output_digest: str | None
    # Where a decode pulled its KV from and as which engine (decode records only).
    peer: str | None = None
    peer_engine_id: str | None = None
    # The leg's shape as it reached the engine (stream, max_tokens, kv_transfer_params, ...); None: not told.
    leg: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class EngineCall:
    """A call an engine answered (CONTRACTS.md §1): a probe, a metadata read, a refused or cut leg. `at`:
    when it arrived, on the scenario clock (the engine's `ts`, else `t`); `caller`: "router" (the router
    under test), "harness" or "engine:<name>"."""

    t: float
    at: float
    engine: str
    engine_id: str | None
    generation: int | None
    call: str
    status: int | None
    duration_s: float | None
    caller: str
    detail: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    role: str | None = None

    @property
    def by_router(self) -> bool:
        return self.caller == "router"

    @property
    def by_harness(self) -> bool:
        """Not the router's: the harness's own probe, or another engine's lookup."""
        return self.caller != "router"

    @property
    def ended_at(self) -> float:
        return self.at + (self.duration_s or 0.0)


@dataclass(frozen=True, slots=True)
class RouterEvent:
    """A router event. `event` is the router's own type (status_change, probe, ...); `at` as for Handoff."""

    t: float
    at: float
    event: str | None
    worker: str | None
    fields: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def _label_key(labels: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(labels, dict):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


@dataclass(frozen=True, slots=True)
class RouterMetrics:
    """The router's counters read at the run's end: the read began at `start` and ended at `end` (scenario
    clock); `counters`: (name, labels, value)."""

    start: float
    end: float
    counters: tuple[tuple[str, tuple[tuple[str, str], ...], float], ...]

    def value(self, name: str, **labels: str) -> float:
        key = tuple(sorted(labels.items()))
        return sum(v for n, lab, v in self.counters if n == name and lab == key)

    def of(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [(dict(lab), v) for n, lab, v in self.counters if n == name]


class History:
    """Typed, joined view of one run's records (see module doc). Build: `from_records`, `load_history`."""

    def __init__(self) -> None:
        # Every record but the per-request ones (PER_REQUEST_TYPES), which are in `requests`/`handoffs`.
        self.records: list[Record] = []
        # Records read, of every type.
        self.record_count = 0
        self.run: dict[str, Any] | None = None
        self.ended: dict[str, Any] | None = None
        self.end_t: float = 0.0
        self.wall_start: float | None = None
        self.requests: dict[ReqId, RequestView] = {}
        self.faults: dict[str, FaultView] = {}
        self.status: dict[str, list[StatusPoint]] = {}
        self.engines: dict[str, list[EngineSnapshot]] = {}
        self.handoffs: list[Handoff] = []
        self.engine_calls: list[EngineCall] = []
        self.router_events: list[RouterEvent] = []
        self.router_metrics: RouterMetrics | None = None
        # `/workers` entries not of the documented W: (time, worker id, what is wrong).
        self.worker_shapes: list[tuple[float, str, list[str]]] = []
        self.notes: list[tuple[float, str]] = []
        self.bad_records: int = 0
        # Engine records not of their documented shape (`harness.evidence_schema`): damaged evidence.
        self.malformed: int = 0
        self.malformed_examples: list[str] = []
        # 1-based numbers of the file's lines that could not be read (damaged, garbage, torn).
        self.bad_lines: list[int] = []
        # Whether the engines' handoff records were collected (None: no record says either way).
        self._collected: bool | None = None
        self._by_tag: dict[str, list[Handoff]] = {}
        self._req_by_tag: dict[str, RequestView] = {}
        # What readers joined from this view once for all of them (the engines' evidence every contract
        # checker reads), by the reader's key; emptied by `seal`, as more records make it stale.
        self.derived: dict[Any, Any] = {}

    # -- construction --

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], *, owned: bool = False) -> History:
        """The view of `records`. A record the view keeps is copied unless `owned` (the caller hands over
        plain dicts it will not change again)."""
        h = cls()
        items: list[Mapping[str, Any]] = []
        for r in records:
            if isinstance(r, Mapping):
                items.append(r)
            else:
                h.bad_records += 1
        # wall_start first, so wall-stamped records seen before run_started can still be placed.
        h.wall_start = next(
            (_f(r.get("wall_start")) for r in items if r.get("type") == "run_started"), None)
        for r in items:
            h.add(r, owned=owned)
        return h.seal()

    def add(self, r: Mapping[str, Any], *, owned: bool = False) -> None:
        """Take one more record (call `seal()` before reading the view). One without a time or a type is
        counted in `bad_records`."""
        t = _f(r.get("t"))
        kind = r.get("type")
        if t is None or not isinstance(kind, str):
            self.bad_records += 1
            return
        # A lent record the view keeps is copied (the lender may change it); a per-request one is read
        # into typed fields and not kept.
        rec: Any = r if (owned and type(r) is dict) or kind in PER_REQUEST_TYPES else dict(r)
        self.record_count += 1
        if kind not in PER_REQUEST_TYPES:
            self.records.append(rec)
        if kind == "run_started" and self.wall_start is None:
            self.wall_start = _f(rec.get("wall_start"))
        if t > self.end_t:
            self.end_t = t
        self._add(rec, t)

    def seal(self) -> History:
        """Order the timelines and index handoffs and requests by tag; again after more records."""
        self.derived = {}
        for views in self.status.values():
            views.sort(key=lambda p: p.t)
        for states in self.engines.values():
            states.sort(key=lambda s: s.t)
        self.handoffs.sort(key=lambda x: x.at)
        self.engine_calls.sort(key=lambda x: x.at)
        self.router_events.sort(key=lambda x: x.at)
        self._by_tag = {}
        for ho in self.handoffs:
            if ho.tag is not None:
                self._by_tag.setdefault(ho.tag, []).append(ho)
        self._req_by_tag = {}
        for rv in self.requests.values():
            if rv.tag is not None:
                self._req_by_tag.setdefault(rv.tag, rv)
        return self

    def _metrics(self, r: Mapping[str, Any]) -> RouterMetrics | None:
        scraped = r.get("scraped")
        rows = r.get("counters")
        if not (isinstance(scraped, list) and len(scraped) == 2 and isinstance(rows, list)):
            self.bad_records += 1
            return None
        start, end = (self._at({"ts": w}, 0.0) for w in scraped)
        counters = tuple(
            (str(row.get("name")), _label_key(row.get("labels")), float(row.get("value") or 0.0))
            for row in rows if isinstance(row, dict))
        return RouterMetrics(start, end, counters)

    def _at(self, r: Mapping[str, Any], t: float) -> float:
        ts = _f(r.get("ts"))
        if ts is None or self.wall_start is None:
            return t
        return ts - self.wall_start

    def _req(self, r: Mapping[str, Any]) -> RequestView:
        key = r.get("req")
        view = self.requests.get(key)
        if view is None:
            view = RequestView(req=key)
            self.requests[key] = view
        if view.tag is None and r.get("tag") is not None:
            view.tag = r.get("tag")
        return view

    def _fault(self, r: Mapping[str, Any]) -> FaultView:
        key = str(r.get("fault"))
        view = self.faults.get(key)
        if view is None:
            view = FaultView(fault=key)
            self.faults[key] = view
        return view

    def _check_shape(self, kind: str, r: Record, t: float) -> None:
        problems = record_problems(kind, r)
        if problems:
            self.malformed += 1
            if len(self.malformed_examples) < MALFORMED_SHOWN:
                self.malformed_examples.append(f"{kind} record of {r.get('engine')} at t={t:.3f} "
                                               + ", ".join(problems))

    def _add(self, r: Record, t: float) -> None:
        kind = r["type"]
        if kind == "run_started":
            self.run = r
        elif kind == "run_ended":
            self.ended = r
        elif kind == "request_invoked":
            v = self._req(r)
            v.invoked_t = t
            v.stream = r.get("stream")
            v.endpoint = r.get("endpoint")
            v.deadline_s = _f(r.get("deadline_s"))
            v.prompt_chars = r.get("prompt_chars")
            mistake = r.get("mistake")
            v.mistake = mistake if isinstance(mistake, str) else None
        elif kind == "request_completed":
            v = self._req(r)
            v.completed_t = t
            status = r.get("status")
            v.status = int(status) if isinstance(status, int | float) else 0
            v.ok = bool(r.get("ok"))
            v.latency_s = _f(r.get("latency_s"))
            v.ttft_s = _f(r.get("ttft_s"))
            v.error = r.get("error")
            text_ok = r.get("text_ok")
            v.text_ok = None if text_ok is None else bool(text_ok)
            v.timed_out = bool(r.get("timed_out"))
            problem = r.get("body_problem")
            v.body_problem = problem if isinstance(problem, str) else None
        elif kind == "fault_applied":
            fv = self._fault(r)
            fv.kind = r.get("kind")
            fv.target = None if r.get("target") is None else str(r.get("target"))
            fv.params = dict(r.get("params") or {})
            fv.changed = dict(r.get("changed") or {})
            fv.applied_t = t
        elif kind == "fault_verified":
            fv = self._fault(r)
            fv.verified_ok = bool(r.get("ok"))
            fv.evidence = r.get("evidence")
        elif kind == "fault_healed":
            fv = self._fault(r)
            fv.healed_t = t
            fv.kind = fv.kind or r.get("kind")
            fv.target = fv.target or (None if r.get("target") is None else str(r.get("target")))
        elif kind == "router_status":
            worker = str(r.get("worker"))
            self.status.setdefault(worker, []).append(
                StatusPoint(
                    t=t,
                    worker=worker,
                    url=r.get("url"),
                    role=r.get("role"),
                    status=str(r.get("status")),
                    kv_engine_id=r.get("kv_engine_id"),
                    engine=r.get("engine"),
                )
            )
        elif kind == "router_event":
            worker = r.get("worker")
            self.router_events.append(
                RouterEvent(
                    t=t,
                    at=self._at(r, t),
                    event=r.get("event"),
                    worker=None if worker is None else str(worker),
                    fields=r,
                )
            )
        elif kind == "router_metrics":
            self.router_metrics = self._metrics(r)
        elif kind == "worker_shape":
            self.worker_shapes.append((t, str(r.get("worker")), [str(p) for p in r.get("problems") or []]))
        elif kind == "engine_state":
            name = str(r.get("engine"))
            gen = r.get("generation")
            port = r.get("side_channel_port")
            self.engines.setdefault(name, []).append(
                EngineSnapshot(
                    t=t,
                    engine=name,
                    engine_id=r.get("engine_id"),
                    generation=gen if isinstance(gen, int) else None,
                    side_channel_port=port if isinstance(port, int) else None,
                    role=r.get("role"),
                    url=r.get("url"),
                    serving=r.get("serving") if isinstance(r.get("serving"), bool) else None,
                )
            )
        elif kind == "handoff":
            self._check_shape(kind, r, t)
            gen = r.get("generation")
            self.handoffs.append(
                Handoff(
                    t=t,
                    at=self._at(r, t),
                    engine=r.get("engine"),
                    engine_id=r.get("engine_id"),
                    generation=gen if isinstance(gen, int) else None,
                    role=r.get("role"),
                    kind=r.get("kind"),
                    request_id=r.get("request_id"),
                    tag=r.get("tag"),
                    connector=r.get("connector"),
                    transfer_id=r.get("transfer_id"),
                    remote_engine_id=r.get("remote_engine_id"),
                    remote_request_id=r.get("remote_request_id"),
                    prompt_digest=r.get("prompt_digest"),
                    kv_digest=r.get("kv_digest"),
                    outcome=r.get("outcome"),
                    error=r.get("error"),
                    duration_s=_f(r.get("duration_s")),
                    output_digest=r.get("output_digest"),
                    peer=r.get("peer"),
                    peer_engine_id=r.get("peer_engine_id"),
                    leg=r.get("leg") if isinstance(r.get("leg"), dict) else None,
                )
            )
        elif kind == "engine_call":
            self._check_shape(kind, r, t)
            gen, status = r.get("generation"), r.get("status")
            detail = r.get("detail")
            self.engine_calls.append(
                EngineCall(
                    t=t,
                    at=self._at(r, t),
                    engine=str(r.get("engine")),
                    engine_id=r.get("engine_id"),
                    generation=gen if isinstance(gen, int) else None,
                    call=str(r.get("call")),
                    status=int(status) if isinstance(status, int | float) else None,
                    duration_s=_f(r.get("duration_s")),
                    caller=str(r.get("caller") or "router"),
                    detail=dict(detail) if isinstance(detail, dict) else {},
                    role=r.get("role") if isinstance(r.get("role"), str) else None,
                )
            )
        elif kind == "note":
            message = str(r.get("message"))
            self.notes.append((t, message))
            collected = r.get("handoffs_collected")
            if isinstance(collected, bool):
                self._collected = collected
            elif _LEGACY_COLLECTED.fullmatch(message):
                self._collected = True
            elif message.startswith("handoff records unreadable"):
                self._collected = False

    # -- run metadata --

    @property
    def complete(self) -> bool:
        """True when `run_ended` was recorded (else the run crashed or was killed: judge with care)."""
        return self.ended is not None

    @property
    def handoffs_collected(self) -> bool:
        """Whether the engines' handoff records are in this history. A real run collects them as it ends (the
        session notes whether it could); a simulated one also streams them as they are made. Without that
        note: a history that ended normally, or that holds handoff records, has them; a run cut short before
        any arrived (killed: no `run_ended`; or abandoned by its world) never collected them, and a checker
        built on them cannot judge it."""
        if self._collected is not None:
            return self._collected
        ended_normally = self.ended is not None and str(self.ended.get("reason", "")) in _NORMAL_ENDS
        return ended_normally or bool(self.handoffs)

    @property
    def settings(self) -> dict[str, Any]:
        return dict((self.run or {}).get("settings") or {})

    def of_type(self, type_: str) -> list[Record]:
        return [r for r in self.records if r.get("type") == type_]

    # -- requests --

    def request_list(self) -> list[RequestView]:
        """Requests in start order (a new list: sorted once per sealed view)."""
        ordered: list[RequestView] | None = self.derived.get(History.request_list)
        if ordered is None or len(ordered) != len(self.requests):
            ordered = sorted(self.requests.values(), key=lambda v: (v.start_t is None, v.start_t or 0.0))
            self.derived[History.request_list] = ordered
        return list(ordered)

    def request_by_tag(self, tag: str | None) -> RequestView | None:
        return None if tag is None else self._req_by_tag.get(tag)

    def requests_started_in(self, start: float, end: float) -> list[RequestView]:
        """Requests sent in [start, end)."""
        return [v for v in self.request_list() if v.start_t is not None and start <= v.start_t < end]

    # -- faults --

    def fault_list(self) -> list[FaultView]:
        return sorted(self.faults.values(), key=lambda f: (f.applied_t is None, f.applied_t or 0.0))

    def fault_windows(self) -> list[tuple[FaultView, float, float]]:
        return [(f, *f.window(self.end_t)) for f in self.fault_list()]

    def step_time(self, name: str) -> float | None:
        """When a timeline step (fault id) took effect: its `fault_applied`, else the first record naming it
        as `fault` (a heal step is only a note), else None."""
        fv = self.faults.get(name)
        if fv is not None and fv.applied_t is not None:
            return fv.applied_t
        for r in self.records:
            if r.get("fault") == name and r.get("type") in ("note", "fault_verified", "fault_healed"):
                return _f(r.get("t"))
        return None

    # -- router status --

    def status_timeline(self, worker: str) -> list[StatusPoint]:
        return list(self.status.get(worker, []))

    def status_at(self, worker: str, t: float) -> StatusPoint | None:
        """Last observation of `worker` at or before `t`."""
        points = self.status.get(worker, [])
        i = bisect_right([p.t for p in points], t)
        return points[i - 1] if i else None

    def workers_for(self, target: str | None) -> list[str]:
        """Router worker ids that a fault target names: a worker id; a worker url; an engine name given as
        `engine` on router_status records; or an engine name whose `engine_state.url` is a worker url.
        Router events (which carry worker and url) count too, for routers seen only through events."""
        if target is None:
            return []
        if target in self.status:
            return [target]
        urls = {s.url for s in self.engines.get(target, []) if s.url}
        urls.add(target)
        found: list[str] = []
        for worker, points in self.status.items():
            if any(p.engine == target or (p.url is not None and p.url in urls) for p in points):
                found.append(worker)
        for ev in self.router_events:
            url = ev.get("url")
            if ev.worker is not None and ev.worker not in found and url is not None and url in urls:
                found.append(ev.worker)
        return found

    def first_status_after(self, worker: str, t: float, status: str = READY) -> float | None:
        """First time at or after `t` that `worker` was observed with `status`."""
        for p in self.status.get(worker, []):
            if p.t >= t and p.status == status:
                return p.t
        return None

    # -- engines and handoffs --

    def engine_id_at(self, engine: str, t: float) -> str | None:
        """The id `engine` had at `t` according to the last engine_state at or before `t`."""
        states = self.engines.get(engine, [])
        i = bisect_right([s.t for s in states], t)
        return states[i - 1].engine_id if i else None

    def engine_role(self, engine: str) -> str | None:
        for s in self.engines.get(engine, []):
            if s.role:
                return s.role
        for ho in self.handoffs:
            if ho.engine == engine and ho.role:
                return ho.role
        return None

    def handoffs_by_tag(self, tag: str | None) -> list[Handoff]:
        return [] if tag is None else list(self._by_tag.get(tag, []))

    def handoffs_of(self, engine: str) -> list[Handoff]:
        return [h for h in self.handoffs if h.engine == engine]

    def engine_calls_of(self, engine: str, *calls: str, by_router: bool = True) -> list[EngineCall]:
        """`engine`'s calls, in arrival order: of the names in `calls` (all when none), and only the router
        under test's (`by_router`) or every caller's."""
        return [c for c in self.engine_calls if c.engine == engine and (not calls or c.call in calls)
                and (c.by_router or not by_router)]

    def router_calls(self, *calls: str) -> list[EngineCall]:
        """Every engine's calls from the router under test, of the names in `calls` (all when none)."""
        return [c for c in self.engine_calls if c.by_router and (not calls or c.call in calls)]

    def router_events_of(self, event: str) -> list[RouterEvent]:
        return [e for e in self.router_events if e.event == event]


def load_history(path: str | os.PathLike[str]) -> History:
    """Read a history file. Lines that cannot be read (binary garbage, damaged or torn JSON, not an object)
    are skipped, counted in `bad_records` and numbered in `bad_lines`: a history that lost records cannot
    give a pass (see `harness.checkers.check_run_complete`).

    Raises FileNotFoundError when there is no file; an empty file gives an empty, incomplete History.
    """
    h = History()
    # Records before run_started (none in a recorder's file: it writes run_started first) wait for its
    # wall_start, which places them; the file is read once.
    early: list[dict[str, Any]] | None = []
    for number, record in jsonl_lines(path):
        if record is None:
            h.bad_lines.append(number)
            h.bad_records += 1
        elif early is None:
            h.add(record, owned=True)
        elif record.get("type") == "run_started":
            h.wall_start = _f(record.get("wall_start"))
            for r in early:
                h.add(r, owned=True)
            early = None
            h.add(record, owned=True)
        else:
            early.append(record)
    for r in early or ():
        h.add(r, owned=True)
    return h.seal()
