"""The router matrix end to end with the reference router (a real run, fake engines) next to a gateway that
cannot run the cell (skipped, with its reason, never a pass), and `pdchaos matrix` usage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.matrix import drop_skipped, main, plan_router, run_matrix, unique_labels
from harness.routers.gateways.adapters import SmgRouter, VllmRouter
from harness.runner import expand_matrix
from harness.scenario import EngineSettings, Expect, RouterSettings, Scenario, Workload

QUICK = Scenario(
    name="quick_grpc",
    description="1p1d over gRPC, 0.6 s of load, no fault.",
    topologies=("1p1d",),
    connectors=("mooncake",),
    transports=("grpc",),
    router=RouterSettings(health_interval_s=0.1, health_timeout_s=0.5, request_timeout_s=5.0),
    engines=EngineSettings(transfer_timeout_s=1.0, kv_abort_timeout_s=10.0),
    workload=Workload(mode="closed", concurrency=2, duration_s=0.6, max_tokens=4, deadline_s=4.0),
    expect=(Expect("nothing_lost"), Expect("output")),
)


def test_plan_skips_and_adjustments() -> None:
    pairs = expand_matrix([QUICK], None, None, ["grpc"])
    vr = plan_router(VllmRouter("/nonexistent/vllm-router", version="0.1.17", flags=frozenset()), pairs)
    assert vr.run == [] and len(vr.skipped) == 1
    assert vr.skipped[0]["cell"] == "1p1d-mooncake-grpc" and "gRPC" in vr.skipped[0]["reason"]
    smg = plan_router(SmgRouter("/nonexistent/smg", version="1.13.0", flags=frozenset()), pairs)
    assert len(smg.run) == 1 and smg.skipped == []
    assert "health interval 0.1 s -> 1 s (whole seconds, at least 1)" in smg.adjustments
    ref = plan_router("reference", pairs)
    assert (ref.label, len(ref.run), ref.adjustments) == ("reference", 1, [])
    twins = [plan_router(SmgRouter("a", version="1.0.0", flags=frozenset()), pairs) for _ in range(3)]
    unique_labels(twins)
    assert [p.label for p in twins] == ["smg-1.0.0", "smg-1.0.0.2", "smg-1.0.0.3"]


async def test_matrix_reference_and_skipping_gateway(tmp_path: Path) -> None:
    out = tmp_path / "m"
    vr = VllmRouter("/nonexistent/vllm-router", version="0.1.17", flags=frozenset())
    results = await run_matrix([QUICK], ["reference", vr], out, progress=False)
    assert [r.status for r in results["reference"]] == ["pass"]
    assert results["vllm-router-0.1.17"] == []
    matrix = json.loads((out / "matrix.json").read_text())
    assert [r["label"] for r in matrix["routers"]] == ["reference", "vllm-router-0.1.17"]
    comp = json.loads((out / "compare.json").read_text())
    (row,) = comp["rows"]
    assert row["outcomes"]["reference"]["status"] == "pass"
    assert row["outcomes"]["reference"]["numbers"]["requests"] > 0
    assert row["outcomes"]["reference"]["numbers"]["handoffs"].get("pulled", 0) > 0
    assert row["outcomes"]["vllm-router-0.1.17"]["status"] == "skipped"
    assert comp["summary"]["vllm-router-0.1.17"]["skipped"] == 1
    assert (out / "reference" / "report.json").is_file() and (out / "compare.html").is_file()
    assert "| quick_grpc | 1p1d-mooncake-grpc | PASS | skip |" in (out / "compare.md").read_text()


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--router", "nginx", "--out", str(tmp_path / "a")]) == 3
    assert "unknown router 'nginx'" in capsys.readouterr().err
    assert main(["no_such_scenario", "--out", str(tmp_path / "b")]) == 3
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert main(["--router", "reference", "--out", str(full)]) == 3
    assert "not empty" in capsys.readouterr().err
    assert main(["--compare-only", str(tmp_path / "nothing")]) == 3


def test_cli_compare_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r" / "reference"
    run.mkdir(parents=True)
    res = {"scenario": "s", "topology": "1p1d", "connector": "nixl", "transport": "http", "status": "fail",
           "reason": "r", "verdicts": [{"name": "handoff", "status": "fail"}]}
    (run / "report.json").write_text(json.dumps({"results": [res]}))
    assert main(["--compare-only", str(tmp_path / "r")]) == 1
    assert "| s | 1p1d-nixl-http | FAIL handoff |" in capsys.readouterr().out
    assert (tmp_path / "r" / "compare.html").is_file()


def test_drop_skipped_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    pairs = expand_matrix([QUICK], None, None, None)
    vr = VllmRouter("/nonexistent/vllm-router", version="0.1.17", flags=frozenset())
    assert drop_skipped(vr, pairs) == []
    assert "skipping quick_grpc 1p1d-mooncake-grpc on vllm-router-0.1.17: vllm-router's grpc mode" in (
        capsys.readouterr().err
    )
    assert drop_skipped("reference", pairs) == pairs


def test_pdchaos_run_plan_leaves_out_what_the_gateway_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pdchaos run --router vllm-router` plans only its HTTP cells (a fake binary named by the env var)."""
    from harness.cli import build_parser, plan_run

    exe = tmp_path / "vllm-router"
    exe.write_text("#!/bin/sh\necho '--prometheus-host --vllm-pd-disaggregation'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PDCHAOS_VLLM_ROUTER", str(exe))
    args = build_parser().parse_args(["run", "sole_prefill_down", "--topology", "1p1d", "--connector", "nixl",
                                      "--router", "vllm-router", "--out", str(tmp_path / "o")])
    plan = plan_run(args)
    assert [c.transport for _, c in plan.cells] == ["http"]
    assert "skipping sole_prefill_down 1p1d-nixl-grpc on vllm-router" in capsys.readouterr().err


