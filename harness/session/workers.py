"""What the harness sees of the router's workers: each change of a worker's status or engine id is one
`router_status` record, and the timeline's conditions see the latest status per engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract.event_schema import worker_problems
from harness.history_writer import HistoryRecorder

Snapshot = dict[str, tuple[str, str | None]]


def status_changes(
    previous: Snapshot, workers: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], Snapshot]:
    """Pure diff of two `/workers` snapshots: (workers whose status or engine id changed or that vanished,
    the new snapshot keyed by worker id). A vanished worker comes back as status `absent`."""
    now: Snapshot = {}
    changed: list[Mapping[str, Any]] = []
    for w in workers:
        wid = str(w.get("id", w.get("url", "")))
        key = (str(w.get("status", "unknown")), w.get("kv_engine_id"))
        now[wid] = key
        if previous.get(wid) != key:
            changed.append(w)
    changed += [{"id": wid, "status": "absent", "kv_engine_id": None} for wid in previous if wid not in now]
    return changed, now


class WorkerWatch:
    """Folds `/workers` reads into `router_status` records and the latest status per engine name."""

    def __init__(self, history: HistoryRecorder) -> None:
        self.history = history
        self.supported: bool | None = None  # None until the first read
        self.problem = ""  # why the first unreadable read was unreadable, when the world said
        self.status: dict[str, str] = {}
        self._snap: Snapshot = {}
        self._urls: dict[str, str] = {}
        self._roles: dict[str, str] = {}
        self._engines: dict[str, str | None] = {}
        self._shapes: set[tuple[str, tuple[str, ...]]] = set()
        # Each worker's entry as last read: an entry read again unchanged has the same shape (most polls).
        self._last: dict[str, Mapping[str, Any]] = {}

    def seen(self, workers: Sequence[Mapping[str, Any]] | None, engines: Mapping[str, str],
             problem: str = "") -> None:
        if workers is None:
            if self.supported is None:
                self.supported = False
                self.problem = problem
            return
        self.supported = True
        for w in workers:
            wid = str(w.get("id", w.get("url", "")))
            if self._last.get(wid) == w:
                continue
            self._last[wid] = w
            problems = tuple(worker_problems(w))
            key = (wid, problems)
            if problems and key not in self._shapes:  # once per worker and problem, not once per poll
                self._shapes.add(key)
                self.history.worker_shape(key[0], list(problems))
        changed, self._snap = status_changes(self._snap, workers)
        for w in changed:
            wid = str(w.get("id", w.get("url", "")))
            url = str(w.get("url") or self._urls.get(wid, ""))
            role = str(w.get("role") or self._roles.get(wid, ""))
            self._urls[wid], self._roles[wid] = url, role
            engine = engines.get(url, self._engines.get(wid))
            self._engines[wid] = engine
            self.history.router_status(
                wid, url, role, str(w.get("status")), w.get("kv_engine_id"),
                engine=engine, engine_id_confirmed=w.get("engine_id_confirmed"),
            )
        statuses: dict[str, str] = {}
        for w in workers:
            name = engines.get(str(w.get("url", "")))
            if name is not None:
                statuses[name] = str(w.get("status"))
        self.status = statuses

    def all_ready(self, names: Sequence[str]) -> bool:
        return all(self.status.get(n) == "ready" for n in names)
