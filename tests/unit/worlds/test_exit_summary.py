"""Why a process died, read from its log (a router that exits before serving reports this)."""

from __future__ import annotations

from pathlib import Path

from harness.worlds.real.processes import exit_evidence, exit_hint, exit_summary, lost_its_port

RUST_PANIC = """\x1b[2m2026-12-02 21:52:53\x1b[0m \x1b[33m WARN\x1b[0m kv_event_monitor: no SubscribeKvEvents
\x1b[2m2026-12-02 21:52:53\x1b[0m \x1b[31mERROR\x1b[0m health: probe failed for grpc://127.0.0.1:1
thread '<unnamed>' (1002) panicked at model_gateway/src/routers/grpc/harmony/builder.rs:76:18:
Failed to load Harmony encoding: error downloading or loading vocab file

Stack backtrace:
   0: std::backtrace::Backtrace::capture
             at ./library/std/src/backtrace.rs:296:9
  31: __libc_start_main_impl
             at ./csu/../csu/libc-start.c:360:3
  32: _start
"""


def test_a_panic_wins_over_later_frames_and_earlier_errors() -> None:
    assert exit_summary(RUST_PANIC) == (
        "thread '<unnamed>' (1002) panicked at model_gateway/src/routers/grpc/harmony/builder.rs:76:18: | "
        "Failed to load Harmony encoding: error downloading or loading vocab file"
    )


def test_a_python_traceback_gives_its_exception_line() -> None:
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "ValueError: --port must be positive\n")
    assert exit_summary(text).startswith("ValueError: --port must be positive")


def test_an_error_line_when_nothing_panicked() -> None:
    text = "starting\n2026 ERROR bind 127.0.0.1:80: permission denied\nbye\n"
    assert exit_summary(text) == "2026 ERROR bind 127.0.0.1:80: permission denied | bye"


def test_without_a_reason_the_last_lines_colour_removed() -> None:
    text = "".join(f"\x1b[32mline {i}\x1b[0m\n" for i in range(9))
    assert exit_summary(text) == "line 4 | line 5 | line 6 | line 7 | line 8"
    assert exit_summary("") == ""


def test_evidence_reads_the_log_and_a_missing_log_says_nothing(tmp_path: Path) -> None:
    log = tmp_path / "router.log"
    log.write_text("x\n" * 20_000 + RUST_PANIC, encoding="utf-8")
    assert "Failed to load Harmony encoding" in exit_evidence(log)
    assert exit_evidence(tmp_path / "absent.log") == ""


def test_known_causes_come_with_what_to_do(tmp_path: Path) -> None:
    log = tmp_path / "router.log"
    log.write_text(RUST_PANIC, encoding="utf-8")
    assert exit_evidence(log).endswith(
        "(hint: this gateway downloads a tiktoken vocabulary (o200k_base) when it starts; offline, set "
        "TIKTOKEN_ENCODINGS_BASE to a folder holding o200k_base.tiktoken)"
    )
    log.write_text('  File "smg/router.py", line 353, in start\n'
                   "RuntimeError: Address already in use (os error 98)\n", encoding="utf-8")
    evidence = exit_evidence(log)
    assert evidence.startswith("RuntimeError: Address already in use (os error 98) (hint: a port it")
    assert "PDCHAOS_PORT_POOL" in evidence
    assert exit_hint("ValueError: --port must be positive") is None


def test_a_taken_port_is_told_apart_from_other_deaths(tmp_path: Path) -> None:
    python_bind = tmp_path / "router.log"
    python_bind.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                           "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 4): "
                           "address already in use\n")
    rust_bind = tmp_path / "gateway.log"
    rust_bind.write_text("Error: Address in use (os error 98)\n")
    other = tmp_path / "other.log"
    other.write_text("Traceback (most recent call last):\nValueError: bad flag --x\n")
    assert lost_its_port(python_bind) and lost_its_port(rust_bind)
    assert not lost_its_port(other) and not lost_its_port(tmp_path / "missing.log")
