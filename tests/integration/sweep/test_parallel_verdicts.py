"""Cells run several at a time give the verdicts they give one at a time: the bulk in simulated time (where
the histories must even be byte-identical), plus a small real-time set whose cells overlap for real."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

from helpers.paths import SCENARIO_FILES

from harness.parallel import run_suite
from harness.runner import expand_matrix
from harness.scenario import load_scenarios

SIM_TOPOLOGY = "1p1d"
# Default-suite scenarios whose 1p1d cells simulate in about a second each.
SIM_SET = ("wedged_decode_generate", "side_channel_reset_during_pull", "engine_without_id",
           "prefill_restart_mooncake", "sole_prefill_down")


def outcome(results) -> list[tuple[str, str, str, dict[str, str]]]:
    return [(r.scenario, r.cell, r.status, {v.name: v.status for v in r.verdicts}) for r in results]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_simulated_verdicts_and_histories_do_not_depend_on_jobs(tmp_path: Path) -> None:
    scenarios = load_scenarios(list(SIM_SET))
    cells = expand_matrix(scenarios, [SIM_TOPOLOGY], ["mooncake", "nixl"], None)[:6]
    assert len(cells) == 6
    one = await run_suite(scenarios, cells, tmp_path / "n1", world="sim", jobs=1)
    four = await run_suite(scenarios, cells, tmp_path / "n4", world="sim", jobs=4)
    assert outcome(four) == outcome(one)
    # Same order as the cells, whatever finished first.
    assert [(r.scenario, r.cell) for r in four] == [(s.name, c.label) for s, c in cells]
    for a, b in zip(one, four, strict=True):
        assert a.history_path is not None and b.history_path is not None
        assert digest(a.history_path) == digest(b.history_path), a.key


async def test_a_simulated_bug_fails_the_same_way_at_any_jobs(tmp_path: Path) -> None:
    from harness.scenario.bugs import with_bugs

    s, other = load_scenarios(["prefill_restart_mooncake", "sole_prefill_down"])
    broken = replace(with_bugs(s, ["stale_engine_id"]), name="prefill_restart_mooncake_stale_id")
    cells = expand_matrix([broken, other], [SIM_TOPOLOGY], ["mooncake"], ["http"])
    one = await run_suite([broken, other], cells, tmp_path / "n1", world="sim", jobs=1)
    four = await run_suite([broken, other], cells, tmp_path / "n4", world="sim", jobs=4)
    assert [r.status for r in one] == ["fail", "pass"]
    assert outcome(four) == outcome(one)


async def test_real_time_cells_overlapping_keep_their_verdicts(tmp_path: Path) -> None:
    quick = load_scenarios([str(SCENARIO_FILES / "cli_scenario_pass.py"),
                            str(SCENARIO_FILES / "cli_scenario_fail.py")])
    (crash,) = load_scenarios(["sole_prefill_down"])
    scenarios = [*quick, crash]
    cells = expand_matrix(scenarios, ["1p1d"], ["mooncake"], ["http"])
    one = await run_suite(scenarios, cells, tmp_path / "n1", jobs=1)
    four = await run_suite(scenarios, cells, tmp_path / "n4", jobs=4)
    assert [r.status for r in one] == ["pass", "fail", "pass"]
    assert outcome(four) == outcome(one)
    # Each cell had its own folder and processes: nothing of one cell in another's history.
    for r in four:
        assert r.cell_dir is not None and r.cell_dir.parent == tmp_path / "n4"
