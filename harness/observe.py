"""Observers: what the harness sees of the system while a scenario runs.

- `RouterWatcher` polls the router's `/workers` (every ~0.15 s) and records each change as `router_status`; it
  keeps the timeline's `World.worker_status` (by engine name) current.
- `RouterEventsWatcher` copies the router's `/events` into `router_event` records.
- `collect_handoffs` copies the engines' handoff provenance (the `--records` files, which survive crashes and
  respawns) into `handoff` records at the end of a run; `poll_handoffs` does the same live through the control
  API.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp

from fake_engines.control_client import ControlError, EngineControlClient
from harness.history import HistoryRecorder
from harness.routers import RouterAdapter
from harness.scenario import World
from harness.topology import Topology
from pdchaos.jsonl import read_jsonl


def status_changes(
    previous: dict[str, tuple[str, str | None]], workers: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str | None]]]:
    """Pure diff of two `/workers` snapshots: (workers whose status or engine id changed or that vanished,
    the new snapshot keyed by worker id). A vanished worker comes back as status `absent`."""
    now: dict[str, tuple[str, str | None]] = {}
    changed: list[dict[str, Any]] = []
    for w in workers:
        wid = str(w.get("id", w.get("url", "")))
        key = (str(w.get("status", "unknown")), w.get("kv_engine_id"))
        now[wid] = key
        if previous.get(wid) != key:
            changed.append(w)
    for wid in previous:
        if wid not in now:
            changed.append({"id": wid, "status": "absent", "kv_engine_id": None, "_vanished": True})
    return changed, now


class RouterWatcher:
    def __init__(
        self,
        adapter: RouterAdapter,
        session: aiohttp.ClientSession,
        topo: Topology,
        history: HistoryRecorder,
        world: World,
        interval_s: float = 0.15,
    ) -> None:
        self.adapter = adapter
        self.session = session
        self.topo = topo
        self.history = history
        self.world = world
        self.interval_s = interval_s
        self._snap: dict[str, tuple[str, str | None]] = {}
        self._urls: dict[str, str] = {}
        self._roles: dict[str, str] = {}
        self.polls = 0
        self.failed_polls = 0
        self.supported: bool | None = None

    async def poll_once(self) -> list[dict[str, Any]] | None:
        workers = await self.adapter.workers(self.session, self.topo)
        self.polls += 1
        if workers is None:
            self.failed_polls += 1
            if self.supported is None:
                self.supported = False
            return None
        self.supported = True
        changed, self._snap = status_changes(self._snap, workers)
        for w in changed:
            wid = str(w.get("id", w.get("url", "")))
            url = str(w.get("url") or self._urls.get(wid, ""))
            role = str(w.get("role") or self._roles.get(wid, ""))
            self._urls[wid], self._roles[wid] = url, role
            self.history.router_status(
                wid, url, role, str(w.get("status")), w.get("kv_engine_id"),
                engine=self.topo.name_of_url(url), engine_id_confirmed=w.get("engine_id_confirmed"),
            )
        statuses: dict[str, str] = {}
        for w in workers:
            name = self.topo.name_of_url(str(w.get("url", "")))
            if name is not None:
                statuses[name] = str(w.get("status"))
        self.world.worker_status = statuses
        return workers

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)


class RouterEventsWatcher:
    def __init__(
        self,
        adapter: RouterAdapter,
        session: aiohttp.ClientSession,
        topo: Topology,
        history: HistoryRecorder,
        interval_s: float = 0.25,
        skip: frozenset[str] = frozenset({"dispatch"}),
    ) -> None:
        self.adapter = adapter
        self.session = session
        self.topo = topo
        self.history = history
        self.interval_s = interval_s
        self.cursor = 0
        self.count = 0
        self.skip = skip
        self.supported: bool | None = None

    async def poll_once(self) -> None:
        got = await self.adapter.events(self.session, self.topo, self.cursor)
        if got is None:
            if self.supported is None:
                self.supported = False
            return
        self.supported = True
        events, nxt = got
        for ev in events:
            # Dispatch events are one per request (the engines' records say more); probes are kept: the
            # probe-starvation checker needs them.
            if ev.get("type") in self.skip:
                continue
            self.history.router_event(ev)
            self.count += 1
        self.cursor = max(self.cursor, nxt)

    async def run(self, stop: asyncio.Event) -> None:
        if not self.adapter.has_events:
            return
        while not stop.is_set():
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
        await self.poll_once()


def collect_handoffs(history: HistoryRecorder, files: dict[str, Path]) -> int:
    """Copy every engine's provenance records into the history (end of run). Returns how many."""
    n = 0
    for _name, path in sorted(files.items()):
        if not path.exists():
            continue
        for rec in read_jsonl(path):
            history.handoff(rec)
            n += 1
    return n


async def poll_handoffs(
    client: EngineControlClient, history: HistoryRecorder, since: int
) -> int:
    """Copy new records from one engine's control API; returns the next cursor (unchanged on error)."""
    try:
        body = await client.records(since)
    except (ControlError, aiohttp.ClientError, TimeoutError, ValueError):
        return since
    if not isinstance(body, dict):
        return since
    for rec in body.get("records") or []:
        if isinstance(rec, dict):
            history.handoff(rec)
    nxt = body.get("next")
    return nxt if isinstance(nxt, int) else since
