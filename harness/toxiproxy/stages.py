"""One stage per active toxic on one direction of one connection (sans-IO).

A stage is a pure transform of (chunk, at) into scheduled outputs: data and end-of-stream keep their
order and only move later in time; `close` and `reset` end the whole connection at their time.
Stages hold no bytes, whatever they pass on is scheduled at once, so removing a stage loses no data
already let through; the one exception is a bandwidth of rate 0, which passes nothing (Toxiproxy's own
stall) and lets what it held go on when it is removed or updated (`release`). Stages with their own clocks
(timeout, reset_peer) expose `deadline()`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Literal, NamedTuple

Kind = Literal["data", "eof", "close", "reset"]


class Out(NamedTuple):
    at: float
    kind: Kind
    data: bytes = b""


class Stage:
    """Pass-through; subclasses override what they change."""

    def on_data(self, data: bytes, at: float) -> list[Out]:
        return [Out(at, "data", data)]

    def on_eof(self, at: float) -> list[Out]:
        return [Out(at, "eof")]

    def deadline(self) -> float | None:
        return None

    def on_time(self, now: float) -> list[Out]:
        return []

    def inherit(self, old: Stage) -> None:
        """Carry state over from the previous version of the same toxic (an update, not a new toxic)."""

    def release(self, now: float) -> list[Out]:
        """What the stage still holds, let go at `now` as it is removed or replaced."""
        return []


class Latency(Stage):
    def __init__(self, latency_ms: int, jitter_ms: int, rng: random.Random) -> None:
        self.latency_s = latency_ms / 1000.0
        self.jitter_s = jitter_ms / 1000.0
        self.rng = rng
        self.last = float("-inf")

    def _delay(self) -> float:
        jitter = self.rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s > 0 else 0.0
        return max(0.0, self.latency_s + jitter)

    def on_data(self, data: bytes, at: float) -> list[Out]:
        # max() keeps order: jitter delays chunks unevenly but never reorders a byte stream.
        self.last = max(self.last, at + self._delay())
        return [Out(self.last, "data", data)]

    def on_eof(self, at: float) -> list[Out]:
        self.last = max(self.last, at)
        return [Out(self.last, "eof")]

    def inherit(self, old: Stage) -> None:
        if isinstance(old, Latency):
            self.last = old.last


class Bandwidth(Stage):
    # Slice size as a time: small enough for a smooth rate, large enough to keep writes few.
    SLICE_S = 0.02

    def __init__(self, rate_kb_s: int) -> None:
        self.bytes_per_s = rate_kb_s * 1000.0
        self.free_at = float("-inf")
        # Rate 0: Toxiproxy sends empty slices forever, so nothing passes until the toxic goes away.
        self.held: list[bytes] = []
        self.held_eof = False

    def on_data(self, data: bytes, at: float) -> list[Out]:
        if self.bytes_per_s <= 0:
            self.held.append(data)
            return []
        piece = max(1, int(self.bytes_per_s * self.SLICE_S))
        t = max(self.free_at, at)
        outs = []
        for start in range(0, len(data), piece):
            chunk = data[start : start + piece]
            # Each piece leaves when its whole transmission time has passed, so N bytes take N/rate.
            t += len(chunk) / self.bytes_per_s
            outs.append(Out(t, "data", chunk))
        self.free_at = t
        return outs

    def on_eof(self, at: float) -> list[Out]:
        if self.bytes_per_s <= 0:
            self.held_eof = True
            return []
        return [Out(max(self.free_at, at), "eof")]

    def inherit(self, old: Stage) -> None:
        if isinstance(old, Bandwidth):
            self.free_at = old.free_at

    def release(self, now: float) -> list[Out]:
        outs = [Out(now, "data", data) for data in self.held]
        if self.held_eof:
            outs.append(Out(now, "eof"))
        self.held, self.held_eof = [], False
        return outs


class SlowClose(Stage):
    def __init__(self, delay_ms: int) -> None:
        self.delay_s = delay_ms / 1000.0

    def on_eof(self, at: float) -> list[Out]:
        return [Out(at + self.delay_s, "eof")]


class Timeout(Stage):
    """Swallows all data; with timeout > 0 closes the connection that long after the toxic took hold."""

    def __init__(self, timeout_ms: int, attached_at: float) -> None:
        self.close_at: float | None = attached_at + timeout_ms / 1000.0 if timeout_ms > 0 else None

    def on_data(self, data: bytes, at: float) -> list[Out]:
        return []

    def deadline(self) -> float | None:
        return self.close_at

    def on_time(self, now: float) -> list[Out]:
        if self.close_at is None or self.close_at > now:
            return []
        at, self.close_at = self.close_at, None
        return [Out(at, "close")]


class ResetPeer(Stage):
    """Like Toxiproxy: the first thing to arrive (data or end) arms a reset `timeout` ms later."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_s = timeout_ms / 1000.0
        self.reset_at: float | None = None
        self.fired = False

    def _arm(self, at: float) -> list[Out]:
        if self.reset_at is None and not self.fired:
            self.reset_at = at + self.timeout_s
        return []

    def on_data(self, data: bytes, at: float) -> list[Out]:
        return self._arm(at)

    def on_eof(self, at: float) -> list[Out]:
        return self._arm(at)

    def deadline(self) -> float | None:
        return self.reset_at

    def on_time(self, now: float) -> list[Out]:
        if self.reset_at is None or self.reset_at > now:
            return []
        at, self.reset_at, self.fired = self.reset_at, None, True
        return [Out(at, "reset")]


