"""`pdchaos sweep` end to end in simulated time: the sweep folder, a baseline in which one scenario was
made to fail (the regression reported with its evidence, `--fail-on regression` exits 1), the dry run of
the GPU-cluster sweep, `--jobs` on `run` and `matrix`, and usage errors."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.cli import main

MINI = """
    [sweep]
    name = "mini"
    [axes]
    scenarios = ["prefill_restart_mooncake", "sole_prefill_down"]
    topologies = ["1p1d"]
    connectors = ["mooncake"]
    transports = ["http"]
    worlds = ["sim"]
"""
BROKEN = MINI + """
    [bugs]
    prefill_restart_mooncake = ["stale_engine_id"]
"""
RESTART = "prefill_restart_mooncake 1p1d-mooncake-http [reference, sim, production, local]"


def sweep_file(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def sweep(*args: str) -> int:
    return main(["sweep", *args, "--no-progress"])


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean sweep: the baseline of the comparisons below."""
    tmp = tmp_path_factory.mktemp("base")
    out = tmp / "base"
    assert sweep(str(sweep_file(tmp, "mini", MINI)), "--out", str(out), "--jobs", "2") == 0
    return out


def test_a_sweep_folder_holds_every_cell_by_group_and_its_own_report(baseline: Path) -> None:
    doc = json.loads((baseline / "sweep.json").read_text())
    assert doc["schema"] == "pdchaos.sweep/1" and doc["jobs"] == 2
    assert [c["label"] for c in doc["cells"]] == [
        RESTART, "sole_prefill_down 1p1d-mooncake-http [reference, sim, production, local]"]
    group = baseline / "reference_sim_production_local"
    for name in ("report.json", "junit.xml", "report.html"):
        assert (group / name).is_file()
    top = json.loads((baseline / "report.json").read_text())
    assert top["schema"] == "pdchaos.report/2" and len(top["results"]) == 2
    assert (baseline / "sweep.html").is_file()


