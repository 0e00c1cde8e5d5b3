"""bench/sim_breakdown.py: the core timer (wraps the shells' entry points into the cores, counts a nested call
once, puts the originals back whatever happens) and the two floors it measures without the profiler."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.bench_script import load_bench

from harness.history_writer import HistoryRecorder
from pdchaos.jsonl import read_jsonl

sb = load_bench("sim_breakdown")


def test_every_entry_is_wrapped_then_put_back_even_after_an_error() -> None:
    before = {(owner, name): owner.__dict__[name] for owner, names in sb.CORE_ENTRIES for name in names}
    timer = sb.CoreTimer()
    with pytest.raises(RuntimeError, match="boom"), timer.installed():
        for (owner, name), fn in before.items():
            assert owner.__dict__[name] is not fn
        raise RuntimeError("boom")
    for (owner, name), fn in before.items():
        assert owner.__dict__[name] is fn


def test_a_call_inside_a_timed_call_counts_once() -> None:
    timer = sb.CoreTimer()
    inner = timer.wrap(lambda x: x + 1, "inner")
    outer = timer.wrap(lambda x: inner(x) * 2, "outer")
    assert outer(1) == 4
    assert timer.calls == 1 and dict(timer.calls_by_entry) == {"outer": 1}
    assert inner(1) == 2
    assert timer.calls == 2 and timer.seconds > 0
    assert 0 < timer.own_cost_s() < 1e-3


def test_a_failing_call_is_still_timed_and_the_timer_recovers() -> None:
    timer = sb.CoreTimer()

    def broken() -> None:
        raise ValueError("no")

    bad = timer.wrap(broken, "bad")
    with pytest.raises(ValueError):
        bad()
    good = timer.wrap(lambda: 7, "good")
    assert good() == 7 and timer.calls == 2 and timer.calls_by_entry["good"] == 1


def test_the_history_floor_records_every_record_again(tmp_path: Path) -> None:
    src = tmp_path / "history.jsonl"
    rec = HistoryRecorder(src, clock=lambda: 0.0, flush_each=False)
    rec.record("note", {"text": "a"}, t=0.5)
    rec.record("note", {"text": "b"}, t=1.5)
    rec.close()
    again = tmp_path / "again.jsonl"
    assert sb.history_floor(src, again) >= 0.0
    assert list(read_jsonl(again)) == list(read_jsonl(src))


@pytest.mark.parametrize("per_request", [0.0, 1.0, 2.0, 15.3])
def test_the_simpy_floor_runs_any_event_count(per_request: float) -> None:
    assert sb.simpy_floor(50, per_request, 20.0) > 0.0
