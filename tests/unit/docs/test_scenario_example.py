"""The scenario the how-to builds (examples/scenarios/decode_restart.py) loads, passes on the reference router
and fails on a gateway profile with a known bug, in simulated time, as the guide says."""

from __future__ import annotations

from pathlib import Path

from harness.runner import run_scenario
from harness.scenario import scenarios_in_file, validate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "scenarios" / "decode_restart.py"
GUIDE = Path(__file__).resolve().parents[3] / "docs" / "howto" / "write-a-scenario.md"


async def test_the_guide_s_scenario_passes_on_the_reference_and_fails_on_a_known_bug(tmp_path: Path) -> None:
    [scenario] = scenarios_in_file(EXAMPLE)
    validate(scenario)
    cell = ("1p2d", "mooncake", "grpc")
    good = await run_scenario(scenario, *cell, "reference", tmp_path / "ref", world="sim")
    assert good.status == "pass", good.overall.reason
    bad = await run_scenario(scenario, *cell, "profile:smg-1.10.1", tmp_path / "smg", world="sim")
    assert bad.status == "fail" and "legs_once" in bad.overall.reason
    # The guide shows the file as it is.
    shown = EXAMPLE.read_text(encoding="utf-8").split("SCENARIOS = [", 1)[1]
    assert shown in GUIDE.read_text(encoding="utf-8")
