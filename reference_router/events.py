"""Router event stream: in memory for `GET /events`, mirrored to a JSON-lines file (CONTRACTS §2 records)."""

from __future__ import annotations

import time
from typing import Any

from pdchaos.jsonl import JsonlWriter


class EventLog:
    """Append-only event list; bounded in memory so a long run cannot exhaust it."""

    def __init__(self, path: str | None = None, max_events: int = 200_000) -> None:
        self._writer = JsonlWriter(path)
        self._events: list[dict[str, Any]] = []
        self._dropped = 0
        self._max = max_events

    def emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"ts": time.time(), "type": type_, **fields}
        self._writer.write(record)
        self._events.append(record)
        if len(self._events) > self._max:
            # Drop the oldest half at once so trimming stays amortised O(1).
            cut = len(self._events) // 2
            del self._events[:cut]
            self._dropped += cut
        return record

    def since(self, index: int) -> tuple[list[dict[str, Any]], int]:
        """Events with sequence number >= index, and the next index to ask for."""
        start = max(0, index - self._dropped)
        return self._events[start:], self._dropped + len(self._events)

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self._events if e["type"] == type_]

    def close(self) -> None:
        self._writer.close()
