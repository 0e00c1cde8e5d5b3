"""Scenarios on the command backend (`--engines command:FILE`), with local commands standing in for remote
ones (examples/engines/local-fake.toml starts fake engines and signals them by pid file): process faults go
through the kill/stop/pause/resume templates, link faults through proxies, and every checker passes, as on the
fake backend (where the default suite runs these scenarios)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runner import run_scenario
from harness.scenario import load_scenarios

ROOT = Path(__file__).resolve().parents[3]
LOCAL_FAKE = f"command:{ROOT / 'examples' / 'engines' / 'local-fake.toml'}"


@pytest.mark.parametrize(("name", "topology"), [
    ("prefill_restart_nixl", "1p1d"),       # kill + start templates, a new engine id
    ("prefill_process_frozen", "1p1d"),     # pause / resume templates
    ("prefill_link_partitioned", "2p1d"),   # a proxy on the router's link to a prefill
])
async def test_command_backend_passes_every_checker(name: str, topology: str, tmp_path: Path) -> None:
    (scenario,) = load_scenarios([name])
    result = await run_scenario(scenario, topology, "nixl", "http", "reference", tmp_path, engines=LOCAL_FAKE)
    verdicts = {v.name: v.status for v in result.verdicts}
    assert result.status == "pass", result.to_dict()
    assert verdicts["faults"] == "pass" and verdicts["recovery"] == "pass"  # applied, verified, healed
    assert "output" in verdicts  # the command file says the engines are fakes: their text is judged


async def test_a_start_command_that_fails_says_so_at_once(tmp_path: Path) -> None:
    """A start template that exits non-zero: the run is unknown within seconds, and says the command failed
    (not that the engine 'did not serve within' the whole ready timeout)."""
    failing = tmp_path / "failing.toml"
    failing.write_text('start = "echo no such host >&2; exit 255"\nserves = "fake"\n')
    (scenario,) = load_scenarios(["prefill_restart_nixl"])
    result = await run_scenario(scenario, "1p1d", "nixl", "http", "reference", tmp_path / "run",
                                engines=f"command:{failing}")
    assert result.status == "unknown"
    assert "start command failed (exit 255)" in result.run_reason and "no such host" in result.run_reason
    assert (result.duration_s or 0) < 30
