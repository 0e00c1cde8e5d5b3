"""A graceful stop in simulated time ends as in real time: the SIGKILL after `grace_s` counts from the
SIGTERM (not from the health probe the world verifies it with), and a process that a crash ends first is
noted as ended by SIGKILL. A respawn, as the real world's, lets a process still there end by itself first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.runner import run_scenario
from harness.scenario import At, Crash, Die, Expect, GracefulStop, Heal, Respawn, Step, Wedge, load_scenarios
from pdchaos.jsonl import read_jsonl

BASE = {s.name: s for s in load_scenarios()}["prefill_graceful_stop"]


def _ended(out: Path) -> list[dict[str, Any]]:
    """The end notes, each with `after_sigterm`: how long after the stop's fault_applied it was written."""
    records = list(read_jsonl(out / "history.jsonl"))
    applied = {r["fault"]: r["t"] for r in records if r.get("type") == "fault_applied"}
    return [{**r, "after_sigterm": r["t"] - applied[r["fault"]]} for r in records
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
    # Killed 0.1 s after the SIGTERM; noted once the verification (a probe of the stopped process) is done.
    assert notes[0]["after_sigterm"] == pytest.approx(0.1, abs=2e-3)


async def test_a_crash_during_the_drain_is_noted_as_the_end(tmp_path: Path) -> None:
    notes = await _run((Step("freeze", Wedge("prefill-0", mode="sigstop"), At(1.0)),
                        Step("stop", GracefulStop("prefill-0", grace_s=5.0), At(1.5)),
                        Step("crash", Crash("prefill-0"), At(2.0))), tmp_path)
    assert len(notes) == 1, notes
    assert notes[0]["returncode"] == -9 and notes[0]["killed_after_grace"] is False
    assert notes[0]["exited_after_s"] == pytest.approx(0.5, abs=1e-3)


async def test_a_death_s_exit_during_the_drain_is_noted_with_its_status(tmp_path: Path) -> None:
    notes = await _run((Step("freeze", Wedge("prefill-0", mode="sigstop"), At(1.0)),
                        Step("die", Die("prefill-0", exit_after_s=0.2), At(1.2)),
                        Step("stop", GracefulStop("prefill-0", grace_s=5.0), At(1.5)),
                        Step("resume", Heal("prefill-0", "wedge"), At(2.0))), tmp_path)
    assert len(notes) == 1, notes
    assert notes[0]["returncode"] == 1 and notes[0]["killed_after_grace"] is False


async def test_a_stopped_process_begins_its_drain_once_resumed(tmp_path: Path) -> None:
    """The SIGTERM handler runs after SIGCONT: the drain, and its bound, start then."""
    from harness.worlds.sim.world import SimWorld

    seen: list[tuple[float, bool]] = []
    original = SimWorld.run_session

    def watching(self: SimWorld, session: Any) -> None:
        def watch() -> Any:
            engine = self.cell.engines["prefill-0"]
            while True:
                yield self.env.timeout(0.05)
                seen.append((round(self.env.now, 2), engine.state.draining))

        self.env.process(watch())
        original(self, session)

    SimWorld.run_session = watching  # type: ignore[method-assign]
    try:
        await _run((Step("freeze", Wedge("prefill-0", mode="sigstop"), At(1.0)),
                    Step("stop", GracefulStop("prefill-0", grace_s=5.0), At(1.5)),
                    Step("resume", Heal("prefill-0", "wedge"), At(2.5))), tmp_path)
    finally:
        SimWorld.run_session = original  # type: ignore[method-assign]
    zero = 0.7  # the timeline's zero: the workers were ready then
    frozen = [d for t, d in seen if zero + 1.6 <= t <= zero + 2.45]
    assert frozen and not any(frozen)  # signalled at 1.5, still stopped: no drain yet
    assert any(d for t, d in seen if zero + 2.5 <= t <= zero + 2.6)


async def test_a_respawn_waits_for_a_dying_process_to_exit(tmp_path: Path) -> None:
    s = replace(BASE, name="respawn_while_dying", expect=(Expect("nothing_lost"),),
                timeline=(Step("die", Die("prefill-0", exit_after_s=1.0), At(1.0)),
                          Step("back", Respawn("prefill-0"), At(1.3))))
    await run_scenario(s, "2p1d", "mooncake", "http", "reference", tmp_path, world="sim", settings="scaled")
    applied = {r["fault"]: r["t"] for r in read_jsonl(tmp_path / "history.jsonl")
               if r.get("type") == "fault_applied"}
    # Respawned once the dying process had exited (1.0 s after the death), not killed at 0.3 s.
    assert applied["back"] - applied["die"] == pytest.approx(1.0, abs=0.01)
