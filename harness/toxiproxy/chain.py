"""The toxic chain of one direction of one connection (sans-IO).

The asyncio link feeds it bytes and end-of-stream with the time they arrived and asks it, at any `now`,
what is due: bytes to write, an end-of-stream to pass on, or a close/reset of the whole connection.
Toxicity is drawn per (connection, toxic version) from a hash of the server seed, so a run replays
exactly given the same connection order, and no draw depends on how connections interleave.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Sequence

from harness.toxiproxy.stages import Out, Stage, make_stage
from harness.toxiproxy.toxics import ToxicSpec

_INF = float("inf")


def unit_draw(*key: object) -> float:
    """A uniform number in [0, 1) fixed by key: the same key always draws the same number."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def seeded_rng(*key: object) -> random.Random:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


class DirectionChain:
    def __init__(self, *key: object) -> None:
        """key names this direction for the draws, e.g. (seed, proxy, connection number, stream)."""
        self._key = key
        # (toxic name, version) -> stage, or None where the toxicity draw missed.
        self._entries: dict[tuple[str, int], Stage | None] = {}
        self._order: list[tuple[str, int]] = []
        self._queue: deque[Out] = deque()
        self._last_at = -_INF
        self._terminal: Out | None = None
        self.queued_bytes = 0
        self.eof_fed = False
        self.ended = False  # a close/reset was handed out: nothing more will come

    # --- configuration -------------------------------------------------------------------------
    def sync(self, specs: Sequence[ToxicSpec], now: float) -> None:
        """Make the chain match the proxy's toxics for this direction; new ones take hold at `now`."""
        old_by_name = {key[0]: self._entries[key] for key in self._order}
        old_order = list(self._order)
        entries: dict[tuple[str, int], Stage | None] = {}
        order = []
        for spec in specs:
            key = (spec.name, spec.version)
            if key in self._entries:
                entries[key] = self._entries[key]
            else:
                entries[key] = self._build(spec, now, old_by_name.get(spec.name))
            order.append(key)
        gone = [(i, self._entries[k]) for i, k in enumerate(old_order) if k not in entries]
        self._entries, self._order = entries, order
        # What a removed or replaced stage still held goes on through the stages that followed it.
        stages = self._stages()
        for position, stage in gone:
            if stage is not None and not self.ended:
                self._route(stages, min(position, len(stages)), stage.release(now))

    def _build(self, spec: ToxicSpec, now: float, old: Stage | None) -> Stage | None:
        if unit_draw(*self._key, spec.name, spec.version, "toxicity") >= spec.toxicity:
            return None
        stage = make_stage(spec.type, spec.attributes, now, seeded_rng(*self._key, spec.name, spec.version))
        if old is not None:
            stage.inherit(old)
        return stage

    def active_toxics(self) -> list[str]:
        """Names of the toxics that took hold on this connection (toxicity draw hit)."""
        return [key[0] for key in self._order if self._entries[key] is not None]

    def _stages(self) -> list[Stage]:
        return [s for s in (self._entries[k] for k in self._order) if s is not None]

    # --- input ---------------------------------------------------------------------------------
    def feed(self, data: bytes, now: float) -> None:
        if data and not self.eof_fed and not self.ended:
            self._route(self._stages(), 0, [Out(now, "data", data)])

    def feed_eof(self, now: float) -> None:
        if not self.eof_fed and not self.ended:
            self.eof_fed = True
            self._route(self._stages(), 0, [Out(now, "eof")])

    def _route(self, stages: list[Stage], index: int, items: list[Out]) -> None:
        for item in items:
            if item.kind in ("close", "reset"):
                if self._terminal is None or item.at < self._terminal.at:
                    self._terminal = item
            elif index == len(stages):
                self._enqueue(item)
            elif item.kind == "data":
                self._route(stages, index + 1, stages[index].on_data(item.data, item.at))
            else:
                self._route(stages, index + 1, stages[index].on_eof(item.at))

    def _enqueue(self, item: Out) -> None:
        # A byte stream is FIFO whatever the toxics did: nothing leaves before what came earlier.
        self._last_at = max(self._last_at, item.at)
        self._queue.append(Out(self._last_at, item.kind, item.data))
        self.queued_bytes += len(item.data)

    # --- output --------------------------------------------------------------------------------
    def _run_timers(self, now: float) -> None:
        stages = self._stages()
        for index, stage in enumerate(stages):
            deadline = stage.deadline()
            if deadline is not None and deadline <= now:
                self._route(stages, index + 1, stage.on_time(now))

    def poll(self, now: float, data_ok: bool = True) -> list[Out]:
        """What is due by `now`, in order. data_ok=False holds bytes back (the writer is full)."""
        if self.ended:
            return []
        self._run_timers(now)
        limit = min(now, self._terminal.at if self._terminal else _INF)
        due: list[Out] = []
        while data_ok and self._queue and self._queue[0].at <= limit:
            item = self._queue.popleft()
            self.queued_bytes -= len(item.data)
            due.append(item)
        if self._terminal is not None and self._terminal.at <= now:
            due.append(self._terminal)
            self.ended = True
            self._queue.clear()
            self.queued_bytes = 0
        return due

    def next_deadline(self, data_ok: bool = True) -> float | None:
        """When poll() next has something to do; None when only new input can change that."""
        if self.ended:
            return None
        times = [d for d in (s.deadline() for s in self._stages()) if d is not None]
        if self._terminal is not None:
            times.append(self._terminal.at)
        if data_ok and self._queue:
            times.append(self._queue[0].at)
        return min(times) if times else None
