"""The router's worker table: ids, lookup by role, property updates, removal. No I/O."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .worker_urls import same_engine
from .workers import READY, Role, Worker, WorkerSpec, apply_property_update


class DuplicateWorkerError(ValueError):
    """The engine is already registered in this role, under this url or another spelling of it (the server
    answers 409)."""


class WorkerRegistry:
    """Workers by id ("w1", "w2", ... in registration order; ids are never reused)."""

    def __init__(self, bugs: frozenset[str] = frozenset()) -> None:
        self._workers: dict[str, Worker] = {}
        # Workers of each role in id order, rebuilt after a change: every leg of every request reads it.
        self._roles: dict[Role, tuple[Worker, ...]] | None = None
        self._seq = 0
        self.bugs = bugs  # test-only zoo switches (core.bugs) of the worker API

    def add(self, spec: WorkerSpec) -> Worker:
        """Register a Pending worker; DuplicateWorkerError when its engine is registered for the same role
        (`localhost` for `127.0.0.1`, letter case, a trailing slash: one engine, one worker)."""
        for w in self._workers.values():
            if w.spec.role is spec.role and same_engine(w.spec.url, spec.url):
                raise DuplicateWorkerError(f"worker {w.id} already has url {w.spec.url} as {spec.role.value}")
        self._seq += 1
        worker = Worker.new(f"w{self._seq}", spec)
        self._workers[worker.id] = worker
        self._roles = None
        return worker

    def get(self, worker_id: str) -> Worker | None:
        return self._workers.get(worker_id)

    def remove(self, worker_id: str) -> Worker | None:
        self._roles = None
        return self._workers.pop(worker_id, None)

    def update(self, worker_id: str, body: Any) -> Worker:
        """Apply a PATCH body (labels/priority); KeyError for an unknown id, ValueError for a bad body."""
        worker = self._workers[worker_id]
        worker.spec = apply_property_update(worker.spec, body, self.bugs)
        self._roles = None
        return worker

    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def by_role(self, role: Role) -> list[Worker]:
        return list(self._of_role(role))

    def of_role(self, role: Role) -> tuple[Worker, ...]:
        """Workers of a role in id order, whatever their status (kept between changes: not a copy)."""
        return self._of_role(role)

    def ready(self, role: Role) -> list[Worker]:
        """Ready workers of a role, in id order (the candidates a leg's policy chooses from)."""
        return [w for w in self._of_role(role) if w.runtime.status is READY]

    def _of_role(self, role: Role) -> tuple[Worker, ...]:
        if self._roles is None:
            roles: dict[Role, list[Worker]] = {}
            for w in self._workers.values():
                roles.setdefault(w.spec.role, []).append(w)
            self._roles = {r: tuple(ws) for r, ws in roles.items()}
        return self._roles.get(role, ())

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)
