"""The engines' view of a run, joined for the contract checkers: which engines are router workers, the
probes each answered, the legs each got, and each worker's contract status over time.

Everything here is read from the engines' side (engine call records and handoff provenance records) and
from the faults the harness carried out, so it holds for any router under test, one that exposes no events
of its own included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.contract.reach import LOSSY, Window, probe_windows
from harness.contract.settings import ID_READ_CALLS, RouterContract, contract_of
from harness.contract.timeline import ProbeSeen, WorkerTimeline, build_timeline
from harness.history import EngineCall, History, base_engine_id

REFUSED = "refused"


@dataclass(frozen=True)
class Leg:
    """One leg an engine got: a handoff record it made, or a generation call it refused (`kind` REFUSED)."""

    engine: str
    tag: str | None
    at: float  # when it reached the engine (scenario clock)
    kind: str  # prefill | decode | local | refused
    status: int | None  # the engine's answer (None: it made a handoff record)
    leg: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None
    transfer_id: str | None = None
    remote_engine_id: str | None = None
    engine_id: str | None = None
    request_id: str | None = None
    ended: float | None = None
    role: str | None = None  # the engine's role (prefill, decode, both)


class EngineView:
    """The joined engine-side evidence of one history, for one router contract."""

    def __init__(self, history: History, contract: RouterContract) -> None:
        self.history = history
        self.contract = contract
        layout = history.settings.get("engines_layout") or {}
        self.roles: dict[str, str] = {name: str(spec.get("role")) for name, spec in layout.items()}
        self._timelines: dict[str, WorkerTimeline] = {}
        self._legs: list[Leg] | None = None
        self._ids: dict[str, list[tuple[float, str]]] = {}

    @classmethod
    def of(cls, history: History) -> EngineView | None:
        """The history's view (None: the run's settings name no router contract), joined once for every
        checker that reads it."""
        if cls not in history.derived:
            contract = contract_of(history)
            history.derived[cls] = None if contract is None else cls(history, contract)
        view: EngineView | None = history.derived[cls]
        return view

    def workers(self, role: str | None = None) -> list[str]:
        return sorted(n for n, r in self.roles.items() if role is None or r == role)

    def probes(self, engine: str) -> list[ProbeSeen]:
        out = []
        for call in self.history.engine_calls_of(engine, *self.contract.probe_calls):
            healthy = call.status == 200 and call.detail.get("healthy", True) is not False
            out.append(ProbeSeen(call.at, call.duration_s or 0.0, healthy))
        return out

    def windows(self, engine: str) -> list[Window]:
        return probe_windows(self.history, engine, self.contract)

    def timed_router_calls(self, engine: str) -> list[EngineCall]:
        """The router's probes and id reads of `engine` whose end the engine could time: none in a window
        that hides when the router let go (the process stopped or gone, its link cut, the router paused)."""
        blind = [w for w in self.windows(engine) if w.kind != LOSSY]
        out = []
        for call in self.history.engine_calls_of(engine, *self.contract.probe_calls, *ID_READ_CALLS):
            if call.duration_s is None:
                continue
            end = call.at + call.duration_s
            if not any(w.start <= end and call.at <= w.end for w in blind):
                out.append(call)
        return out

    def worker_api_times(self, engine: str) -> list[tuple[float, str]]:
        """(time, "added" | "removed") for each time the harness registered `engine` through the router's
        worker API or took it out, in time order."""
        out = []
        for f in self.history.fault_list():
            kind = (f.kind or "").split(":")[-1]
            if f.changed.get("refused") or f.target != engine or f.applied_t is None:
                continue  # a call the router must refuse adds or removes nothing
            if kind in ("add_worker", "remove_worker"):
                out.append((f.applied_t, "added" if kind == "add_worker" else "removed"))
        return sorted(out)

    def unregistered_at_start(self, engine: str) -> bool:
        """Whether the router started without this worker (it joins through the worker API, if ever)."""
        left_out = self.history.settings.get("unregistered_engines") or ()
        return engine in left_out

    def ids_reported(self, engine: str) -> list[tuple[float, str]]:
        """(when the router had it, id) for every engine id `engine` reported in an id read of the router's,
        in time order (kept: a checker asks once per handoff)."""
        if engine not in self._ids:
            answered = [c for c in self.history.engine_calls_of(engine, *ID_READ_CALLS) if c.status == 200]
            self._ids[engine] = sorted((c.ended_at, i) for c in answered for i in reported_ids(c))
        return self._ids[engine]

    def timeline(self, engine: str) -> WorkerTimeline:
        if engine not in self._timelines:
            self._timelines[engine] = build_timeline(
                engine, self.probes(engine), self.windows(engine), self.contract,
                absent_at_start=self.unregistered_at_start(engine), api_calls=self.worker_api_times(engine),
            )
        return self._timelines[engine]

    def legs(self) -> list[Leg]:
        """Every leg an engine got, in arrival order."""
        if self._legs is None:
            self._legs = engine_legs(self.history)
        return self._legs


def engine_legs(history: History) -> list[Leg]:
    """Every leg the engines got from the router, in arrival order: their handoff records and the legs they
    refused or that were cut (`generate` calls). Joined once per sealed history: do not change the list."""
    legs: list[Leg] | None = history.derived.get(engine_legs)
    if legs is None:
        legs = history.derived[engine_legs] = _join_legs(history)
    return legs


def _join_legs(history: History) -> list[Leg]:
    out: list[Leg] = []
    refused = history.router_calls("generate")
    # A relay in front of a real engine keeps a refused leg's failed handoff record beside its call.
    called = {(c.engine, c.detail.get("request_id")) for c in refused}
    for h in history.handoffs:
        if h.engine is None or h.kind is None:
            continue
        if h.leg is None and (h.engine, h.request_id) in called:
            continue
        arrived = h.at - (h.duration_s or 0.0)
        out.append(Leg(h.engine, h.tag, arrived, h.kind, None, dict(h.leg or {}), h.outcome,
                       h.transfer_id, h.remote_engine_id, h.engine_id, h.request_id, h.at, h.role))
    for call in refused:
        d = call.detail
        out.append(Leg(call.engine, d.get("tag"), call.at, REFUSED, call.status, dict(d.get("leg") or {}),
                       engine_id=call.engine_id, request_id=d.get("request_id"), ended=call.ended_at,
                       role=call.role))
    out.sort(key=lambda leg: leg.at)
    return out


def reported_ids(call: EngineCall) -> list[str]:
    """The engine ids one id read answered (its `/query` ranks, or GetServerInfo's `kv_engine_id`)."""
    ids = call.detail.get("engine_ids") or [call.detail.get("kv_engine_id")]
    return [i for i in ids if isinstance(i, str) and i]


def misreported(history: History, engine: str, engine_id: str | None) -> EngineCall | None:
    """A read in which `engine` told a router the id `engine_id` while it served as another (the engine's own
    word was wrong: a router that minted it told the truth it was given), or None."""
    wanted = base_engine_id(engine_id)
    if not wanted:
        return None
    for call in history.engine_calls_of(engine, *ID_READ_CALLS, by_router=False):
        if call.status != 200 or base_engine_id(call.engine_id) == wanted:
            continue
        if wanted in {base_engine_id(i) for i in reported_ids(call)}:
            return call
    return None