def test_a_scenario_made_to_fail_is_exactly_the_regression_reported_with_its_evidence(
        tmp_path: Path, baseline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "broken"
    code = sweep(str(sweep_file(tmp_path, "mini", BROKEN)), "--out", str(out), "--baseline", str(baseline),
                 "--fail-on", "regression", "--jobs", "2")
    assert code == 1
    comp = json.loads((out / "comparison.json").read_text())
    assert comp["summary"]["regression"] == 1 and comp["summary"]["same"] == 1
    (row,) = [r for r in comp["rows"] if r["kind"] == "regression"]
    assert row["label"] == RESTART and row["verdict_change"] == "pass -> fail"
    failing = {v["name"]: v for v in row["current"]["failing"]}
    assert {"handoff", "transfer_timeout"} <= set(failing)
    assert any(failing["handoff"]["evidence"]) and "stale" in failing["handoff"]["reason"]
    assert "--inject-bug stale_engine_id" in row["current"]["replay"]
    said = capsys.readouterr().out
    assert f"REGRESSION  {RESTART}" in said and "verdict pass -> fail" in said
    page = (out / "sweep.html").read_text()
    # The differences come first, before the table of every cell.
    assert page.index("Differences from the baseline") < page.index(RESTART) < page.index("<h2>Cells</h2>")
    assert "Noise thresholds" in page


def test_the_same_runs_compared_the_other_way_round_is_an_improvement(tmp_path: Path, baseline: Path) -> None:
    broken = tmp_path / "broken"
    assert sweep(str(sweep_file(tmp_path, "mini", BROKEN)), "--out", str(broken), "--jobs", "1") == 1
    code = sweep("--compare-only", str(baseline), "--baseline", str(broken), "--fail-on", "regression")
    assert code == 0
    comp = json.loads((baseline / "comparison.json").read_text())
    assert comp["summary"]["improvement"] == 1 and comp["summary"]["regression"] == 0


def test_a_plain_run_folder_is_a_baseline_too(tmp_path: Path, baseline: Path) -> None:
    run = tmp_path / "run"
    assert main(["run", "prefill_restart_mooncake", "--topology", "1p1d", "--transport", "http", "--world",
                 "sim", "--inject-bug", "stale_engine_id", "--out", str(run), "--no-progress"]) == 1
    code = sweep("--compare-only", str(baseline), "--baseline", str(run), "--fail-on", "change")
    # The run has one cell, the sweep two: one improvement, one new cell; any change trips `change`.
    assert code == 1
    kinds = {r["label"]: r["kind"] for r in json.loads((baseline / "comparison.json").read_text())["rows"]}
    assert kinds[RESTART] == "improvement"
    assert sorted(kinds.values()) == ["improvement", "new"]


def test_the_gpu_cluster_dry_run_prints_pods_services_and_fault_actions(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep("gpu-cluster", "--dry-run") == 0
    said = capsys.readouterr().out
    assert "prefill_restart_nixl 2p2d-nixl-http [reference, real, scaled, gpu-nixl]" in said
    assert '"kind": "Pod"' in said and '"kind": "Service"' in said and "NixlConnector" in said
    assert "nvidia.com/gpu" in said
    assert "delete Pod" in said and "kill -STOP" in said and "/proxies/prefill-1.serve" in said
    assert "teardown:" in said and "left out:" in said


def test_the_dry_run_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep("gpu-cluster", "--dry-run", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    cells = [c for c in doc["cluster"] if c["cell"].startswith("decode_process_frozen 2p2d")]
    (cell,) = cells
    engines = [m for m in cell["manifests"] if m["kind"] == "Pod" and "-router" not in m["metadata"]["name"]]
    assert len(engines) == 4
    actions = [a["describe"] for s in cell["steps"] for a in s["actions"]]
    assert any("kill -STOP" in a for a in actions) and any("kill -CONT" in a for a in actions)


def test_resume_runs_only_the_cells_without_a_verdict(tmp_path: Path) -> None:
    out = tmp_path / "s"
    mini = sweep_file(tmp_path, "mini", MINI)
    assert sweep(str(mini), "--out", str(out)) == 0
    results = sorted(out.rglob("result.json"))
    assert len(results) == 2
    kept, dropped = results[0], results[1]
    before = kept.stat().st_mtime_ns
    dropped.unlink()
    assert sweep(str(mini), "--out", str(out)) == 3  # not without --resume
    assert sweep(str(mini), "--out", str(out), "--resume") == 0
    assert kept.stat().st_mtime_ns == before and dropped.is_file()
    doc = json.loads((out / "report.json").read_text())
    assert len(doc["results"]) == 2 and {r["status"] for r in doc["results"]} == {"pass"}


def test_resume_refuses_a_folder_that_is_not_this_sweeps(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    mini = sweep_file(tmp_path, "mini", MINI)
    other = tmp_path / "other"
    other.mkdir()
    (other / "sweep.json").write_text(json.dumps({"name": "nightly", "cells": []}))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "report.json").write_text(json.dumps({"results": []}))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sweep.json").write_bytes(b"\x80 not json")
    cases = ((other, "holds the sweep 'nightly', not 'mini'"), (plain, "holds a run, not a sweep"),
             (broken, "unreadable"))
    for folder, words in cases:
        before = sorted(p.name for p in folder.iterdir())
        assert sweep(str(mini), "--out", str(folder), "--resume") == 3
        assert words in capsys.readouterr().err
        assert sorted(p.name for p in folder.iterdir()) == before  # nothing written there


def test_run_with_jobs_in_simulated_time(tmp_path: Path) -> None:
    out = tmp_path / "r"
    code = main(["run", "sole_prefill_down", "--topology", "1p1d", "--transport", "http", "--world", "sim",
                 "--jobs", "2", "--out", str(out), "--no-progress"])
    assert code == 0
    assert len(json.loads((out / "report.json").read_text())["results"]) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "no-such-sweep"],
        ["sweep", "ci-regression", "--fail-on", "regression"],
        ["sweep", "ci-regression", "--jobs", "0"],
        ["sweep", "--compare-only", "/nowhere"],
        ["sweep", "ci-regression", "--baseline", "/nowhere"],
        ["run", "--jobs", "zero"],
        ["matrix", "--jobs", "-1"],
        ["sweep", "ci-regression", "--resume"],
    ],
)
def test_usage_errors_exit_3(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    assert code == 3
    assert "error" in capsys.readouterr().err


def test_a_baseline_that_is_not_text_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "report.json").write_bytes(b"\x80\x81{")
    assert sweep("--compare-only", str(tmp_path), "--baseline", str(tmp_path)) == 3
    assert "unreadable" in capsys.readouterr().err


def test_an_interrupted_sweep_writes_its_partial_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the first cell: report.json, junit.xml, sweep.json and sweep.html of what ran, exit 2;
    --resume then runs the rest."""
    import harness.sweep.run as sweep_run

    real_run_cells = sweep_run.run_cells

    async def first_then_ctrl_c(work, jobs, progress=None, reuse=False):  # type: ignore[no-untyped-def]
        await real_run_cells(work[:1], jobs, progress, reuse=reuse)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_run, "run_cells", first_then_ctrl_c)
    out = tmp_path / "s"
    mini = sweep_file(tmp_path, "mini", MINI)
    assert sweep(str(mini), "--out", str(out)) == 2
    doc = json.loads((out / "report.json").read_text())
    assert [r["status"] for r in doc["results"]] == ["pass"]
    assert len(json.loads((out / "sweep.json").read_text())["cells"]) == 1
    assert (out / "sweep.html").is_file() and (out / "junit.xml").is_file()
    monkeypatch.setattr(sweep_run, "run_cells", real_run_cells)
    assert sweep(str(mini), "--out", str(out), "--resume") == 0
    assert len(json.loads((out / "report.json").read_text())["results"]) == 2


def test_a_cluster_sweep_with_no_cluster_to_reach_stops_before_any_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    out = tmp_path / "fc"
    assert sweep("fake-cluster", "--out", str(out)) == 3
    err = capsys.readouterr().err
    assert "[engines.fake-pods]: no cluster to reach" in err and "fake_cluster" in err
    assert not any(out.rglob("history.jsonl"))
