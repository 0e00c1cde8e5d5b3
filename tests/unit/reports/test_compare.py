"""The comparison report on synthetic matrix folders: rows, differences with evidence, key numbers, skips,
the markdown table, HTML and JSON, and a matrix folder that is incomplete or empty."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reports.compare import (
    SCHEMA,
    Outcome,
    comparison_json,
    differs,
    findings_lines,
    history_numbers,
    load_comparison,
    markdown_table,
    recovery_numbers,
    scenario_table,
    short_cell,
    write_comparison,
)


def _verdict(
    name: str, status: str, reason: str = "", numbers: Any = None, evidence: Any = None
) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "reason": reason,
        "numbers": numbers or {},
        "evidence": evidence or [],
    }


def _recovery(heal_to_ready: float, status: str = "pass") -> dict[str, Any]:
    return _verdict(
        "recovery",
        status,
        numbers={
            "faults": {
                "restart": {"heal_to_ready_s": heal_to_ready, "heal_to_handoff_s": heal_to_ready + 0.1}
            }
        },
    )


def _history(
    path: Path, ok: int, failed: int, outcomes: dict[str, int], statuses: list[tuple[str, str | None]]
) -> None:
    recs: list[dict[str, Any]] = [{"t": 0.0, "type": "run_started", "scenario": "s"}]
    recs.append(
        {"t": 1.0, "type": "fault_applied", "fault": "restart", "kind": "restart", "target": "prefill-0"}
    )
    for i in range(ok):
        recs.append({"t": 1.0, "type": "request_completed", "req": i, "ok": True, "status": 200})
    for i in range(failed):
        recs.append(
            {
                "t": 2.0,
                "type": "request_completed",
                "req": 100 + i,
                "ok": False,
                "status": 500,
                "timed_out": i == 0,
            }
        )
    for outcome, n in outcomes.items():
        for _ in range(n):
            kind = "local" if outcome == "local" else "decode"
            recs.append(
                {
                    "t": 2.0,
                    "type": "handoff",
                    "engine": "decode-0",
                    "kind": kind,
                    "outcome": "computed" if kind == "local" else outcome,
                    "remote_engine_id": "old-id",
                    "prompt_digest": "aa",
                    "kv_digest": "aa",
                }
            )
    recs.append(
        {"t": 0.5, "type": "handoff", "engine": "prefill-0", "kind": "prefill", "outcome": "computed"}
    )
    for st, eid in statuses:
        recs.append(
            {
                "t": 1.5,
                "type": "router_status",
                "engine": "prefill-0",
                "worker": "w1",
                "status": st,
                "kv_engine_id": eid,
            }
        )
    recs.append(
        {
            "t": 1.6,
            "type": "router_event",
            "event": "engine_id",
            "worker": "w1",
            "old": "a",
            "new": "b",
            "ts": 123.0,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _result(
    scenario: str, cell: str, status: str, verdicts: list[dict[str, Any]], hist: str | None
) -> dict[str, Any]:
    topo, conn, tr = cell.split("-")
    return {
        "scenario": scenario,
        "topology": topo,
        "connector": conn,
        "transport": tr,
        "router": "x",
        "status": status,
        "reason": "" if status == "pass" else f"{status} reason",
        "verdicts": verdicts,
        "history": hist,
        "cell_dir": hist.rsplit("/", 1)[0] if hist else None,
        "duration_s": 9.5,
    }


def _matrix(root: Path) -> Path:
    """reference passes both cells; smg fails the restart (stale id, errors); vllm-router skips grpc."""
    cells = ("1p1d-mooncake-grpc", "1p1d-mooncake-http")
    ref, smg, vr = [], [], []
    for cell in cells:
        h = f"restart__{cell}/history.jsonl"
        _history(root / "reference" / h, 20, 1, {"pulled": 20}, [("not_ready", "a"), ("ready", "b")])
        ref.append(
            _result(
                "restart",
                cell,
                "pass",
                [_verdict("run_complete", "pass"), _recovery(0.6), _verdict("handoff", "pass")],
                h,
            )
        )
        _history(
            root / "smg-1.13.0" / h,
            10,
            11,
            {"pulled": 10, "timed_out": 9},
            [("not_ready", "a"), ("ready", "a")],
        )
        smg.append(
            _result(
                "restart",
                cell,
                "fail",
                [
                    _verdict("run_complete", "pass"),
                    _recovery(1.4),
                    _verdict(
                        "handoff",
                        "fail",
                        "9 stale",
                        evidence=[{"checker": "handoff", "item": "req 7 stale id a"}],
                    ),
                ],
                h,
            )
        )
    h = "restart__1p1d-mooncake-http/history.jsonl"
    _history(root / "vllm-router-0.1.17" / h, 21, 0, {"pulled": 21}, [("ready", None)])
    vr.append(
        _result(
            "restart",
            "1p1d-mooncake-http",
            "pass",
            [_verdict("run_complete", "pass"), _recovery(0.9), _verdict("handoff", "pass")],
            h,
        )
    )
    # The same checks, same verdicts on both: this row does not differ.
    for label, rs in (("reference", ref), ("smg-1.13.0", smg), ("vllm-router-0.1.17", vr)):
        rs.append(_result("quiet", "1p1d-mooncake-http", "pass", [_verdict("run_complete", "pass")], None))
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / "report.json").write_text(json.dumps({"schema": "pdchaos.report/1", "results": rs}))
    matrix = {
        "schema": "pdchaos.matrix/1",
        "routers": [
            {"spec": "reference", "label": "reference", "dir": "reference", "skipped": [], "adjustments": []},
            {
                "spec": "smg==1.13.0",
                "label": "smg-1.13.0",
                "dir": "smg-1.13.0",
                "version": "1.13.0",
                "executable": "/c/smg-1.13.0/bin/smg",
                "skipped": [],
                "adjustments": ["health interval 0.3 s -> 1 s (whole seconds, at least 1)"],
            },
            {
                "spec": "vllm-router",
                "label": "vllm-router-0.1.17",
                "dir": "vllm-router-0.1.17",
                "skipped": [
                    {"scenario": "restart", "cell": "1p1d-mooncake-grpc", "reason": "vllm-router: HTTP only"}
                ],
                "adjustments": [],
            },
        ],
    }
    (root / "matrix.json").write_text(json.dumps(matrix))
    return root


def test_rows_statuses_and_differences(tmp_path: Path) -> None:
    comp = load_comparison(_matrix(tmp_path))
    assert [r.label for r in comp.routers] == ["reference", "smg-1.13.0", "vllm-router-0.1.17"]
    rows = {(r.scenario, r.cell): r for r in comp.rows}
    assert set(rows) == {
        ("restart", "1p1d-mooncake-grpc"),
        ("restart", "1p1d-mooncake-http"),
        ("quiet", "1p1d-mooncake-http"),
    }
    grpc = rows[("restart", "1p1d-mooncake-grpc")]
    assert {k: o.status for k, o in grpc.outcomes.items()} == {
        "reference": "pass",
        "smg-1.13.0": "fail",
        "vllm-router-0.1.17": "skipped",
    }
    assert grpc.outcomes["vllm-router-0.1.17"].reason == "vllm-router: HTTP only"
    assert grpc.differs
    assert not rows[("quiet", "1p1d-mooncake-http")].differs
    assert comp.summary()["vllm-router-0.1.17"] == {
        "pass": 2,
        "fail": 0,
        "unknown": 0,
        "race": 0,
        "skipped": 1,
        "missing": 0,
    }
    assert comp.status == "fail"


def test_key_numbers_and_evidence(tmp_path: Path) -> None:
    comp = load_comparison(_matrix(tmp_path))
    row = next(r for r in comp.rows if r.cell == "1p1d-mooncake-grpc")
    smg = row.outcomes["smg-1.13.0"]
    assert smg.numbers["recovery_s"] == pytest.approx(1.4)
    assert smg.numbers["heal_to_handoff_s"] == pytest.approx(1.5)
    assert (smg.numbers["requests"], smg.numbers["errors"], smg.numbers["timeouts"]) == (21, 11, 1)
    assert smg.numbers["error_status"] == {"500": 11}
    assert smg.numbers["handoffs"] == {"pulled": 10, "timed_out": 9}
    assert [v["name"] for v in smg.evidence["verdicts"]] == ["handoff"]
    assert smg.evidence["verdicts"][0]["evidence"] == [{"checker": "handoff", "item": "req 7 stale id a"}]
    assert smg.evidence["odd_handoffs_total"] == 9
    assert smg.evidence["odd_handoffs"][0]["outcome"] == "timed_out"
    assert [s["kv_engine_id"] for s in smg.evidence["router_statuses"]] == ["a", "a"]
    assert smg.evidence["router_events"][0]["event"] == "engine_id"
    assert smg.evidence["faults"] == [
        {"t": 1.0, "fault": "restart", "kind": "restart", "target": "prefill-0"}
    ]
    ref = row.outcomes["reference"]
    assert ref.numbers["recovery_s"] == pytest.approx(0.6)
    assert ref.evidence["verdicts"] == []
    assert ref.cell_dir is not None and ref.cell_dir.endswith("reference/restart__1p1d-mooncake-grpc")


def test_written_files(tmp_path: Path) -> None:
    root = _matrix(tmp_path)
    write_comparison(root)
    doc = json.loads((root / "compare.json").read_text())
    assert doc["schema"] == SCHEMA and doc["status"] == "fail"
    assert doc["summary"]["smg-1.13.0"]["fail"] == 2
    row = doc["rows"][0]
    assert row["outcomes"]["smg-1.13.0"]["numbers"]["handoffs"] == {"pulled": 10, "timed_out": 9}
    md = (root / "compare.md").read_text()
    assert md.splitlines()[0] == "| scenario | cell | reference | smg-1.13.0 | vllm-router-0.1.17 |"
    assert (
        "| restart (*) | 1p1d-mooncake-grpc | PASS rec 0.60s err 1/21 | "
        "FAIL handoff rec 1.40s err 11/21 | skip |" in md
    )
    assert "| quiet | 1p1d-mooncake-http | PASS | PASS | PASS |" in md
    page = (root / "compare.html").read_text()
    assert "Differences (2)" in page
    assert "req 7 stale id a" in page
    assert "vllm-router: HTTP only" in page
    assert "health interval 0.3 s -&gt; 1 s" in page
    assert "href='smg-1.13.0/report.html'" in page
    assert "<script" not in page


def test_scenario_table_counts_cells_per_router_and_transport(tmp_path: Path) -> None:
    root = _matrix(tmp_path)
    table = scenario_table(load_comparison(root)).splitlines()
    # vllm-router ran no gRPC cell: no column for it (its skipped gRPC cell is not counted).
    assert table[0] == ("| scenario | reference grpc | reference http | smg-1.13.0 grpc | smg-1.13.0 http "
                        "| vllm-router-0.1.17 http |")
    assert "| restart | 1/0/0 | 1/0/0 | 0/1/0 | 0/1/0 | 1/0/0 |" in table
    assert "| quiet | - | 1/0/0 | - | 1/0/0 | 1/0/0 |" in table
    assert table[-1] == "| **total** | 1/0/0 | 2/0/0 | 0/1/0 | 1/1/0 | 2/0/0 |"
    write_comparison(root)
    assert "## By scenario" in (root / "compare.md").read_text()


def test_without_matrix_json_each_run_folder_is_a_router(tmp_path: Path) -> None:
    root = _matrix(tmp_path)
    (root / "matrix.json").unlink()
    comp = load_comparison(root)
    assert sorted(r.label for r in comp.routers) == ["reference", "smg-1.13.0", "vllm-router-0.1.17"]
    grpc = next(r for r in comp.rows if r.cell == "1p1d-mooncake-grpc")
    # No matrix: nobody knows vllm-router skipped it.
    assert grpc.outcomes["vllm-router-0.1.17"].status == "missing"
    with pytest.raises(ValueError, match=r"no matrix\.json"):
        load_comparison(tmp_path / "empty")


def test_router_without_report_yet_is_missing_not_pass(tmp_path: Path) -> None:
    root = _matrix(tmp_path)
    shutil.rmtree(root / "smg-1.13.0")  # a router the matrix never reached
    comp = load_comparison(root)
    assert {r.outcomes["smg-1.13.0"].status for r in comp.rows} == {"missing"}
    assert comp.status == "pass"  # missing cells are not judged; the table shows them as '-'
    assert "| - |" in markdown_table(comp)


async def test_an_interrupted_router_s_cells_are_judged_from_their_histories(tmp_path: Path) -> None:
    """A matrix interrupted before a router's report.json: the cells it ran, as they stand, not missing."""
    from harness.runner import run_scenario
    from harness.scenario import load_scenarios

    root = _matrix(tmp_path)
    shutil.rmtree(root / "smg-1.13.0")
    (s,) = load_scenarios(["sole_prefill_down"])
    ran = root / "smg-1.13.0" / "sole_prefill_down__1p1d-mooncake-http"
    await run_scenario(s, "1p1d", "mooncake", "http", "reference", ran, world="sim")
    cut = root / "smg-1.13.0" / "cut__1p1d-mooncake-http"
    cut.mkdir()
    started = json.loads((ran / "history.jsonl").read_text().splitlines()[0])
    (cut / "history.jsonl").write_text(json.dumps({**started, "scenario": "cut"}) + "\n")
    rows = {r.key: r.outcomes["smg-1.13.0"].status for r in load_comparison(root).rows}
    assert rows["sole_prefill_down 1p1d-mooncake-http"] == "pass"  # its saved result
    assert rows["sole_prefill_down 1p1d-mooncake-http"] != "missing"
    assert rows["restart 1p1d-mooncake-http"] == "missing"  # never reached
    assert rows["cut 1p1d-mooncake-http"] == "unknown"  # cut short: its history alone, no run_ended


