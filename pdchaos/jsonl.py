"""Append-only JSON-lines files: event streams, handoff records, histories."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class JsonlWriter:
    """Thread-safe line writer; each record is flushed so a crash loses at most the line being written
    (`flush_each=False`: buffered, for a writer nothing outside reads while it runs, e.g. a simulation)."""

    def __init__(self, path: str | os.PathLike[str] | None, flush_each: bool = True) -> None:
        self._flush_each = flush_each
        self._lock = threading.Lock()
        self._fh = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the writer's life

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        line = json.dumps(record, separators=(",", ":"), sort_keys=True, default=str)
        with self._lock:
            self._fh.write(line + "\n")
            if self._flush_each:
                self._fh.flush()

    def flush(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield records; a torn last line (writer killed mid-write) is skipped, not an error."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
