"""Writing a run history: `HistoryRecorder(path, clock)` appends one JSONL record per event, stamped with
`t` = seconds since the recorder was made, from the monotonic `clock` it is given (real runs:
`time.monotonic`; the simulator: the simpy clock). Record types and fields are fixed by CONTRACTS.md
section 3; each has a typed helper method. The typed view (`harness.history.History`) is built as records
come."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.history import History, Record, ReqId
from pdchaos.jsonl import JsonlWriter

Clock = Callable[[], float]

class ManualClock:
    """A clock that moves only when told: for building histories in tests and replaying them."""

    def __init__(self, now: float = 0.0) -> None:
        self.t = now

    def __call__(self) -> float:
        return self.t

    def set(self, t: float) -> None:
        if t < self.t:
            raise ValueError(f"a monotonic clock cannot go back ({t} < {self.t})")
        self.t = t

    def advance(self, dt: float) -> None:
        self.set(self.t + dt)


class HistoryRecorder:
    """Appends history records to `path` (JSONL, flushed per line).

    `clock` is a monotonic clock in seconds; `t` = clock() - clock() at construction (or `start` when given).
    `wall_clock` is used once, for `run_started.wall_start`, so wall-stamped records can be placed on `t`.
    The typed view is built as records come (`history()` needs no re-read of the file). With a file, the
    file is the one full copy: the view holds the per-request records as typed objects only (a long run
    at scale would otherwise keep gigabytes of dicts). `path=None` (tests, in-memory sessions) keeps every
    record in `records` as well: nothing else holds them. An existing file is emptied first unless
    `append`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        clock: Clock = time.monotonic,
        *,
        start: float | None = None,
        wall_clock: Clock = time.time,
        append: bool = False,
        flush_each: bool = True,
    ) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None and not append:
            # One file is one run: a leftover from an earlier run in the same folder must not mix in.
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("", encoding="utf-8")
        self._clock = clock
        self._start = clock() if start is None else start
        self._wall_start = wall_clock() - (clock() - self._start)
        self._writer = JsonlWriter(path, flush_each=flush_each)
        self._view = History()
        self._all: list[Record] | None = [] if self.path is None else None
        self._closed = False

    @property
    def records(self) -> list[Record]:
        """The records kept in memory: all of them without a file, else those the view keeps (not the
        per-request ones: those are in the file)."""
        return self._all if self._all is not None else self._view.records

    @property
    def wall_start(self) -> float:
        """Wall-clock time corresponding to t = 0."""
        return self._wall_start

    def now(self) -> float:
        """Seconds since the start on the recorder's clock."""
        return self._clock() - self._start

    def record(
        self, type_: str, fields: Mapping[str, Any] | None = None, *, t: float | None = None
    ) -> Record:
        """Write one record of `type_` (any type; helpers below cover the contract's types). Returns it."""
        return self._put(dict(fields or {}), type_, t)

    def _put(self, rec: Record, type_: str, t: float | None = None) -> Record:
        """Stamp and keep `rec`, a dict the helpers below built for this record alone (no copy of it)."""
        rec["type"] = type_
        rec["t"] = round(self.now() if t is None else t, 6)
        self._view.add(rec, owned=True)
        if self._all is not None:
            self._all.append(rec)
        if not self._closed:
            self._writer.write(rec)
        return rec

    # -- contract record types (CONTRACTS.md section 3) --

    def run_started(
        self,
        scenario: str,
        topology: str,
        connector: str,
        transport: str,
        router: str,
        seed: int | None = None,
        settings: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> Record:
        fields = {
            "scenario": scenario,
            "topology": topology,
            "connector": connector,
            "transport": transport,
            "router": router,
            "seed": seed,
            "settings": dict(settings or {}),
            "wall_start": self._wall_start,
        }
        fields.update(extra)
        return self._put(fields, "run_started")

    def run_ended(self, reason: str = "done", **extra: Any) -> Record:
        return self._put({"reason": reason, **extra}, "run_ended")

    def request_invoked(
        self,
        req: ReqId,
        tag: str | None,
        *,
        stream: bool = False,
        endpoint: str = "/v1/completions",
        deadline_s: float | None = None,
        prompt_chars: int | None = None,
        **extra: Any,
    ) -> Record:
        """A client request was sent. `deadline_s` is relative to this record's `t`."""
        fields = {
            "req": req,
            "tag": tag,
            "stream": stream,
            "endpoint": endpoint,
            "deadline_s": deadline_s,
            "prompt_chars": prompt_chars,
        }
        fields.update(extra)
        return self._put(fields, "request_invoked")

    def request_completed(
        self,
        req: ReqId,
        tag: str | None,
        *,
        status: int,
        ok: bool,
        latency_s: float,
        ttft_s: float | None = None,
        error: str | None = None,
        text_ok: bool | None = None,
        timed_out: bool = False,
        **extra: Any,
    ) -> Record:
        """A client request ended: `status` is the HTTP code (0 = no response); `ok` = 2xx and no
        error chunk; `text_ok` = output equals the expected completion (None when not checked);
        `timed_out` = the client gave up at its deadline."""
        fields = {
            "req": req,
            "tag": tag,
            "status": status,
            "ok": ok,
            "latency_s": latency_s,
            "ttft_s": ttft_s,
            "error": error,
            "text_ok": text_ok,
            "timed_out": timed_out,
        }
        fields.update(extra)
        return self._put(fields, "request_completed")

    def fault_applied(
        self,
        fault: str,
        kind: str,
        target: str,
        params: Mapping[str, Any] | None = None,
        changed: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> Record:
        """A fault was put in place. `fault` is a run-unique id; `target` the engine name (as in
        `engine_state` and handoff `engine`), a router worker id/url, or a proxy name."""
        fields = {
            "fault": fault,
            "kind": kind,
            "target": target,
            "params": dict(params or {}),
            "changed": dict(changed or {}),
        }
        fields.update(extra)
        return self._put(fields, "fault_applied")

    def fault_verified(self, fault: str, ok: bool, evidence: Any = None, **extra: Any) -> Record:
        return self._put({"fault": fault, "ok": ok, "evidence": evidence, **extra}, "fault_verified")

    def fault_healed(self, fault: str, kind: str, target: str, **extra: Any) -> Record:
        """The fault was removed (one-shot faults such as restart/crash: the target is back)."""
        return self._put({"fault": fault, "kind": kind, "target": target, **extra}, "fault_healed")

    def router_status(
        self,
        worker: str,
        url: str,
        role: str,
        status: str,
        kv_engine_id: str | None = None,
        **extra: Any,
    ) -> Record:
        """One worker as seen in the router's `/workers` (record each poll or only changes: both work).
        Pass `engine=<engine name>` as an extra when known: it maps fault targets to workers directly."""
        fields = {"worker": worker, "url": url, "role": role, "status": status, "kv_engine_id": kv_engine_id}
        fields.update(extra)
        return self._put(fields, "router_status")

    def worker_shape(self, worker: str, problems: list[str]) -> Record:
        """A `/workers` entry not of the documented W (`harness.contract.event_schema.worker_problems`)."""
        return self._put({"worker": worker, "problems": list(problems)}, "worker_shape")

    def router_event(self, event: Mapping[str, Any]) -> Record:
        """A router event record (CONTRACTS.md section 2). Its own `type` is kept as `event` (ours is
        `router_event`); its wall `ts` is kept."""
        fields = _without(event, ("type", "t"))
        fields["event"] = event.get("type")
        return self._put(fields, "router_event")

    def router_metrics(self, snapshot: Mapping[str, Any]) -> Record:
        """The router's counters as read at the run's end (`harness.router_metrics.snapshot`): `scraped`, the
        wall times the read began and ended, and `counters`, each a name, its labels and its value."""
        return self._put(dict(snapshot), "router_metrics")

    def engine_state(
        self,
        engine: str,
        engine_id: str | None,
        generation: int | None = None,
        side_channel_port: int | None = None,
        *,
        role: str | None = None,
        url: str | None = None,
        **extra: Any,
    ) -> Record:
        """An engine's identity now (after start and after each fault). Optional `role` and `url` (the URL the
        router knows the engine by) let checkers map a fault target to the router's worker."""
        fields = {
            "engine": engine,
            "engine_id": engine_id,
            "generation": generation,
            "side_channel_port": side_channel_port,
        }
        if role is not None:
            fields["role"] = role
        if url is not None:
            fields["url"] = url
        fields.update(extra)
        return self._put(fields, "engine_state")

    def handoff(self, provenance: Mapping[str, Any]) -> Record:
        """An engine handoff provenance record, verbatim (its `ts` is the engine's wall clock)."""
        return self._put(_without(provenance, ("type", "t")), "handoff")

    def engine_call(self, call: Mapping[str, Any]) -> Record:
        """An engine call record (CONTRACTS.md §1 "Engine call record"), verbatim but for its discriminator
        (its `ts` is the engine's wall clock, when the call arrived)."""
        return self._put(_without(call, ("type", "t", "record")), "engine_call")

    def engine_record(self, record: Mapping[str, Any]) -> Record:
        """One line of an engine's records stream: a call record or a handoff record."""
        if record.get("record") == "engine_call":
            return self.engine_call(record)
        return self.handoff(record)

    def note(self, message: str, **extra: Any) -> Record:
        return self._put({"message": message, **extra}, "note")

    def history(self) -> History:
        """The typed view of everything recorded so far (built as records came; later records go on
        into the same view)."""
        return self._view.seal()

    def close(self) -> None:
        self._closed = True
        self._writer.close()

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _without(record: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """A copy of `record` less `keys`, in its order (a C-level copy: every handoff record passes here)."""
    fields = dict(record)
    for key in keys:
        fields.pop(key, None)
    return fields
