"""Report writers: files written and parseable, unknown never shown as pass, damaged runs still reported."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_checkers_builders import HB, restart_run

import reports
from harness.checkers import run_checks
from harness.history import History
from harness.verdict import Verdict
from reports import (
    SCHEMA,
    ScenarioResult,
    read_results,
    report_from_run_dir,
    result_from_history,
    write_reports,
)
from reports.plot import timeline_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_cell(run_dir: Path, name: str, expect: list[str], **variant: bool | float) -> ScenarioResult:
    """A cell folder with a history (as the runner leaves it) and the result the runner would return."""
    cell = run_dir / f"{name}__1p1d-mooncake-http"
    (cell / "logs").mkdir(parents=True)
    (cell / "logs" / "router.log").write_text("router says hi\n")
    settings = {"transfer_timeout_s": 3.0, "expect": [{"checker": c, "params": {}} for c in expect]}
    hb = restart_run(path=cell / "history.jsonl", settings=settings, scenario=name, **variant)  # type: ignore[arg-type]
    hb.flush().close()
    verdicts = run_checks(hb.history(), expect)
    return ScenarioResult(
        scenario=name,
        topology="1p1d",
        connector="mooncake",
        transport="http",
        router="reference",
        verdicts=verdicts,
        bugs=["1", "13"],
        description="prefill restart <b>same address</b>",
        seed=7,
        duration_s=8.0,
        history_path=cell / "history.jsonl",
        log_dir=cell / "logs",
        cell_dir=cell,
    )


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, list[ScenarioResult]]:
    run_dir = tmp_path / "run-1"
    results = [
        make_cell(run_dir, "good", ["recovery", "handoff", "nothing_lost"]),
        make_cell(run_dir, "stale", ["handoff"], stale_after=True),
        make_cell(run_dir, "short", ["recovery"], end_t=3.05),
    ]
    assert [r.status for r in results] == ["pass", "fail", "unknown"]
    return run_dir, results


def test_report_json_is_versioned_and_round_trips(run: tuple[Path, list[ScenarioResult]]) -> None:
    run_dir, results = run
    written = write_reports(run_dir, results, plots=False)
    assert set(written) == {"json", "junit", "html"}
    doc = json.loads((run_dir / "report.json").read_text())
    assert doc["schema"] == SCHEMA == "pdchaos.report/2"
    assert doc["summary"] == {"total": 3, "pass": 1, "fail": 1, "unknown": 1, "race": 0, "status": "fail"}
    first = doc["results"][0]
    assert first["history"] == "good__1p1d-mooncake-http/history.jsonl"
    assert first["logs"] == ["good__1p1d-mooncake-http/logs/router.log"]
    assert [v["name"] for v in first["verdicts"]] == ["run_complete", "recovery", "handoff", "nothing_lost"]
    back = read_results(run_dir / "report.json")
    assert [(r.scenario, r.status) for r in back] == [(r.scenario, r.status) for r in results]
    assert back[1].overall.reason == results[1].overall.reason
    assert back[0].history_path == run_dir / "good__1p1d-mooncake-http" / "history.jsonl"


def test_junit_fail_is_failure_and_unknown_is_error(run: tuple[Path, list[ScenarioResult]]) -> None:
    run_dir, results = run
    write_reports(results, run_dir, plots=False)  # the other argument order works too
    root = ET.parse(run_dir / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    # A stable name, whatever the run folder is called (CI keeps a suite's history under its name).
    assert suite.get("name") == "pdchaos"
    assert suite.find("properties/property[@name='run_folder']").get("value") == run_dir.name  # type: ignore
    cases = {c.get("classname"): c for c in suite.iter("testcase")}
    assert set(cases) == {"pdchaos.good", "pdchaos.stale", "pdchaos.short"}
    assert cases["pdchaos.good"].find("failure") is None and cases["pdchaos.good"].find("error") is None
    failure = cases["pdchaos.stale"].find("failure")
    assert failure is not None and "stale_engine_id" in (failure.get("message") or "")
    error = cases["pdchaos.short"].find("error")
    assert error is not None and error.get("type") == "unknown"
    assert cases["pdchaos.short"].find("skipped") is None
    assert cases["pdchaos.good"].get("name") == "1p1d-mooncake-http[reference]"


def test_html_is_self_contained_with_table_plot_and_links(run: tuple[Path, list[ScenarioResult]]) -> None:
    run_dir, results = run
    write_reports(run_dir, results)
    page = (run_dir / "report.html").read_text()
    assert '<table class="summary">' in page
    pngs = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(pngs) == 3 and all(base64.b64decode(p).startswith(PNG_MAGIC) for p in pngs)
    assert 'href="good__1p1d-mooncake-http/logs/router.log"' in page
    assert page.count('href="good__1p1d-mooncake-http/history.jsonl"') == 1  # listed once
    assert "Recovery latency" in page and "Heal &rarr; Ready" in page
    assert "0.50s" in page  # heal -> ready of the good run
    assert "Handoff outcomes" in page and "pulled" in page
    assert "<b>same address</b>" not in page and "&lt;b&gt;same address&lt;/b&gt;" in page
    assert "<script" not in page and "http://" not in page  # nothing loaded from elsewhere


def test_report_from_run_dir_rerenders_and_adds_unsaved_cells(
    run: tuple[Path, list[ScenarioResult]],
) -> None:
    run_dir, results = run
    write_reports(run_dir, results[:2], plots=False)
    original = (run_dir / "report.json").read_bytes()
    (run_dir / "report.html").unlink()
    again = report_from_run_dir(run_dir, plots=False)
    assert [(r.scenario, r.status) for r in again] == [
        ("good", "pass"),
        ("stale", "fail"),
        ("short", "unknown"),
    ]
    assert (run_dir / "report.html").is_file()
    root = ET.parse(run_dir / "junit.xml").getroot()
    assert len(root.findall("testsuite/testcase")) == 3
    # The run's own report.json is the record of what it judged: kept byte for byte.
    assert (run_dir / "report.json").read_bytes() == original


def test_crashed_run_with_truncated_history_is_unknown(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-crash"
    cell = run_dir / "restart__1p1d-mooncake-http"
    cell.mkdir(parents=True)
    hb = restart_run(ended=False, settings={"expect": [{"checker": "output", "params": {}}]})
    text = "\n".join(json.dumps(r) for r in hb.flush().records)
    (cell / "history.jsonl").write_text(text + '\n{"type": "request_completed", "t": 8.1, "re')
    results = report_from_run_dir(run_dir, plots=False)
    [r] = results
    assert r.status == "unknown" and "no run_ended" in r.overall.reason
    assert [v.name for v in r.verdicts] == ["run_complete", "output"]
    assert r.scenario == "restart" and r.topology == "1p1d" and r.run_reason == "no run_ended"
    page = (run_dir / "report.html").read_text()
    assert "history truncated" in page
    root = ET.parse(run_dir / "junit.xml").getroot()
    assert root.find("testsuite/testcase/error") is not None


def test_missing_history_still_reports(tmp_path: Path) -> None:
    gone = ScenarioResult(
        scenario="ghost",
        topology="1p1d",
        connector="nixl",
        verdicts=[Verdict.unknown_("run_complete", "engines never started")],
        history_path=tmp_path / "nope" / "history.jsonl",
    )
    written = write_reports(tmp_path, [gone])
    assert "errors" not in written
    page = (tmp_path / "report.html").read_text()
    assert "history unreadable" in page and "(missing)" in page
    r = result_from_history(tmp_path / "nope" / "history.jsonl")
    assert r.status == "unknown" and "unreadable" in r.overall.reason


def test_empty_run_folder_and_missing_folder(tmp_path: Path) -> None:
    assert report_from_run_dir(tmp_path) == []
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["summary"]["status"] == "unknown" and doc["summary"]["total"] == 0
    with pytest.raises(FileNotFoundError):
        report_from_run_dir(tmp_path / "absent")
    with pytest.raises(TypeError):
        write_reports([], [])  # type: ignore[arg-type]


def test_recheck_uses_current_checkers_and_saved_expectations(
    run: tuple[Path, list[ScenarioResult]],
) -> None:
    run_dir, results = run
    forged = ScenarioResult(
        scenario="stale-forged",
        topology="1p1d",
        connector="mooncake",
        verdicts=[Verdict.ok("handoff")],
        history_path=results[1].history_path,
    )
    write_reports(run_dir, [forged], plots=False)
    first = report_from_run_dir(run_dir, plots=False)[0]
    assert (first.scenario, first.status) == ("stale-forged", "pass")  # saved verdicts are kept
    statuses = {r.scenario: r.status for r in report_from_run_dir(run_dir, recheck=True, plots=False)}
    assert statuses == {"good": "pass", "stale": "fail", "short": "unknown"}  # judged afresh


def test_one_broken_renderer_does_not_stop_the_others(
    run: tuple[Path, list[ScenarioResult]], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, results = run

    def boom(items: list[ScenarioResult], folder: Path, plots: bool = True, name: str = "") -> Path:
        raise RuntimeError("renderer broke")

    monkeypatch.setattr(reports, "write_html", boom)
    written = write_reports(run_dir, results, plots=False)
    assert (run_dir / "report.json").is_file() and (run_dir / "junit.xml").is_file()
    assert not (run_dir / "report.html").exists()
    assert "renderer broke" in written["errors"].read_text()


def test_result_status_follows_verdict_and_dict_round_trip(tmp_path: Path) -> None:
    r = ScenarioResult(
        scenario="s",
        topology="2p2d",
        connector="nixl",
        verdicts=[Verdict.fail("handoff", "bad")],
        status="pass",
    )
    assert r.status == "fail" and r.overall.name == "s"
    back = ScenarioResult.from_dict(r.to_dict(tmp_path), tmp_path)
    assert back.status == "fail" and back.verdicts == r.verdicts and back.cell == "2p2d-nixl"
    (tmp_path / "report.json").write_text(json.dumps({"schema": "other/9", "results": []}))
    with pytest.raises(ValueError):
        read_results(tmp_path / "report.json")
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(ValueError):
        read_results(tmp_path / "report.json")


def test_html_without_plots(run: tuple[Path, list[ScenarioResult]]) -> None:
    run_dir, results = run
    write_reports(run_dir, results, plots=False)
    page = (run_dir / "report.html").read_text()
    assert "data:image/png" not in page and "timeline plot not rendered" in page


def test_timeline_png_of_an_empty_history() -> None:
    assert timeline_png(History()).startswith(PNG_MAGIC)
    assert timeline_png(HB().history(), title="x").startswith(PNG_MAGIC)


# ------------------------------------------------------------------ issue 16: missing or damaged evidence


def _write_history(path: Path, records: list[dict[str, object]], extra: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + extra)


def test_killed_run_without_handoff_records_is_unknown_never_fail(tmp_path: Path) -> None:
    """A run killed with SIGKILL never collected the engines' records (they are read as a run ends): the
    checkers built on them say unknown instead of failing 'no correct handoff within N s of heal'."""
    expect = [{"checker": "recovery", "params": {"max_recovery_s": 3.0}},
              {"checker": "handoff", "params": {}}, {"checker": "transfer_timeout", "params": {}},
              {"checker": "nothing_lost", "params": {}}]
    hb = restart_run(ended=False, settings={"expect": expect, "engines": {"transfer_timeout_s": 3.0}})
    kept = [r for r in hb.flush().records if r["type"] != "handoff"]
    _write_history(tmp_path / "run" / "restart__1p1d-mooncake-http" / "history.jsonl", kept)
    [r] = report_from_run_dir(tmp_path / "run", plots=False)
    by_name = {v.name: v for v in r.verdicts}
    assert r.status == "unknown"
    for name in ("recovery", "handoff", "transfer_timeout"):
        assert by_name[name].status == "unknown", by_name[name]
        assert "never collected" in by_name[name].reason
    # The same history with its records judges them (the gate is about missing evidence only).
    h = History.from_records(hb.flush().records)
    assert h.handoffs_collected and run_checks(h, ["recovery"])[1].status != "unknown"


def test_collection_note_decides_whether_handoffs_were_collected() -> None:
    base = [{"t": 0.0, "type": "run_started", "scenario": "s"}]
    assert not History.from_records(base).handoffs_collected
    said = [*base, {"t": 1.0, "type": "note", "message": "collected 0 handoff records",
                    "handoffs_collected": True}]
    assert History.from_records(said).handoffs_collected
    failed = [*base, {"t": 1.0, "type": "note", "message": "handoff records unreadable: x",
                      "handoffs_collected": False}, {"t": 1.1, "type": "run_ended", "reason": "done"}]
    assert not History.from_records(failed).handoffs_collected
    legacy = [*base, {"t": 1.0, "type": "note", "message": "collected 12 handoff records"}]
    assert History.from_records(legacy).handoffs_collected


def test_damaged_lines_in_a_passing_history_make_the_cell_unknown(tmp_path: Path) -> None:
    hb = restart_run(settings={"expect": [{"checker": "output", "params": {}}]})
    records = hb.flush().records
    history = tmp_path / "run" / "restart__1p1d-mooncake-http" / "history.jsonl"
    lines = [json.dumps(r).encode() for r in records]
    lines[5] = b'{"type": "request_completed", "t": 1.0, "re'  # damaged in the middle
    lines[9] = b"\xff\xfe\x00\x01 binary"
    history.parent.mkdir(parents=True)
    history.write_bytes(b"\n".join(lines) + b"\n")
    [r] = report_from_run_dir(tmp_path / "run", plots=False)
    assert r.status == "unknown"
    assert "2 damaged history record(s) (lines 6, 10): evidence lost" in r.overall.reason
    assert "line 6" in (tmp_path / "run" / "report.html").read_text()


def test_garbage_history_under_the_run_folder_is_counted_not_a_traceback(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "stray").mkdir(parents=True)
    (run_dir / "stray" / "history.jsonl").write_bytes(bytes(range(256)) * 40)
    [r] = report_from_run_dir(run_dir, plots=False)
    assert r.status == "unknown" and "no run_started" in r.overall.reason


def test_recheck_writes_beside_the_original_report(run: tuple[Path, list[ScenarioResult]]) -> None:
    run_dir, results = run
    write_reports(run_dir, results, plots=False)
    before = {n: (run_dir / n).read_bytes() for n in ("report.json", "junit.xml", "report.html")}
    rechecked, written = reports.rerender(run_dir, recheck=True, plots=False)
    names = {p.name for p in written.values()}
    assert names == {"report.recheck.json", "junit.recheck.xml", "report.recheck.html"}
    assert {n: (run_dir / n).read_bytes() for n in before} == before
    doc = json.loads((run_dir / "report.recheck.json").read_text())
    assert doc["summary"]["total"] == len(rechecked) == 3


def test_junit_case_names_stay_unique_across_worlds_and_groups(tmp_path: Path) -> None:
    """A sweep's junit.xml holds one cell in several worlds (and engine groups): each its own test case."""
    from reports.junit import case_names

    def cell(world: str, settings: str, group: str, scenario: str = "s") -> ScenarioResult:
        return ScenarioResult(scenario=scenario, topology="1p1d", connector="mooncake", transport="http",
                              router="reference", world=world, settings=settings,
                              verdicts=[Verdict.ok("x")], cell_dir=tmp_path / group / "c")
    results = [cell("sim", "production", "g1"), cell("real", "scaled", "g2"), cell("real", "scaled", "g3"),
               cell("real", "scaled", "g1", scenario="other")]
    names = case_names(results)
    assert names == [
        "1p1d-mooncake-http[reference, sim, production]",
        "1p1d-mooncake-http[reference, real, scaled] @ g2",
        "1p1d-mooncake-http[reference, real, scaled] @ g3",
        "1p1d-mooncake-http[reference]",  # another scenario: its class tells it apart already
    ]
    assert case_names(results[:1]) == ["1p1d-mooncake-http[reference]"]  # a plain run keeps plain names


