"""Append-only JSON-lines files: event streams, handoff records, histories.

Lines are written and read with orjson: a simulated 64p64d run writes millions of records, and the standard
library's encoder and decoder cost ten times as much per record (bench/sim_speed.py). A record orjson
refuses (an integer past 64 bits, a key that is not a string, a lone surrogate) is written by the standard
library instead, and read back by it, so nothing a writer is given is lost.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS


def dumps_line(record: Any) -> bytes:
    """One compact JSON line (keys sorted, no newline): the same bytes for the same record, every run."""
    try:
        return orjson.dumps(record, option=_ORJSON_OPTIONS, default=str)
    except TypeError:
        return json.dumps(record, separators=(",", ":"), sort_keys=True, default=str).encode("utf-8")


def loads_line(raw: bytes) -> Any:
    """A line's value. The standard library reads what orjson refuses and `dumps_line` may have written
    (a lone surrogate escaped as \\ud800); ValueError when neither can."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(str(exc)) from exc


class JsonlWriter:
    """Thread-safe line writer; each record is flushed so a crash loses at most the line being written
    (`flush_each=False`: buffered, for a writer nothing outside reads while it runs, e.g. a simulation)."""

    def __init__(self, path: str | os.PathLike[str] | None, flush_each: bool = True) -> None:
        self._flush_each = flush_each
        self._lock = threading.Lock()
        self._fh = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "ab")  # noqa: SIM115 - kept open for the writer's life

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        line = dumps_line(record) + b"\n"
        with self._lock:
            self._fh.write(line)
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
    """Yield records; a line that is not a JSON object (a torn last line after a killed writer, damage,
    binary garbage) is skipped, not an error. `read_jsonl_lines` also says which lines were skipped."""
    for _, record in jsonl_lines(path):
        if record is not None:
            yield record


@dataclass(frozen=True)
class JsonlRead:
    """A whole file read: its records, and the 1-based numbers of the lines that could not be read."""

    records: list[dict[str, Any]]
    bad_lines: list[int]


def read_jsonl_lines(path: str | os.PathLike[str]) -> JsonlRead:
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, record in jsonl_lines(path):
        if record is None:
            bad.append(number)
        else:
            records.append(record)
    return JsonlRead(records, bad)


def jsonl_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(1-based line number, the record or None when the line is not a JSON object), blank lines left out:
    a whole file read without holding it."""
    # Bytes, not text: one undecodable line must cost that line, not the file.
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            raw = raw.strip()
            if not raw:
                continue
            try:
                record = loads_line(raw)
            except ValueError:
                yield number, None
                continue
            yield number, record if isinstance(record, dict) else None