class Slicer(Stage):
    def __init__(self, average_size: int, size_variation: int, delay_us: int, rng: random.Random) -> None:
        self.average = average_size
        self.variation = size_variation
        self.delay_s = delay_us / 1_000_000.0
        self.rng = rng
        self.last = float("-inf")

    def sizes(self, total: int) -> list[int]:
        """Piece sizes summing to total; a chunk within average+variation is left whole."""
        out: list[int] = []
        left = total
        while left - self.average > self.variation:
            size = self.average + self.rng.randint(-self.variation, self.variation)
            out.append(size)
            left -= size
        if left > 0:
            out.append(left)
        return out

    def on_data(self, data: bytes, at: float) -> list[Out]:
        t = max(self.last, at)
        outs = []
        pos = 0
        for i, size in enumerate(self.sizes(len(data))):
            if i:
                t += self.delay_s
            outs.append(Out(t, "data", data[pos : pos + size]))
            pos += size
        self.last = t
        return outs

    def on_eof(self, at: float) -> list[Out]:
        return [Out(max(self.last, at), "eof")]


class LimitData(Stage):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent = 0
        self.closed = False

    def on_data(self, data: bytes, at: float) -> list[Out]:
        if self.closed:
            return []
        room = max(0, self.limit - self.sent)
        chunk = data[:room]
        self.sent += len(chunk)
        outs = [Out(at, "data", chunk)] if chunk else []
        if self.sent >= self.limit:
            self.closed = True
            outs.append(Out(at, "close"))
        return outs

    def inherit(self, old: Stage) -> None:
        if isinstance(old, LimitData):
            self.sent = old.sent


def make_stage(toxic_type: str, attrs: Mapping[str, int], attached_at: float, rng: random.Random) -> Stage:
    """The stage for one validated toxic (see toxics.TOXIC_ATTRIBUTES for the attribute names)."""
    if toxic_type == "latency":
        return Latency(attrs["latency"], attrs["jitter"], rng)
    if toxic_type == "bandwidth":
        return Bandwidth(attrs["rate"])
    if toxic_type == "slow_close":
        return SlowClose(attrs["delay"])
    if toxic_type == "timeout":
        return Timeout(attrs["timeout"], attached_at)
    if toxic_type == "reset_peer":
        return ResetPeer(attrs["timeout"])
    if toxic_type == "slicer":
        return Slicer(attrs["average_size"], attrs["size_variation"], attrs["delay"], rng)
    if toxic_type == "limit_data":
        return LimitData(attrs["bytes"])
    raise ValueError(f"unknown toxic type {toxic_type!r}")
