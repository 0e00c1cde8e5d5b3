"""One piece of evidence read from a bundle: what it says, when (epoch seconds, None when the line has no
time), and where it came from (`file:line`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any


class IncidentError(ValueError):
    """A bundle that cannot give a scenario: one line saying what is missing."""


@dataclass(frozen=True)
class Fact:
    kind: str
    t: float | None
    cite: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReadNotes:
    """What reading skipped or assumed, for the top of the scenario file."""

    skipped: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)


def parse_offset(text: str) -> timezone:
    """'+02:00', '-0530', 'Z' or 'UTC' as a zone."""
    s = text.strip()
    if s.upper() in ("Z", "UTC", ""):
        return UTC
    m = re.fullmatch(r"([+-])(\d{2}):?(\d{2})", s)
    if not m:
        raise IncidentError(f"utc_offset {text!r} is not of the form +HH:MM")
    sign = 1 if m.group(1) == "+" else -1
    return timezone(sign * timedelta(hours=int(m.group(2)), minutes=int(m.group(3))))


def midpoint_epoch(stamp: str, zone: timezone = UTC, year: int | None = None) -> float | None:
    """`epoch`, with a time of whole seconds read as the middle of its second: the line was written some
    time within it, and reading it as its start puts every such line half a second early on average against
    a log with finer times."""
    t = epoch(stamp, zone, year)
    whole = not re.search(r":\d{2}[.,]\d", stamp)
    return t + 0.5 if t is not None and whole else t


def epoch(stamp: str, zone: timezone = UTC, year: int | None = None) -> float | None:
    """A log time as epoch seconds: ISO 8601 (with or without a zone), 'YYYY-MM-DD HH:MM:SS[.f]', or vLLM's
    'MM-DD HH:MM:SS' (the year from `year`). None when it is none of these."""
    s = stamp.strip()
    if re.fullmatch(r"\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?", s):
        if year is None:
            return None
        s = f"{year}-{s}"
    s = s.replace("Z", "+00:00")
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=zone)
    return dt.timestamp()
