"""Which cells the cluster world runs (`kube_engines.not_runnable`), and the engines file it reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.scenario import load_scenarios
from harness.worlds.real.backends import EngineChoice, EngineChoiceError, parse_engines
from harness.worlds.real.kube_engines import load_backend_file, not_runnable

FAKE = {"preset": "pdchaos-fake", "router": "outside", "service_type": "NodePort"}


def _s(name: str):
    (s,) = load_scenarios([name])
    return s


def test_a_fake_pod_cell_with_the_router_outside_runs() -> None:
    assert not_runnable(FAKE, _s("prefill_process_restart"), "mooncake", "http") is None
    assert not_runnable(FAKE, _s("prefill_link_partitioned"), "mooncake", "http") is None  # a sidecar


@pytest.mark.parametrize(("change", "scenario", "says"), [
    ({"router": "cluster", "service_type": "ClusterIP"}, "prefill_process_restart",
     "router on the harness's host"),
    ({"preset": "vllm-mooncake-gpu"}, "prefill_process_restart", "planned and dry-run only"),
    ({}, "slow_side_channel", "NetworkPolicy"),  # a Mooncake side channel: no sidecar can carry it
    ({"preset": "nope"}, "prefill_process_restart", "preset must be one of"),
])
def test_cells_it_cannot_run_say_why(change: dict, scenario: str, says: str) -> None:
    why = not_runnable({**FAKE, **change}, _s(scenario), "mooncake", "http")
    assert why is not None and says in why


def test_an_engines_file_is_the_sweep_table(tmp_path: Path) -> None:
    f = tmp_path / "e.toml"
    f.write_text('backend = "k8s"\npreset = "pdchaos-fake"\nrouter = "outside"\nservice_type = "NodePort"\n'
                 'kubeconfig = "/x/kubeconfig"\nnode_address = "10.1.2.3"\n', encoding="utf-8")
    assert load_backend_file(f)["node_address"] == "10.1.2.3"
    choice = parse_engines(f"k8s:{f}")
    assert choice.kind == "k8s" and choice.table["kubeconfig"] == "/x/kubeconfig"
    assert "backend" not in choice.table
    assert choice.label == f"k8s:{f}" and choice.text_known
    assert EngineChoice.kube(choice.table) == EngineChoice.kube(dict(choice.table))  # hashable, comparable
    f.write_text('backend = "slurm"\n', encoding="utf-8")
    with pytest.raises(EngineChoiceError, match="backend must be"):
        parse_engines(f"k8s:{f}")
    f.write_text('preset = "pdchaos-fake"\nrouter = "outside"\n', encoding="utf-8")
    with pytest.raises(EngineChoiceError, match="outside router must reach the engines"):
        parse_engines(f"k8s:{f}")


async def test_no_cluster_to_reach_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.scenario import EngineSettings
    from harness.topology import allocate
    from harness.worlds.real.kube_engines import KubeFleet, KubeFleetError
    from harness.worlds.real.processes import ProcessSupervisor

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    fleet = KubeFleet(allocate("1p1d", "nixl", "http"), EngineSettings(),
                      ProcessSupervisor(tmp_path / "logs"), tmp_path, token="t", table=FAKE)
    with pytest.raises(KubeFleetError, match=r"no cluster to reach.*fake_cluster"):
        await fleet.prepare()


def test_a_sweep_s_backend_gets_a_file_its_cells_replay_commands_name(tmp_path: Path) -> None:
    """`--engines k8s` alone names no table: a sweep's cluster cells replay with the file the sweep wrote."""
    from harness.runner import replay_command
    from harness.sweep.plan import plan_sweep
    from harness.sweep.run import _engines, write_backend_files
    from harness.sweep.spec import load_sweep

    plan = plan_sweep(load_sweep("fake-cluster"))
    files = write_backend_files(plan, tmp_path)
    assert list(files) == ["fake-pods"] and files["fake-pods"].is_file()
    cell = plan.cells[0]
    choice = _engines(cell, files)
    assert isinstance(choice, EngineChoice) and choice.label == f"k8s:{files['fake-pods']}"
    again = parse_engines(choice.label)  # what `pdchaos run ... --engines k8s:FILE` reads back
    assert again.table == choice.table and again.table["preset"] == "pdchaos-fake"
    line = replay_command(cell.scenario, cell.cell.topology, cell.cell.connector, cell.cell.transport,
                          "reference", 0, "real", "scaled", choice.label)
    assert f"--engines {files['fake-pods']}" not in line and f"--engines k8s:{files['fake-pods']}" in line


def test_a_json_engines_file_must_hold_a_table(tmp_path: Path) -> None:
    f = tmp_path / "e.json"
    f.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="not a table"):
        load_backend_file(f)
    f.write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match=str(f)):
        load_backend_file(f)