def test_differs_on_a_checker_even_with_the_same_status() -> None:
    a = Outcome("fail", checks={"handoff": "fail", "recovery": "pass"})
    b = Outcome("fail", checks={"handoff": "pass", "recovery": "fail"})
    c = Outcome("skipped")
    assert differs({"a": a, "b": b})
    assert not differs({"a": a, "c": c})
    assert not differs({"a": a, "a2": Outcome("fail", checks={"handoff": "fail"})})


def test_short_cell_and_helpers() -> None:
    assert short_cell(Outcome("skipped", reason="x")) == "skip"
    assert short_cell(Outcome("missing")) == "-"
    o = Outcome(
        "fail",
        checks={"run_complete": "pass", "a": "fail", "b": "unknown", "c": "fail", "d": "fail"},
        numbers={"recovery_s": None, "errors": 0},
    )
    assert short_cell(o) == "FAIL a,b,c..."
    assert recovery_numbers(
        [{"name": "recovery", "numbers": {"faults": {"x": {"heal_to_ready_s": "n/a"}}}}]
    ) == {"recovery_s": None, "heal_to_handoff_s": None}
    n, ev = history_numbers([])
    assert n["requests"] == 0 and n["handoffs"] == {} and ev["odd_handoffs"] == []


def test_router_log_evidence(tmp_path: Path) -> None:
    root = _matrix(tmp_path)
    log = root / "smg-1.13.0" / "restart__1p1d-mooncake-grpc" / "logs" / "router.log"
    log.parent.mkdir(parents=True)
    lines = [
        "2026-11-30 03:25:59 DEBUG smg::worker: Sending health check request",
        "2026-11-30 03:25:59 ERROR http_request{request_id=\"cmpl-AAA\"}: pipeline attempt failed",
        "2026-11-30 03:25:59 ERROR http_request{request_id=\"cmpl-BBB\"}: pipeline attempt failed",
        "2026-11-30 03:25:59  INFO smg::server: listening",
        "2026-11-30 03:26:00 \x1b[32m INFO\x1b[0m smg::worker::manager: Worker status transition "
        "worker_url=grpc://127.0.0.1:1 old=Ready new=NotReady",
        "2026-11-30 03:26:01  INFO smg::worker::manager: Recovered PD worker reports a new KV engine id "
        "previous=a",
    ]
    log.write_text("\n".join(lines) + "\n")
    comp = load_comparison(root)
    row = next(r for r in comp.rows if r.cell == "1p1d-mooncake-grpc")
    ev = row.outcomes["smg-1.13.0"].evidence
    assert ev["router_log_total"] == 4  # debug and uninteresting lines left out
    # Status and engine id lines first; the same failure for two requests once.
    assert ev["router_log"][0].endswith("old=Ready new=NotReady")
    assert "\x1b" not in ev["router_log"][0]
    assert "new KV engine id" in ev["router_log"][1]
    assert len(ev["router_log"]) == 3
    assert "router_log" not in row.outcomes["reference"].evidence


def test_each_router_s_findings_against_the_router_before_it(tmp_path: Path) -> None:
    comp = load_comparison(_matrix(tmp_path))
    assert list(comp.findings) == ["reference", "smg-1.13.0", "vllm-router-0.1.17"]
    assert comp.findings["reference"] == []
    smg = comp.findings["smg-1.13.0"]
    assert smg and {c.kind for c in smg} == {"new"}
    kept = {c.finding.id for c in comp.findings["vllm-router-0.1.17"] if c.kind == "unchanged"}
    gone = {c.finding.id for c in comp.findings["vllm-router-0.1.17"] if c.kind == "gone"}
    assert kept | gone == {c.finding.id for c in smg}
    doc = comparison_json(comp)
    assert doc["findings"]["smg-1.13.0"][0]["kind"] == "new"
    lines = findings_lines(comp)
    assert lines[0] == "pdchaos: reference: findings against no router: none in either"
    assert any(line.startswith("  NEW") for line in lines)
