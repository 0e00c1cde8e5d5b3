"""The log cap: a log past its limit is cut back to its head and latest lines, in place."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from harness.worlds.real.log_cap import (
    DEFAULT_LOG_CAP_MB,
    LOG_CAP_ENV,
    MARKER_PREFIX,
    LogCap,
    cap_log,
    log_cap_from_env,
)


def _lines(n: int, start: int = 0) -> bytes:
    return b"".join(f"line {i:06d} {'x' * 40}\n".encode() for i in range(start, start + n))


L = len(_lines(1))


def test_a_log_under_its_limit_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(_lines(10))
    assert cap_log(log, LogCap(10_000, 1000, 2000)) == 0
    assert log.read_bytes() == _lines(10)


def test_no_file_is_nothing_to_cut(tmp_path: Path) -> None:
    assert cap_log(tmp_path / "none.log", LogCap(100, 10, 20)) == 0


def test_a_log_past_its_limit_keeps_whole_lines_of_its_head_and_tail(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    data = _lines(1000)
    log.write_bytes(data)
    cap = LogCap(10_000, 1000, 2000)
    cut = cap_log(log, cap)
    out = log.read_bytes()
    n_head, n_tail = 1000 // L, 2000 // L
    lines = out.split(b"\n")
    assert out.startswith(data[: n_head * L])
    assert lines[n_head].startswith(MARKER_PREFIX) and f" {cut} bytes cut here".encode() in lines[n_head]
    assert out.endswith(b"\n" + data[-n_tail * L :])
    assert len(lines) == n_head + 1 + n_tail + 1  # the last: after the final newline
    assert cut == len(data) - (n_head + n_tail) * L
    assert len(out) < cap.limit_bytes


def test_a_tail_that_starts_on_a_line_boundary_keeps_that_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    data = _lines(100)
    log.write_bytes(data)
    cap_log(log, LogCap(4000, 10 * L, 10 * L))
    assert log.read_bytes().endswith(b"\n" + data[-10 * L :])


def test_the_child_keeps_appending_after_a_cut_and_a_second_cut_keeps_the_first_head(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    cap = LogCap(100 * L, 10 * L, 20 * L)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # as the child's stdout is opened
    try:
        os.write(fd, _lines(200))
        assert cap_log(log, cap) > 0
        os.write(fd, _lines(200, start=200))
        assert cap_log(log, cap) > 0
        os.write(fd, b"last words\n")
    finally:
        os.close(fd)
    out = log.read_bytes()
    assert out.startswith(_lines(10))
    assert out.count(MARKER_PREFIX) == 1  # the first marker went with the middle the second cut took
    assert out.endswith(_lines(20, start=380) + b"last words\n")


def test_a_line_longer_than_the_head_keeps_no_head(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"y" * 3000 + b"\n" + _lines(100))
    cap_log(log, LogCap(2000, 500, 10 * L))
    assert log.read_bytes().startswith(MARKER_PREFIX)


def test_cuts_while_a_writer_appends_leave_only_whole_lines_and_a_bounded_file(tmp_path: Path) -> None:
    """What the writer appends during a cut may be lost, and a line may land before the marker: never a
    torn or glued line, and the file goes on growing at its end."""
    log = tmp_path / "a.log"
    cap = LogCap(20_000, 2000, 4000)
    done = threading.Event()

    def writer() -> None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for i in range(20_000):
                os.write(fd, f"line {i:06d} {'x' * 40}\n".encode())
        finally:
            os.close(fd)
            done.set()

    t = threading.Thread(target=writer)
    t.start()
    cuts = 0
    while not done.is_set():
        cuts += cap_log(log, cap) > 0
    t.join()
    cap_log(log, cap)
    with open(log, "ab") as fh:
        fh.write(b"after the cuts\n")
    out = log.read_bytes()
    assert cuts > 0
    assert len(out) <= cap.limit_bytes
    for line in out.splitlines()[:-1]:
        assert line.startswith(MARKER_PREFIX) or (line.startswith(b"line ") and len(line) == L - 1), line
    assert out.endswith(b"\nafter the cuts\n")


def test_the_cap_comes_from_the_environment() -> None:
    assert log_cap_from_env({}) == LogCap.of_megabytes(DEFAULT_LOG_CAP_MB)
    assert log_cap_from_env({LOG_CAP_ENV: "0"}) is None
    cap = log_cap_from_env({LOG_CAP_ENV: "8"})
    assert cap == LogCap(8 << 20, 1 << 20, 1 << 20)  # an eighth from each end
    big = log_cap_from_env({LOG_CAP_ENV: "1024"})
    assert big == LogCap(1 << 30, 8 << 20, 8 << 20)  # at most 8 MB copied back


def test_a_line_being_written_when_the_tail_is_read_is_cut_whole(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(_lines(100) + b"half a li")
    cut = cap_log(log, LogCap(2000, 10 * L, 10 * L))
    out = log.read_bytes()
    assert out.endswith(b"\n" + _lines(100)[-9 * L :])  # the partial line and the one it shortened, gone
    assert cut == len(_lines(100)) + 9 - 10 * L - 9 * L


def test_a_log_that_is_gone_stays_gone(tmp_path: Path) -> None:
    cap_log(tmp_path / "gone.log", LogCap(100, 10, 10))
    assert not (tmp_path / "gone.log").exists()


@pytest.mark.parametrize("bad", ["lots", "-1", "nan", "inf", "0.5"])
def test_a_bad_cap_in_the_environment_names_the_variable(bad: str) -> None:
    with pytest.raises(ValueError, match=LOG_CAP_ENV):
        log_cap_from_env({LOG_CAP_ENV: bad})


def test_a_cap_that_keeps_its_limit_is_refused() -> None:
    with pytest.raises(ValueError):
        LogCap(100, 50, 50)
    with pytest.raises(ValueError):
        LogCap(0, 0, 0)


def test_the_run_flag_sets_the_cap_for_every_process_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli import _apply_log_cap
    from harness.suite import UsageError

    monkeypatch.setenv(LOG_CAP_ENV, "bad")
    with pytest.raises(UsageError, match=LOG_CAP_ENV):
        _apply_log_cap(None)
    _apply_log_cap(2.5)  # the flag wins over the environment, and cell workers inherit it
    assert os.environ[LOG_CAP_ENV] == "2.5"
    assert log_cap_from_env() == LogCap.of_megabytes(2.5)
    with pytest.raises(UsageError, match=r"--log-cap-mb 0\.001") as refused:
        _apply_log_cap(0.001)
    assert LOG_CAP_ENV not in str(refused.value)  # the user gave the flag: the message names the flag
    assert os.environ[LOG_CAP_ENV] == "2.5"  # and nothing was set
