"""Progress display for `pdchaos run`: one updating stderr line on a TTY, plain lines otherwise.

The display learns what happens by tailing the run folder's history files (`**/history.jsonl`, CONTRACTS §3)
so it needs no hook inside the runner: whatever writes histories gets a progress display. A runner that knows
a cell's verdict may say so with `finish(...)`; otherwise a finished cell shows `ended`.

`ProgressBoard` is the sans-IO core (records in, a text line out, `now` passed in); `ProgressReporter` is the
asyncio shell that polls the files and writes to the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

HISTORY_NAME = "history.jsonl"


@dataclass
class CellProgress:
    """One scenario x topology x connector x transport run, as seen from its history."""

    key: str
    started: float
    scenario: str = "?"
    topology: str = "?"
    connector: str = ""
    transport: str = ""
    requests_sent: int = 0
    requests_done: int = 0
    requests_failed: int = 0
    faults: int = 0
    last_fault: str = ""
    ended_at: float | None = None
    verdict: str | None = None

    @property
    def label(self) -> str:
        parts = [p for p in (self.topology, self.connector, self.transport) if p]
        return f"{self.scenario} {'/'.join(parts)}"

    def elapsed(self, now: float) -> float:
        return (self.ended_at if self.ended_at is not None else now) - self.started


@dataclass
class ProgressBoard:
    """Pure state of a run's progress. `total` (cells planned) is optional."""

    started: float
    total: int | None = None
    cells: dict[str, CellProgress] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def _cell(self, key: str, now: float) -> CellProgress:
        cell = self.cells.get(key)
        if cell is None:
            cell = CellProgress(key=key, started=now)
            self.cells[key] = cell
            self.order.append(key)
        return cell

    def observe(self, key: str, record: dict[str, Any], now: float) -> list[str]:
        """Fold one history record in; returns notable events as short texts (for plain-line output)."""
        cell = self._cell(key, now)
        kind = record.get("type")
        out: list[str] = []
        if kind == "run_started":
            cell.scenario = str(record.get("scenario", cell.scenario))
            cell.topology = str(record.get("topology", cell.topology))
            cell.connector = str(record.get("connector") or "")
            cell.transport = str(record.get("transport") or "")
            out.append(f"started {cell.label}")
        elif kind == "request_invoked":
            cell.requests_sent += 1
        elif kind == "request_completed":
            cell.requests_done += 1
            if not record.get("ok"):
                cell.requests_failed += 1
        elif kind == "fault_applied":
            cell.faults += 1
            cell.last_fault = f"{record.get('kind', '?')}@{record.get('target', '?')}"
            out.append(f"{cell.label}: fault {cell.last_fault}")
        elif kind == "run_ended":
            cell.ended_at = now
            out.append(f"ended {cell.label} ({record.get('reason', 'done')})")
        return out

    def finish(self, key: str, verdict: str, now: float) -> None:
        cell = self._cell(key, now)
        cell.verdict = verdict
        if cell.ended_at is None:
            cell.ended_at = now

    def current(self) -> CellProgress | None:
        for key in reversed(self.order):
            if self.cells[key].ended_at is None:
                return self.cells[key]
        return self.cells[self.order[-1]] if self.order else None

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "unknown": 0}
        for cell in self.cells.values():
            if cell.verdict in out:
                out[cell.verdict] += 1
        return out

    def line(self, now: float) -> str:
        """The one-line summary: cell n/total, what runs, elapsed, requests, faults, verdicts so far."""
        done = sum(1 for c in self.cells.values() if c.ended_at is not None)
        total = f"/{self.total}" if self.total else ""
        head = f"[{done}{total}] {_fmt_s(now - self.started)}"
        cur = self.current()
        if cur is None:
            return f"{head} starting..."
        state = "running" if cur.ended_at is None else (cur.verdict or "ended")
        req = f"req {cur.requests_done}/{cur.requests_sent}"
        if cur.requests_failed:
            req += f" ({cur.requests_failed} err)"
        fault = f"faults {cur.faults}" + (f" last {cur.last_fault}" if cur.last_fault else "")
        c = self.counts()
        verdicts = f"pass {c['pass']} fail {c['fail']} unknown {c['unknown']}"
        return f"{head} {cur.label} {state} {_fmt_s(cur.elapsed(now))} | {req} | {fault} | {verdicts}"


def _fmt_s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


@dataclass
class _Tail:
    offset: int = 0
    pending: bytes = b""


class ProgressReporter:
    """Polls `run_dir` for history files and draws the board on `stream` (stderr by default).

    On a TTY it redraws a single line (`\\r` + clear); otherwise it prints one plain line per notable event
    (cell started, fault applied, cell ended) and a heartbeat every `heartbeat_s`.
    """

    def __init__(
        self,
        run_dir: Path,
        stream: TextIO | None = None,
        tty: bool | None = None,
        total: int | None = None,
        interval_s: float = 0.25,
        heartbeat_s: float = 15.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.board = ProgressBoard(started=time.monotonic(), total=total)
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self._tails: dict[Path, _Tail] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_plain = time.monotonic()
        self._drawn = False

    def poll(self) -> None:
        """Read whatever the history files gained since the last poll and update the display once."""
        now = time.monotonic()
        events: list[str] = []
        # Known files first, in the order they appeared: a cell's end is told before the next cell's start.
        found = sorted(self.run_dir.rglob(HISTORY_NAME)) if self.run_dir.is_dir() else []
        for path in [*self._tails, *(p for p in found if p not in self._tails)]:
            events += self._read_new(path, now)
        self._draw(now, events)

    def _read_new(self, path: Path, now: float) -> list[str]:
        tail = self._tails.setdefault(path, _Tail())
        try:
            with open(path, "rb") as fh:
                fh.seek(tail.offset)
                chunk = fh.read()
        except OSError:
            return []
        tail.offset += len(chunk)
        tail.pending += chunk
        *lines, tail.pending = tail.pending.split(b"\n")
        key = str(path.parent)
        events: list[str] = []
        for raw in lines:
            rec = _decode(raw)
            if rec is not None:
                events += self.board.observe(key, rec, now)
        return events

    def finish(self, cell_dir: Path | str, verdict: str) -> None:
        """Tell the board a cell's verdict (the runner knows it; the history does not)."""
        self.board.finish(str(Path(cell_dir)), verdict, time.monotonic())

    def _draw(self, now: float, events: list[str]) -> None:
        if self.tty:
            width = _term_width()
            text = self.board.line(now)
            if len(text) > width - 1:
                text = text[: max(10, width - 2)] + "…"
            self._write("\r\x1b[K" + text)
            self._drawn = True
            return
        for ev in events:
            self._write(f"pdchaos: {ev}\n")
            self._last_plain = now
        if now - self._last_plain >= self.heartbeat_s:
            self._write(f"pdchaos: {self.board.line(now)}\n")
            self._last_plain = now

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()

    async def _loop(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, final: str | None = None) -> None:
        """Stop polling, draw a last time, end the TTY line, and print `final` if given."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.poll()
        if self.tty and self._drawn:
            self._write("\n")
            self._drawn = False
        if final:
            self._write(final.rstrip("\n") + "\n")


def _decode(raw: bytes) -> dict[str, Any] | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _term_width() -> int:
    try:
        cols = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 120
    # A pseudo-terminal with no size set reports 0 columns: do not cut the line to nothing.
    return cols if cols >= 40 else 120