def test_production_settings_need_no_rounding_of_a_gateways_whole_seconds() -> None:
    pairs = expand_matrix([QUICK], None, None, ["grpc"])
    smg = SmgRouter("/nonexistent/smg", version="1.13.0", flags=frozenset())
    scaled = plan_router(smg, pairs)
    production = plan_router(smg, pairs, settings="production")
    assert any(a.startswith("health interval") for a in scaled.adjustments)
    assert not any(a.startswith("health interval") for a in production.adjustments)


async def test_resume_takes_judged_cells_and_runs_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "m"
    first = await run_matrix([QUICK], ["reference"], out, progress=False)
    (cell,) = first["reference"]
    assert cell.cell_dir is not None and (cell.cell_dir / "result.json").is_file()
    again = await run_matrix([QUICK], ["reference"], out, progress=False, resume=True)
    (kept,) = again["reference"]
    assert (kept.status, kept.started_at) == (cell.status, cell.started_at)
    assert kept.history_path == cell.history_path
    assert [v.name for v in kept.verdicts] == [v.name for v in cell.verdicts]
    # A cell with no verdict (interrupted) runs again.
    (cell.cell_dir / "result.json").unlink()
    rerun = await run_matrix([QUICK], ["reference"], out, progress=False, resume=True)
    assert rerun["reference"][0].status == "pass"
    assert rerun["reference"][0].started_at != cell.started_at


def test_cli_resume_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--router", "reference", "--resume"]) == 3
    assert "--resume needs --out" in capsys.readouterr().err
    assert main(["--router", "reference", "--resume", "--out", str(tmp_path / "none")]) == 3
    assert "holds no readable matrix.json" in capsys.readouterr().err
    done = tmp_path / "done"
    done.mkdir()
    (done / "matrix.json").write_text(json.dumps({"seed": 0, "settings": "scaled"}))
    assert main(["--router", "reference", "--resume", "--out", str(done), "--settings", "production"]) == 3
    assert "was run with settings 'scaled', not 'production'" in capsys.readouterr().err
    assert main(["--router", "reference", "--resume", "--out", str(done), "--seed", "4"]) == 3
    assert "was run with seed 0, not 4" in capsys.readouterr().err


def test_cli_takes_a_gateway_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--router profile:NAME` (the reference router with a release's switches) is a router the matrix runs,
    as `run`, `search` and `sweep` take it: the command gets past the routers to the next check."""
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert main(["--router", "profile:smg-1.13.0", "--out", str(full)]) == 3
    err = capsys.readouterr().err
    assert "not empty" in err and "unknown router" not in err