def test_junit_stays_xml_when_a_reason_holds_characters_xml_cannot(tmp_path: Path) -> None:
    """A router's stderr in a reason (BEL, NUL, a lone ESC, a lone surrogate): the CI must still parse it."""
    from reports.junit import write_junit

    reason = "router exited with code 2 before serving: bad flag \x07 here\x00 \x1b end \ud800."
    r = ScenarioResult(scenario="s", topology="1p1d", connector="mooncake", transport="http",
                       router="cmd", verdicts=[Verdict.unknown_("run", reason)], cell_dir=tmp_path / "c")
    root = ET.parse(write_junit([r], tmp_path)).getroot()
    (error,) = root.iter("error")
    assert "bad flag \\x07 here\\x00 \\x1b end \\ud800." in error.get("message", "")


def test_findings_lead_report_json_and_html(run: tuple[Path, list[ScenarioResult]]) -> None:
    run_dir, results = run
    write_reports(run_dir, results, plots=False)
    doc = json.loads((run_dir / "report.json").read_text())
    [finding] = doc["findings"]
    assert finding["checker"] == "handoff" and finding["reason_class"] == "stale_engine_id"
    assert finding["cells"] == ["stale[1p1d/mooncake/http]"]
    assert finding["replay"] == results[1].replay
    page = (run_dir / "report.html").read_text()
    assert page.index("Findings (1)") < page.index("<h2>Cells</h2>") < page.index('<table class="summary">')
    assert 'href="#stale__1p1d-mooncake-http"' in page  # the finding links its cell's section


