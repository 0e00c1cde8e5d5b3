"""Read an incident bundle (a folder, or files) into facts. Each file is recognised by its content, not its
name: a gateway log (smg, vllm-router; text or JSON; `.gz` too), engine logs (vLLM, the fake engines),
Kubernetes events, the gateway's command line (`*.cmdline`, or any file holding just that command) and
`incident.toml`. A file that is none of these, binary, or cut short is read as far as it goes and named in
the notes; a bundle with nothing usable is refused with one line."""

from __future__ import annotations

import gzip
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.incident.facts import Fact, IncidentError, ReadNotes, parse_offset
from harness.incident.read_engines import looks_like_engine_log, read_engine_log
from harness.incident.read_gateway import looks_like_gateway_log, read_gateway_log
from harness.incident.read_notes import (
    looks_like_command,
    looks_like_kube_events,
    parse_json,
    read_command,
    read_kube_events,
    read_timeline,
)

# A bundle file larger than this is read up to it (the notes say so).
MAX_FILE_BYTES = 256 * 1024 * 1024
TIMELINE_NAME = "incident.toml"


@dataclass
class Bundle:
    facts: list[Fact] = field(default_factory=list)
    notes: ReadNotes = field(default_factory=ReadNotes)
    # (file, what it was read as, facts it gave)
    files: list[tuple[str, str, int]] = field(default_factory=list)
    # incident.toml's reading options (utc_offset, year)
    options: dict[str, Any] = field(default_factory=dict)

    def of(self, kind: str) -> list[Fact]:
        return [f for f in self.facts if f.kind == kind]


def bundle_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith(".")))
        elif p.is_file():
            out.append(p)
        else:
            raise IncidentError(f"{p}: no such file or folder")
    return out


def _text(path: Path, notes: ReadNotes) -> str | None:
    """The file as text; None (noted) for binary content."""
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
        opener: Any = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError) as exc:
        notes.skipped.append(f"{path.name}: unreadable ({exc})")
        return None
    if len(raw) > MAX_FILE_BYTES:
        notes.skipped.append(f"{path.name}: read up to {MAX_FILE_BYTES // 2**20} MiB")
        raw = raw[:MAX_FILE_BYTES]
    if b"\x00" in raw[:65536]:
        notes.skipped.append(f"{path.name}: binary, not read")
        return None
    text = raw.decode("utf-8", errors="replace")
    bad = text.count("\ufffd")
    if bad > max(16, len(text) // 100):
        notes.skipped.append(f"{path.name}: not text ({bad} undecodable bytes), not read")
        return None
    return text


def _year(facts: list[Fact]) -> int | None:
    times = [f.t for f in facts if f.t is not None]
    return datetime.fromtimestamp(min(times), UTC).year if times else None


def read_bundle(paths: list[Path]) -> Bundle:
    files = bundle_files(paths)
    if not files:
        raise IncidentError(f"{', '.join(map(str, paths))}: empty, no files to read")
    b = Bundle()
    texts: list[tuple[Path, str]] = []
    options: dict[str, Any] = {}
    for path in files:
        text = _text(path, b.notes)
        if text is None:
            continue
        if path.name == TIMELINE_NAME or path.suffix == ".toml":
            facts, opts = read_timeline(text, path.name)
            options.update(opts)
            b.facts.extend(facts)
            b.files.append((path.name, "incident timeline", len(facts)))
        else:
            texts.append((path, text))
    b.options = options
    zone = parse_offset(str(options.get("utc_offset", "Z")))
    engine_logs: list[tuple[Path, list[tuple[int, str]]]] = []
    for path, text in texts:
        lines = text.splitlines()
        if looks_like_gateway_log(lines):
            facts, others = read_gateway_log(lines, path.name, zone)
            _add(b, path.name, "gateway log", facts, 0, len(lines))
            if others:  # engine lines interleaved with the gateway's (one file for every process)
                engine_logs.append((path, others))
        elif (obj := parse_json(text)) is not None and looks_like_kube_events(obj):
            facts, unread = read_kube_events(obj, path.name)
            _add(b, path.name, "Kubernetes events", facts, unread, len(obj.get("items") or []))
        elif looks_like_engine_log(lines):
            engine_logs.append((path, list(enumerate(lines, 1))))
        elif looks_like_command(text.strip()) and len(lines) <= 3:
            facts = read_command(" ".join(lines), f"{path.name}:1")
            _add(b, path.name, "gateway command line", facts, 0, 1)
        elif text.strip():
            b.notes.skipped.append(f"{path.name}: not a log this reads (no gateway, engine or event lines)")
    year = options.get("year") or _year(b.facts)
    if engine_logs and year is None:
        year = time.gmtime().tm_year
        b.notes.assumed.append(f"vLLM log times have no year: read as {year}")
    gateway_files = {name for name, kind, _ in b.files if kind == "gateway log"}
    for path, lines in engine_logs:
        facts, unread = read_engine_log(lines, path.name, zone, int(year) if year else None)
        if path.name in gateway_files:  # the lines of a gateway log that were not the gateway's
            b.facts.extend(facts)
            if unread:
                b.notes.skipped.append(
                    f"{path.name}: {unread} line(s) in neither the gateway's nor an engine's format"
                )
        else:
            _add(b, path.name, "engine log", facts, unread, len(lines))
    if not b.facts:
        seen = "; ".join(b.notes.skipped) or "nothing readable"
        raise IncidentError(
            f"no gateway log, engine log, Kubernetes events or incident.toml in the bundle ({seen})"
        )
    return b


def _add(b: Bundle, name: str, kind: str, facts: list[Fact], unread: int, total: int) -> None:
    b.facts.extend(facts)
    b.files.append((name, kind, len(facts)))
    if unread:
        b.notes.skipped.append(f"{name}: {unread} of {total} lines not read (not in the {kind}'s format)")
