"""A graceful stop in simulated time ends as in real time: the SIGKILL after `grace_s` counts from the
SIGTERM (not from the health probe the world verifies it with), and a process that a crash ends first is
noted as ended by SIGKILL."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.runner import run_scenario
from harness.scenario import At, Crash, Expect, GracefulStop, Step, Wedge, load_scenarios
from pdchaos.jsonl import read_jsonl

BASE = {s.name: s for s in load_scenarios()}["prefill_graceful_stop"]


def _ended(out: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(out / "history.jsonl")
            if r.get("type") == "note" and str(r.get("message", "")).startswith("graceful stop of")]


async def _run(timeline: tuple[Step, ...], out: Path) -> list[dict[str, Any]]:
    s = replace(BASE, name="graceful_stop_edges", timeline=timeline, expect=(Expect("nothing_lost"),))
    await run_scenario(s, "2p1d", "mooncake", "http", "reference", out, world="sim", settings="scaled")
    return _ended(out)


async def test_the_sigkill_counts_from_the_sigterm(tmp_path: Path) -> None:
    # A frozen process cannot drain, and the world's health probe of it waits out its whole window.
    notes = await _run((Step("freeze", Wedge("prefill-0", mode="sigstop"), At(1.0)),
                        Step("stop", GracefulStop("prefill-0", grace_s=0.1), At(1.5))), tmp_path)
    assert len(notes) == 1, notes
    assert notes[0]["killed_after_grace"] is True and notes[0]["returncode"] == -9
    assert notes[0]["exited_after_s"] == pytest.approx(0.1, abs=1e-3)


async def test_a_crash_during_the_drain_is_noted_as_the_end(tmp_path: Path) -> None:
    notes = await _run((Step("freeze", Wedge("prefill-0", mode="sigstop"), At(1.0)),
                        Step("stop", GracefulStop("prefill-0", grace_s=5.0), At(1.5)),
                        Step("crash", Crash("prefill-0"), At(2.0))), tmp_path)
    assert len(notes) == 1, notes
    assert notes[0]["returncode"] == -9 and notes[0]["killed_after_grace"] is False
    assert notes[0]["exited_after_s"] == pytest.approx(0.5, abs=1e-3)