def test_a_long_reason_is_cut_at_a_clause_with_the_full_text_one_click_away(tmp_path: Path) -> None:
    clauses = [f"checker_{i}: {i} thing(s) went wrong with engine prefill-{i}" for i in range(12)]
    verdicts = [Verdict.fail(f"checker_{i}", clauses[i].split(": ", 1)[1]) for i in range(12)]
    r = ScenarioResult("long", "1p1d", "mooncake", "http", verdicts=verdicts)
    write_reports(tmp_path, [r], plots=False)
    page = (tmp_path / "report.html").read_text()
    summary = page[page.index('<table class="summary">'):]
    shown = re.search(r"<details><summary>(.*?)</summary>(.*?)</details>", summary)
    assert shown is not None
    assert re.search(r"\(\+\d+ more\)$", shown.group(1)) and shown.group(1).split(" (+")[0] in shown.group(2)
    assert shown.group(2).endswith(clauses[-1])


def test_a_version_1_report_is_still_read(run: tuple[Path, list[ScenarioResult]]) -> None:
    run_dir, results = run
    write_reports(run_dir, results, plots=False)
    doc = json.loads((run_dir / "report.json").read_text())
    doc["schema"] = "pdchaos.report/1"
    del doc["findings"]
    (run_dir / "report.json").write_text(json.dumps(doc))
    assert [r.status for r in read_results(run_dir / "report.json")] == ["pass", "fail", "unknown"]
    from harness.findings import findings_of_folder

    assert [f.reason_class for f in findings_of_folder(run_dir)] == ["stale_engine_id"]
