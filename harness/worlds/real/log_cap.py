"""A size cap on a child's log, cut in place while the child keeps writing to it.

Children write their stdout and stderr straight into their log (see `harness.worlds.real.processes`: no pipe
a stalled harness could block), so a gateway logging every request at 1000 requests/s through an hours-long
soak would fill the disk. When a log grows past its limit it is cut back to its head (how the process
started: versions, settings, workers found) and its most recent lines (what it did last: the evidence an exit
summary reads), with one line between them saying how much was cut.

The child opened the file with O_APPEND (both spawn paths do), so after the cut its next write lands at the
new end and the file stays whole. A cut is not atomic with the child's writes: a line written while the
tail is copied back is lost or lands just before the marker line; a cut every few hundred megabytes makes
that one line in millions, and the marker says where to look.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The default limit per log; PDCHAOS_LOG_CAP_MB (0: no cap) or `pdchaos run --log-cap-mb` change it.
DEFAULT_LOG_CAP_MB = 256
LOG_CAP_ENV = "PDCHAOS_LOG_CAP_MB"
MARKER_PREFIX = b"[pdchaos] log cap:"


@dataclass(frozen=True)
class LogCap:
    """Cut a log that passed `limit_bytes` back to its first `head_bytes` and last `tail_bytes` (each
    trimmed to whole lines)."""

    limit_bytes: int
    head_bytes: int
    tail_bytes: int

    def __post_init__(self) -> None:
        if self.limit_bytes <= 0:
            raise ValueError("a log cap's limit must be positive (no cap: no LogCap)")
        kept = self.head_bytes + self.tail_bytes
        if self.head_bytes < 0 or self.tail_bytes < 0 or kept >= self.limit_bytes:
            raise ValueError("a log cap keeps less than its limit: head + tail must be under it")

    @classmethod
    def of_megabytes(cls, mb: float) -> LogCap:
        """A limit of `mb` MB keeping its first eighth and last quarter: a cut frees over half of it."""
        limit = int(mb * 1024 * 1024)
        return cls(limit, limit // 8, limit // 4)


def log_cap_from_env(environ: dict[str, str] | None = None) -> LogCap | None:
    """The cap PDCHAOS_LOG_CAP_MB asks for (default 256 MB; 0 turns it off). ValueError names the variable
    when it is not a number."""
    raw = (os.environ if environ is None else environ).get(LOG_CAP_ENV, "").strip()
    if not raw:
        return LogCap.of_megabytes(DEFAULT_LOG_CAP_MB)
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{LOG_CAP_ENV}={raw!r} is not a number of megabytes (0: no cap)") from None
    if not 0 <= mb < float("inf"):
        raise ValueError(f"{LOG_CAP_ENV}={raw!r} must be 0 (no cap) or a positive number of megabytes")
    return None if mb == 0 else LogCap.of_megabytes(mb)


def cap_log(path: Path, cap: LogCap) -> int:
    """Cut the log at `path` back to its head and tail when it is over the cap's limit; the bytes cut (0:
    under the limit, or no such file)."""
    try:
        # "a+b": reads seek freely, writes always go to the end, as the child's do. Unbuffered: the marker
        # and the tail go out in one write, which a local file system does not interleave with the child's.
        with open(path, "a+b", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= cap.limit_bytes:
                return 0
            fh.seek(0)
            head = _through_last_newline(fh.read(cap.head_bytes))
            start = max(len(head), size - cap.tail_bytes)
            # From one byte back: a read that starts on a line's first byte keeps that line.
            fh.seek(start - 1)
            tail = _from_first_line(fh.read())
            # Read to the end as it is now: the child may have written since the size was taken.
            end = fh.tell()
            cut = end - len(head) - len(tail)
            fh.truncate(len(head))
            out = memoryview(MARKER_PREFIX + f" {cut} bytes cut here (limit {cap.limit_bytes} bytes, "
                             f"{LOG_CAP_ENV})\n".encode() + tail)
            while out:
                out = out[fh.write(out) :]
            return cut
    except FileNotFoundError:
        return 0


def _through_last_newline(data: bytes) -> bytes:
    nl = data.rfind(b"\n")
    return data[: nl + 1] if nl >= 0 else b""


def _from_first_line(data: bytes) -> bytes:
    """`data` after its first newline: the lines that start inside it."""
    nl = data.find(b"\n")
    return data[nl + 1 :] if nl >= 0 else b""
