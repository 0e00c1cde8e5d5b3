"""A size cap on a child's log, cut in place while the child keeps writing to it.

Children write their stdout and stderr straight into their log (see `harness.worlds.real.processes`: no pipe
a stalled harness could block), so a gateway logging every request at 1000 requests/s through an hours-long
soak would fill the disk. When a log grows past its limit it is cut back to its head (how the process
started: versions, settings, workers found) and its most recent lines (what it did last: the evidence an exit
summary reads), whole lines only, with one line between them saying how much was cut.

The child opened the file with O_APPEND (both spawn paths do), so after the cut its next write lands at the
new end and the file stays whole. A cut is not atomic with the child's writes: what the child writes while
the tail is read back and the file truncated (a few milliseconds, once per `limit - head - tail` bytes of
logging) is lost, and a line written just after the truncation lands before the marker line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The default limit per log; PDCHAOS_LOG_CAP_MB (0: no cap) or `pdchaos run --log-cap-mb` change it.
DEFAULT_LOG_CAP_MB = 256
MIN_LOG_CAP_MB = 1
LOG_CAP_ENV = "PDCHAOS_LOG_CAP_MB"
MARKER_PREFIX = b"[pdchaos] log cap:"
# What a cut keeps of a large log: enough to read how it started and how it ended, little to copy back.
_KEEP_MAX = 8 * 1024 * 1024


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
        """A limit of `mb` MB keeping an eighth of it (at most 8 MB) from the start and from the end."""
        limit = int(mb * 1024 * 1024)
        keep = min(limit // 8, _KEEP_MAX)
        return cls(limit, keep, keep)


def log_cap_from_env(environ: dict[str, str] | None = None) -> LogCap | None:
    """The cap PDCHAOS_LOG_CAP_MB asks for (default 256 MB; 0 turns it off). ValueError names the variable
    when it is not 0 or a number of megabytes of at least 1."""
    raw = (os.environ if environ is None else environ).get(LOG_CAP_ENV, "").strip()
    if not raw:
        return LogCap.of_megabytes(DEFAULT_LOG_CAP_MB)
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{LOG_CAP_ENV}={raw!r} is not a number of megabytes (0: no cap)") from None
    if mb == 0:
        return None
    if not MIN_LOG_CAP_MB <= mb < float("inf"):
        raise ValueError(f"{LOG_CAP_ENV}={raw!r} (--log-cap-mb): 0 (no cap) or at least {MIN_LOG_CAP_MB} MB")
    return LogCap.of_megabytes(mb)


def cap_log(path: Path, cap: LogCap) -> int:
    """Cut the log at `path` back to its head and tail when it is over the cap's limit; the bytes cut (0:
    under the limit, or no such file)."""
    try:
        # Reads seek freely; writes go to the end, as the child's do (O_APPEND). No O_CREAT: a log that is
        # gone stays gone.
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        return 0
    with os.fdopen(fd, "rb+", buffering=0) as fh:
        size = os.fstat(fd).st_size
        if size <= cap.limit_bytes:
            return 0
        head = _through_last_newline(os.pread(fd, cap.head_bytes, 0))
        start = max(len(head), size - cap.tail_bytes)
        # From one byte back: a read that starts on a line's first byte keeps that line. Read to the end as
        # it is now (the child may have written since the size was taken), then truncate at once: what
        # comes between is the cut's loss.
        fh.seek(start - 1)
        raw = fh.read()
        fh.truncate(len(head))
        end = start - 1 + len(raw)
        # Whole lines only: a line the child was still writing when it was read is cut with the rest.
        tail = _through_last_newline(_after_first_newline(raw))
        cut = end - len(head) - len(tail)
        out = memoryview(MARKER_PREFIX + f" {cut} bytes cut here (limit {cap.limit_bytes} bytes, "
                         f"{LOG_CAP_ENV})\n".encode() + tail)
        # Unbuffered: the marker and the tail go out in one write, which a local file system does not
        # interleave with the child's.
        while out:
            out = out[fh.write(out) :]
        return cut


def _through_last_newline(data: bytes) -> bytes:
    nl = data.rfind(b"\n")
    return data[: nl + 1] if nl >= 0 else b""


def _after_first_newline(data: bytes) -> bytes:
    """`data` after its first newline: the lines that start inside it."""
    nl = data.find(b"\n")
    return data[nl + 1 :] if nl >= 0 else b""
