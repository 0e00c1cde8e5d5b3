"""A sweep's cells: the product of its axes, less what it excludes and what cannot run (with reasons)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from harness.runner import expand_matrix
from harness.scenario import load_scenarios
from harness.scenario.bugs import injected_bugs
from harness.suite import default_suite
from harness.sweep.plan import plan_sweep
from harness.sweep.spec import SweepError, load_sweep, parse_sweep


def plan_of(text: str):
    return plan_sweep(parse_sweep(tomllib.loads(text), Path("/nowhere/t.toml")))


def test_the_ci_sweep_runs_exactly_the_cells_of_the_default_suite() -> None:
    plan = plan_sweep(load_sweep("ci-regression"))
    suite = [(s.name, c.label) for s, c in expand_matrix(default_suite(load_scenarios(), "real"))]
    assert [(c.key.scenario, c.key.cell) for c in plan.cells] == suite
    assert {(c.key.router, c.key.world, c.key.settings, c.key.engines) for c in plan.cells} == {
        ("reference", "real", "scaled", "local")}
    assert plan.skipped == []


def test_axes_multiply_and_each_world_gets_its_default_settings() -> None:
    plan = plan_of("""
        [axes]
        scenarios = ["sole_prefill_down"]
        topologies = ["1p1d"]
        connectors = ["mooncake"]
        worlds = ["real", "sim"]
    """)
    got = {(c.key.world, c.key.settings, c.key.transport) for c in plan.cells}
    assert got == {("real", "scaled", "http"), ("real", "scaled", "grpc"),
                   ("sim", "production", "http"), ("sim", "production", "grpc")}
    assert len({c.key.group for c in plan.cells}) == 2


def test_impossible_and_excluded_cells_are_left_out_with_their_reason() -> None:
    plan = plan_of("""
        [axes]
        scenarios = ["sole_prefill_down"]
        topologies = ["1p1d"]
        connectors = ["mooncake"]
        transports = ["http"]
        routers = ["reference", "smg==1.13.0"]
        worlds = ["sim"]
        settings = ["scaled", "production"]
        [[exclude]]
        settings = "scaled"
        reason = "production only"
    """)
    assert [(c.key.router, c.key.settings) for c in plan.cells] == [("reference", "production")]
    reasons = {(s.key.router, s.key.settings): s.reason for s in plan.skipped}
    assert "production only" in reasons[("reference", "scaled")]
    assert "runs the reference router" in reasons[("smg==1.13.0", "production")]


def test_extended_topologies_keep_only_shapes_that_have_the_scenarios_targets() -> None:
    plan = plan_of("""
        [axes]
        scenarios = ["one_of_two_prefills_down"]
        topologies = ["1p2d", "2p2d"]
        extend_topologies = true
        connectors = ["nixl"]
        transports = ["http"]
    """)
    assert [c.key.topology for c in plan.cells] == ["2p2d"]
    assert "2p2d" in plan.cells[0].scenario.topologies
    # Widened, it is not what its name runs: no replay command (`pdchaos run NAME --topology 2p2d` refuses).
    from harness.runner import replay_command

    widened = plan.cells[0].scenario
    assert replay_command(widened, "2p2d", "nixl", "http", "reference", 0, "real", "scaled") == ""
    (left,) = plan.skipped
    assert left.key.topology == "1p2d" and "does not fit 1p2d" in left.reason and "prefill-1" in left.reason


def test_bugs_go_into_their_scenario_only() -> None:
    plan = plan_of("""
        [axes]
        scenarios = ["prefill_restart_mooncake", "sole_prefill_down"]
        topologies = ["1p1d"]
        transports = ["http"]
        worlds = ["sim"]
        [bugs]
        prefill_restart_mooncake = ["stale_engine_id"]
    """)
    bugs = {c.key.scenario: injected_bugs(c.scenario) for c in plan.cells}
    assert bugs["prefill_restart_mooncake"] == ("stale_engine_id",)
    assert bugs["sole_prefill_down"] == ()
    with pytest.raises(SweepError, match="the sweep does not run: nope"):
        plan_of("[axes]\nscenarios = ['sole_prefill_down']\n[bugs]\nnope = 'stale_engine_id'")
    # A switch where it cannot occur: its cells would pass as if the scenario had caught nothing.
    with pytest.raises(SweepError, match=r"\[bugs\] metadata_no_deadline cannot occur in any of the cells of "
                                         r"prefill_restart_mooncake \(mooncake/http\)"):
        plan_of("[axes]\nscenarios = ['prefill_restart_mooncake']\ntransports = ['http']\n"
                "[bugs]\nprefill_restart_mooncake = ['metadata_no_deadline']")


def test_a_router_bug_cannot_go_to_a_gateway() -> None:
    plan = plan_of("""
        [axes]
        scenarios = ["prefill_restart_mooncake"]
        topologies = ["1p1d"]
        transports = ["grpc"]
        routers = ["smg==1.13.0"]
        [bugs]
        prefill_restart_mooncake = ["stale_engine_id"]
    """)
    assert plan.cells == []
    assert "router bug" in plan.skipped[0].reason


def test_cluster_cells_the_backend_cannot_run_faithfully_are_left_out() -> None:
    plan = plan_of("""
        [axes]
        scenarios = ["metadata_wedged", "decode_restart"]
        topologies = ["1p1d"]
        engines = ["gpu"]
        [engines.gpu]
        backend = "k8s"
        preset = "vllm-nixl-gpu"
    """)
    assert {(c.key.scenario, c.key.connector, c.key.transport) for c in plan.cells} == {
        ("decode_restart", "nixl", "http")}
    reasons = {(s.key.scenario, s.key.connector, s.key.transport): s.reason for s in plan.skipped}
    assert "runs the nixl connector, not mooncake" in reasons[("decode_restart", "mooncake", "http")]
    assert "serves http, not grpc" in reasons[("decode_restart", "nixl", "grpc")]
    assert "runs the nixl connector, not mooncake" in reasons[("metadata_wedged", "mooncake", "grpc")]


def test_two_scenarios_under_one_name_are_refused_in_either_order(tmp_path: Path) -> None:
    """A file reusing a shipped name: one of the two would be dropped without a word (names key folders)."""
    mine = tmp_path / "dup.py"
    mine.write_text("from harness.scenario import Scenario\n"
                    "SCENARIOS = [Scenario(name='prefill_restart_mooncake', description='mine')]\n")
    for order in (f"['prefill_restart_mooncake', '{mine}']", f"['{mine}', 'default']"):
        with pytest.raises(SweepError, match=r"'prefill_restart_mooncake' comes from both .*rename one"):
            plan_sweep(parse_sweep(tomllib.loads(f"[axes]\nscenarios = {order}\n"), tmp_path / "t.toml"))
    # The same scenario named twice (and the default suite's cut of it) is no clash.
    plan_sweep(parse_sweep(tomllib.loads("[axes]\nscenarios = ['default', 'prefill_restart_mooncake']\n"),
                           tmp_path / "t.toml"))


def test_a_sweep_takes_one_scenario_of_a_file_relative_to_the_sweep(tmp_path: Path) -> None:
    (tmp_path / "two.py").write_text(
        "from harness.scenario import Scenario\n"
        "SCENARIOS = [Scenario(name='alpha', description='a'), Scenario(name='beta', description='b')]\n")
    spec = parse_sweep(tomllib.loads("[axes]\nscenarios = ['two.py::beta']\n"), tmp_path / "t.toml")
    plan = plan_sweep(spec)
    assert {c.scenario.name for c in plan.cells} == {"beta"}


def test_an_exclusion_naming_a_scenario_the_sweep_does_not_run_is_refused() -> None:
    text = "[axes]\nscenarios = ['sole_prefill_down']\n[[exclude]]\nscenario = 'sole_prefil_down'\n"
    with pytest.raises(SweepError, match=r"names scenarios the sweep does not run: sole_prefil_down"):
        plan_sweep(parse_sweep(tomllib.loads(text), Path("/nowhere/t.toml")))
