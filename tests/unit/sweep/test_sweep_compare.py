"""Lining a run up with its baseline: verdict changes, numbers beyond noise (and not within it), new and gone
cells, what `--fail-on` gates on, and run folders read back as keyed cells."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.sweep.cells import CellRecord, load_cells
from harness.sweep.cli import gate
from harness.sweep.compare import bootstrap_ci, compare
from harness.sweep.keys import CellKey
from harness.sweep.spec import Thresholds

K1 = CellKey("prefill_restart_mooncake", "1p1d", "mooncake", "http", world="sim", settings="production")
K2 = CellKey("sole_prefill_down", "1p1d", "mooncake", "http", world="sim", settings="production")


def rec(key: CellKey, status: str = "pass", **kw) -> CellRecord:
    checks = kw.pop("checks", {"handoff": status})
    return CellRecord(key=key, status=status, reason="" if status == "pass" else f"{status}: why",
                      checks=checks, **kw)


def test_identical_runs_have_no_difference() -> None:
    c = compare({K1: rec(K1), K2: rec(K2)}, {K1: rec(K1), K2: rec(K2)})
    assert c.counts()["same"] == 2 and c.differences() == []
    assert not gate(c, "regression") and not gate(c, "change")


def test_pass_to_fail_is_a_regression_with_the_failing_checkers_evidence() -> None:
    bad = rec(K1, "fail", checks={"handoff": "fail", "output": "pass"},
              failing=[{"name": "handoff", "status": "fail", "reason": "stale id", "evidence": ["req 7"]}])
    c = compare({K1: rec(K1), K2: rec(K2)}, {K1: bad, K2: rec(K2)})
    (row,) = c.regressions
    assert row.key == K1 and row.verdict_change == "pass -> fail"
    assert "handoff: pass -> fail" in row.check_changes and "output: - -> pass" in row.check_changes
    assert row.current is not None and row.current.failing[0]["evidence"] == ["req 7"]
    assert gate(c, "regression") and gate(c, "verdict")
    doc = c.to_dict()
    assert doc["schema"] == "pdchaos.sweep-compare/1" and doc["rows"][0]["kind"] == "regression"


def test_verdict_kinds() -> None:
    cases = {("fail", "pass"): "improvement", ("unknown", "pass"): "improvement", ("pass", "unknown"):
             "regression", ("unknown", "fail"): "regression", ("fail", "unknown"): "changed",
             # a race compared as a race: the same race is no change, a fail from it a regression
             ("race", "race"): "same", ("race", "fail"): "regression", ("pass", "race"): "regression",
             ("race", "pass"): "improvement", ("fail", "race"): "changed"}
    for (b, cur), kind in cases.items():
        (row,) = compare({K1: rec(K1, b)}, {K1: rec(K1, cur)}).rows
        assert row.kind == kind, (b, cur)


def test_new_and_gone_cells() -> None:
    c = compare({K1: rec(K1)}, {K2: rec(K2)})
    assert [r.kind for r in c.differences()] == ["new", "gone"]
    assert gate(c, "change") and not gate(c, "regression")
    failing_new = compare({}, {K2: rec(K2, "fail")})
    assert failing_new.rows[0].kind == "regression" and gate(failing_new, "verdict")


def test_recovery_is_held_to_the_probe_interval() -> None:
    # 0.3 s probes: a recovery can only be seen at a probe, so 0.5 s slower is within 2 x 0.3 s of noise...
    same = compare({K1: rec(K1, recovery_s=1.0, probe_interval_s=0.3)},
                   {K1: rec(K1, recovery_s=1.5, probe_interval_s=0.3)})
    (m,) = same.rows[0].metrics
    assert same.rows[0].kind == "same" and m.threshold == 0.6 and not m.significant
    assert "2 probe intervals x 0.3 s" in m.rule
    # ...and 1.2 s slower is not.
    worse = compare({K1: rec(K1, recovery_s=1.0, probe_interval_s=0.3)},
                    {K1: rec(K1, recovery_s=2.2, probe_interval_s=0.3)})
    assert worse.rows[0].kind == "regression" and worse.rows[0].metrics[0].worse
    assert "recovery_s 1.000 -> 2.200" in worse.rows[0].why[0]
    assert not gate(worse, "verdict") and gate(worse, "regression")


def test_ttft_needs_both_a_material_change_and_an_interval_that_excludes_zero() -> None:
    rng = np.random.default_rng(1)
    base = list(rng.normal(0.10, 0.01, 400))
    noise = list(rng.normal(0.10, 0.01, 400))
    slower = list(rng.normal(0.20, 0.01, 400))
    tiny = list(rng.normal(0.102, 0.01, 400))  # significant statistically, not materially
    assert compare({K1: rec(K1, ttft_s=base)}, {K1: rec(K1, ttft_s=noise)}).rows[0].kind == "same"
    assert compare({K1: rec(K1, ttft_s=base)}, {K1: rec(K1, ttft_s=tiny)}).rows[0].kind == "same"
    row = compare({K1: rec(K1, ttft_s=base)}, {K1: rec(K1, ttft_s=slower)}).rows[0]
    assert row.kind == "regression"
    p50 = next(m for m in row.metrics if m.name == "ttft_p50_s")
    assert p50.worse and p50.ci is not None and p50.ci[0] > 0 and p50.samples == (400, 400)
    faster = compare({K1: rec(K1, ttft_s=slower)}, {K1: rec(K1, ttft_s=base)}).rows[0]
    assert faster.kind == "improvement"


def test_thresholds_come_from_the_sweep_file() -> None:
    loose = Thresholds(recovery_probe_intervals=10)
    c = compare({K1: rec(K1, recovery_s=1.0, probe_interval_s=0.3)},
                {K1: rec(K1, recovery_s=2.2, probe_interval_s=0.3)}, loose)
    assert c.rows[0].kind == "same"


def test_the_bootstrap_is_seeded() -> None:
    xs, ys = np.linspace(0, 1, 50), np.linspace(0.2, 1.2, 60)
    assert bootstrap_ci(xs, ys, 0.5, 0.95, 300) == bootstrap_ci(xs, ys, 0.5, 0.95, 300)


def _result(scenario: str, cell_dir: str, status: str, world: str = "sim") -> dict:
    return {"scenario": scenario, "topology": "1p1d", "connector": "mooncake", "transport": "http",
            "router": "reference", "world": world, "settings": "production", "status": status,
            "reason": "" if status == "pass" else "broke", "replay": "pdchaos run x",
            "verdicts": [{"name": "recovery", "status": status, "reason": "r",
                          "numbers": {"faults": {"f": {"heal_to_ready_s": 0.9, "heal_to_handoff_s": 1.2}}},
                          "evidence": ["e1", "e2"]}],
            "history": f"{cell_dir}/history.jsonl", "cell_dir": cell_dir}


def test_a_run_folder_is_read_back_as_keyed_cells(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    started = {"type": "run_started", "time_unit": "simulated seconds",
               "settings": {"health_interval_s": 60.0}}
    lines = [started,
             {"type": "request_completed", "ok": True, "ttft_s": 0.05},
             {"type": "request_completed", "ok": False, "ttft_s": 9.0},
             {"type": "request_completed", "ok": True, "ttft_s": None}]
    (tmp_path / "a" / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = {"schema": "pdchaos.report/1", "results": [_result("s1", "a", "fail")]}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    cells = load_cells(tmp_path)
    key = CellKey("s1", "1p1d", "mooncake", "http", "reference", "sim", "production", "local")
    r = cells[key]
    assert (r.status, r.recovery_s, r.heal_to_handoff_s, r.ttft_s) == ("fail", 0.9, 1.2, [0.05])
    assert (r.probe_interval_s, r.time_unit) == (60.0, "simulated seconds")
    assert r.failing[0]["evidence"] == ["e1", "e2"] and r.cell_dir == str(tmp_path / "a")


def test_a_sweep_folder_keys_its_cells_by_sweep_json(tmp_path: Path) -> None:
    doc = {"schema": "pdchaos.report/1", "results": [_result("s1", "g/a", "pass", world="real")]}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    key = CellKey("s1", "1p1d", "mooncake", "http", "smg-latest", "real", "production", "local")
    (tmp_path / "sweep.json").write_text(json.dumps({"cells": [{**key.to_dict(), "dir": "g/a"}]}))
    assert list(load_cells(tmp_path)) == [key]
