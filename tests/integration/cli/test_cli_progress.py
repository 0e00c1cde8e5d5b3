"""Progress display: the board's arithmetic and the reporter's TTY / plain outputs from real history files."""

from __future__ import annotations

import io
from pathlib import Path

from harness.history_writer import HistoryRecorder
from harness.progress import ProgressBoard, ProgressReporter


def test_board_counts_requests_faults_and_verdicts() -> None:
    board = ProgressBoard(started=100.0, total=2)
    assert "starting" in board.line(100.0)
    ev = board.observe(
        "a", {"type": "run_started", "scenario": "s1", "topology": "1p2d", "connector": "mooncake",
              "transport": "http"}, 101.0,
    )
    assert ev == ["started s1 1p2d/mooncake/http"]
    for ok in (True, True, False):
        board.observe("a", {"type": "request_invoked", "req": 1}, 101.5)
        board.observe("a", {"type": "request_completed", "req": 1, "ok": ok}, 102.0)
    board.observe("a", {"type": "request_invoked", "req": 4}, 102.0)
    ev = board.observe("a", {"type": "fault_applied", "kind": "restart", "target": "prefill-0"}, 102.0)
    assert ev == ["s1 1p2d/mooncake/http: fault restart@prefill-0"]
    line = board.line(103.0)
    assert line.startswith("[0/2] 3.0s s1 1p2d/mooncake/http running 2.0s")
    assert "req 3/4 (1 err)" in line and "faults 1 last restart@prefill-0" in line
    assert "pass 0 fail 0 unknown 0" in line
    ended = board.observe("a", {"type": "run_ended", "reason": "done"}, 104.0)
    assert ended == ["ended s1 1p2d/mooncake/http (done)"]
    board.finish("a", "fail", 104.5)
    board.observe("b", {"type": "run_started", "scenario": "s2", "topology": "1p1d"}, 105.0)
    line = board.line(106.0)
    assert line.startswith("[1/2] 6.0s s2 1p1d running 1.0s")
    assert "pass 0 fail 1 unknown 0" in line
    # Ignores unknown record types and keeps the cell's elapsed frozen once ended.
    board.observe("b", {"type": "note", "message": "x"}, 107.0)
    board.finish("b", "pass", 108.0)
    assert board.cells["a"].elapsed(500.0) == 3.0
    assert board.counts() == {"pass": 1, "fail": 1, "unknown": 0}
    assert "[2/2]" in board.line(200.0) and "2m" not in board.line(200.0).split()[1]
    assert board.line(250.0).split()[1] == "2m30s"


def _write_history(path: Path) -> HistoryRecorder:
    rec = HistoryRecorder(path)
    rec.run_started("restart_stale_id", "1p2d", "mooncake", "http", "reference", seed=1)
    rec.request_invoked(1, "[pdchaos:r:1]")
    rec.request_completed(1, "[pdchaos:r:1]", status=200, ok=True, latency_s=0.1)
    return rec


async def test_plain_reporter_prints_events_as_lines(tmp_path: Path) -> None:
    out = io.StringIO()
    rep = ProgressReporter(tmp_path, stream=out, tty=False, total=1, heartbeat_s=1000)
    rep.poll()
    assert out.getvalue() == ""
    rec = _write_history(tmp_path / "cell1" / "history.jsonl")
    rep.poll()
    assert out.getvalue() == "pdchaos: started restart_stale_id 1p2d/mooncake/http\n"
    # A torn line (writer mid-write) is held until it completes.
    hist = tmp_path / "cell1" / "history.jsonl"
    hist.write_text(hist.read_text() + '{"type": "fault_applied", "kind": "restart", ')
    rep.poll()
    assert out.getvalue().count("\n") == 1
    hist.write_text(hist.read_text() + '"target": "prefill-0", "t": 1.0}\nnot json\n')
    rep.poll()
    last = out.getvalue().splitlines()[-1]
    assert last == "pdchaos: restart_stale_id 1p2d/mooncake/http: fault restart@prefill-0"
    rec.run_ended("done")
    rep.finish(tmp_path / "cell1", "pass")
    await rep.stop(final="verdict: pass")
    lines = out.getvalue().splitlines()
    assert lines[-2] == "pdchaos: ended restart_stale_id 1p2d/mooncake/http (done)"
    assert lines[-1] == "verdict: pass"
    assert rep.board.counts()["pass"] == 1
    assert "\r" not in out.getvalue()


async def test_plain_reporter_heartbeat(tmp_path: Path) -> None:
    out = io.StringIO()
    rep = ProgressReporter(tmp_path, stream=out, tty=False, heartbeat_s=0.0)
    _write_history(tmp_path / "c" / "history.jsonl")
    rep.poll()
    assert any("req 1/1" in ln for ln in out.getvalue().splitlines())


async def test_tty_reporter_redraws_one_line(tmp_path: Path) -> None:
    out = io.StringIO()
    rep = ProgressReporter(tmp_path, stream=out, tty=True, interval_s=0.01)
    _write_history(tmp_path / "c" / "history.jsonl")
    rep.start()
    rep.start()  # idempotent
    rep.poll()
    await rep.stop()
    text = out.getvalue()
    assert text.count("\r\x1b[K") >= 2
    assert text.endswith("\n") and text.count("\n") == 1
    assert "restart_stale_id 1p2d/mooncake/http running" in text


async def test_reporter_survives_closed_stream(tmp_path: Path) -> None:
    out = io.StringIO()
    rep = ProgressReporter(tmp_path, stream=out, tty=False, heartbeat_s=0.0)
    out.close()
    _write_history(tmp_path / "c" / "history.jsonl")
    rep.poll()
    await rep.stop(final="done")


async def test_cell_end_reported_before_next_cell_start(tmp_path: Path) -> None:
    """Both arrive in one poll; the second cell's folder sorts first, yet the first cell's end comes first."""
    out = io.StringIO()
    rep = ProgressReporter(tmp_path, stream=out, tty=False, heartbeat_s=1000)
    first = _write_history(tmp_path / "z_first" / "history.jsonl")
    rep.poll()
    first.run_ended("done")
    second = HistoryRecorder(tmp_path / "a_second" / "history.jsonl")
    second.run_started("other", "2p1d", "nixl", "grpc", "reference")
    rep.poll()
    lines = out.getvalue().splitlines()
    assert lines == [
        "pdchaos: started restart_stale_id 1p2d/mooncake/http",
        "pdchaos: ended restart_stale_id 1p2d/mooncake/http (done)",
        "pdchaos: started other 2p1d/nixl/grpc",
    ]
    assert ProgressReporter(tmp_path / "missing", stream=out, tty=False).poll() is None
