"""The bug zoo in simulated time: every switch is caught where the stored detection matrix says it is, and the
gateway profiles run in simulation.

`tests/data/zoo.json` is the last full `pdchaos zoo --baseline-runs 3` (default suite, simulated, production
settings; the command is in docs/zoo-and-search.md). These tests re-run, per switch and per transport it
can occur on, the first default-suite cell the matrix says catches it, with the switch on and off, at scaled
settings (so they stay fast): the switch must fail a checker that passes without it. They also check that the
stored matrix has no hole and no false alarm, and that it covers every switch there is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT

from harness.runner import run_scenario
from harness.scenario import load_scenarios
from harness.scenario.bugs import SWITCHES, with_bugs
from harness.suite import default_suite
from harness.zoo.plan import parse_cell_key

ZOO = ROOT / "tests" / "data" / "zoo.json"
SCENARIOS = {s.name: s for s in default_suite(load_scenarios())}
_NONE = next(iter(SCENARIOS.values())).__class__(name="none", description="")


def _matrix() -> dict[str, Any]:
    return json.loads(ZOO.read_text(encoding="utf-8"))


def _catching_cells() -> list[tuple[str, str]]:
    """(switch, cell key): per switch and transport, the first caught cell, one of a scenario that claims the
    switch (`catches`) if there is one."""
    out = []
    for name, entry in sorted(_matrix()["switches"].items()):
        seen: set[str] = set()
        cells = sorted(entry["cells"].items(),
                       key=lambda kv: name not in SCENARIOS.get(_parse(kv[0])[0], _NONE).catches)
        for key, cell in cells:
            transport = key.rsplit("/", 1)[1].rstrip("]")
            if cell["caught"] and transport not in seen:
                seen.add(transport)
                out.append((name, key))
    return out


_parse = parse_cell_key


def test_the_stored_matrix_covers_every_switch_with_no_hole_and_no_false_alarm() -> None:
    m = _matrix()
    assert (m["world"], m["settings"], m["baseline_runs"]) == ("sim", "production", 3)
    assert set(m["switches"]) == set(SWITCHES), "re-run the zoo: the switches changed"
    assert m["holes"] == {} and m["false_alarms"] == {} and m["ok"] is True
    for name, entry in m["switches"].items():
        caught = {_parse(k)[3] for k in entry["caught_by"]}
        assert set(SWITCHES[name].transports) <= caught, name
        assert all(_parse(k)[0] in SCENARIOS for k in entry["caught_by"]), name
        first = entry["cells"][entry["caught_by"][0]]
        assert first["checkers"] and first["evidence"], name


def test_the_shipped_signature_catalogue_is_the_stored_matrix_s() -> None:
    from harness.findings import known_signatures, signatures_from_zoo

    derived = signatures_from_zoo(_matrix())
    assert {k: list(v) for k, v in known_signatures().items()} == derived, (
        "copy signatures.json of the zoo run into harness/findings/known_signatures.json")
    for name, entry in _matrix()["switches"].items():
        # The findings a switch's catching cells gave are stated in the catalogue's words.
        assert entry["findings"], name
        assert {f["signature"] for f in entry["findings"]} <= set(derived[name]), name


_BASELINES: dict[str, str] = {}


@pytest.mark.parametrize(("switch", "key"), _catching_cells())
async def test_each_switch_is_caught_where_the_matrix_says(switch: str, key: str, tmp_path: Path) -> None:
    scenario, topology, connector, transport = _parse(key)
    s = SCENARIOS[scenario]
    if key not in _BASELINES:
        base = await run_scenario(s, topology, connector, transport, "reference", tmp_path / "base",
                                  world="sim", settings="scaled")
        _BASELINES[key] = base.status or "unknown"
    assert _BASELINES[key] == "pass", f"{key} does not pass without a switch"
    bad = await run_scenario(with_bugs(s, [switch]), topology, connector, transport, "reference",
                             tmp_path / "bug", world="sim", settings="scaled")
    failed = [v.name for v in bad.verdicts if v.status == "fail"]
    assert failed, f"{switch} not caught by {key}: {[(v.name, v.status) for v in bad.verdicts]}"


async def test_a_gateway_profile_runs_in_simulation_with_its_releases_behaviour(tmp_path: Path) -> None:
    s = SCENARIOS["sole_prefill_down"]
    ref = await run_scenario(s, "1p1d", "mooncake", "grpc", "reference", tmp_path / "ref", world="sim",
                             settings="scaled")
    assert ref.status == "pass", ref.reason
    # smg 1.12.0 keeps a recovered sole prefill out for the breaker's open period.
    old = await run_scenario(s, "1p1d", "mooncake", "grpc", "profile:smg-1.12.0", tmp_path / "old",
                             world="sim", settings="scaled")
    assert {v.name: v.status for v in old.verdicts}["recovery"] == "fail"
    assert old.router == "profile:smg-1.12.0" and "--router profile:smg-1.12.0" in old.replay
    assert "--inject-bug" not in old.replay  # the profile's own switches come with it
    new = await run_scenario(s, "1p1d", "mooncake", "grpc", "profile:smg-1.13.0", tmp_path / "new",
                             world="sim", settings="scaled")
    assert {v.name: v.status for v in new.verdicts}["recovery"] == "pass"


async def test_an_unknown_profile_is_a_clear_error(tmp_path: Path) -> None:
    res = await run_scenario(SCENARIOS["sole_prefill_down"], "1p1d", "mooncake", "grpc", "profile:nope",
                             tmp_path, world="sim", settings="scaled")
    assert res.status == "unknown" and "unknown gateway profile 'nope'" in res.run_reason


def test_a_model_that_stops_moving_the_clock_is_an_error_not_a_hang() -> None:
    import simpy

    from harness.worlds.sim.world import SimStalled, run_until

    env = simpy.Environment()

    def spin() -> Any:
        while True:
            yield env.timeout(0)

    def finish(e: simpy.Environment) -> Any:
        yield e.timeout(5.0)

    env.process(spin())
    with pytest.raises(SimStalled, match=r"stopped moving its clock at t=0\.000000"):
        run_until(env, env.process(finish(env)), stall_steps=1000)
    calm = simpy.Environment()
    run_until(calm, calm.process(finish(calm)), stall_steps=10)
    assert calm.now == 5.0


def test_a_model_whose_clock_creeps_is_stopped_at_its_wall_clock_limit() -> None:
    import simpy

    from harness.worlds.sim.world import SimStalled, run_until

    env = simpy.Environment()

    def creep() -> Any:
        step = 1.0
        while True:  # Zeno: every step half the last, the clock never reaches 2
            step /= 2
            yield env.timeout(step)

    def finish(e: simpy.Environment) -> Any:
        yield e.timeout(5.0)

    env.process(creep())
    ticks = iter(range(1_000_000))
    with pytest.raises(SimStalled, match=r"wall-clock limit of 3 s at t=1\.0"):
        run_until(env, env.process(finish(env)), wall_limit_s=3.0, wall_clock=lambda: float(next(ticks)))
