"""Fidelity facts and table: answers reduced to comparable facts, differences found and classified."""

from __future__ import annotations

import json

import pytest

from harness.fidelity import table
from harness.fidelity.mooncake_source import FACTS_FILE, mooncake_results, restrict_to_source
from harness.fidelity.observe import (
    HttpAnswer,
    ProbeResult,
    error_shape,
    json_type,
    key_types,
    outcome,
    stream_end,
)


def test_json_types_and_key_types_name_what_a_router_reads() -> None:
    assert json_type([[1, 2]]) == "list[list[number]]"
    assert json_type(None) == "null" and json_type(True) == "bool"
    assert key_types({"b": "x", "a": 1}) == "a:number,b:string"
    assert key_types({"a": 1}, ("a", "z")) == "a:number,z:absent"
    assert key_types(None) == "none"


def test_outcome_tells_error_bodies_streams_and_silence_apart() -> None:
    assert outcome(HttpAnswer(200, b"{}", 4.0)) == "HTTP 200"  # a success's time is the machine's speed
    assert outcome(HttpAnswer(200, b'{"error": {"message": "x"}}', 0.1)) == "200 with an error body, fast"
    sse = b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n'
    assert outcome(HttpAnswer(200, sse, 3.0, content_type="text/event-stream")).startswith(
        "200 stream with an error chunk, after a wait")
    assert outcome(HttpAnswer(None, b"", None, "timeout")) == "no answer in 15 s"
    assert outcome(HttpAnswer(None, b"", 0.01, "ServerDisconnectedError")) == (
        "connection error (ServerDisconnectedError), fast")
    assert outcome(HttpAnswer(503, b"", 2.0)) == "HTTP 503, after a wait"


def test_error_shape_and_stream_end() -> None:
    body = json.dumps({"error": {"message": "m", "type": "t", "code": 400}}).encode()
    assert error_shape(HttpAnswer(400, body)) == "error{code:number,message:string,type:string}"
    assert error_shape(HttpAnswer(400, b"")) == "empty"
    assert error_shape(HttpAnswer(400, b"<html>")) == "not JSON"
    sse = b'data: {"choices": [{"finish_reason": "length"}]}\n\ndata: [DONE]\n\n'
    assert stream_end(HttpAnswer(200, sse)) == "ends [DONE]; finish_reason set"
    assert stream_end(HttpAnswer(200, b'data: {"choices": []}\n\n')) == "no [DONE]; finish_reason never set"


def _result(probe: str, **facts: tuple[str, bool]) -> ProbeResult:
    r = ProbeResult(probe, "q")
    for name, (value, actionable) in facts.items():
        r.add(name, value, actionable)
    return r


def test_compare_classifies_each_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = [_result("p", status=("HTTP 200, fast", True), version=("0.11", False), shape=("a", True))]
    real = [_result("p", status=("HTTP 404, fast", True), version=("0.32", False), shape=("a", True),
                    extra=("only real", True))]
    rows = table.compare(fake, real)
    verdicts = {r.fact: r.verdict for r in rows}
    assert verdicts == {"status": "DIFFERS (router-actionable)", "version": "differs (not router-actionable)",
                        "shape": "same", "extra": "DIFFERS (router-actionable)"}
    assert [r.fact for r in table.unexplained(rows)] == ["status", "extra"]
    monkeypatch.setitem(table.EXPLAINED, ("p", "status"), "known: the fakes keep it on purpose")
    rows = table.compare(fake, real)
    assert [r.fact for r in table.unexplained(rows)] == ["extra"]
    md = table.render_markdown(rows, "vllm")
    assert "known: the fakes keep it on purpose" in md and "**differs**" in md
    assert "DIFFERS" in table.render_text(rows, "vllm")


def test_a_probe_the_real_side_skipped_shows_why() -> None:
    skipped = ProbeResult("p", "q", skipped="needs an accelerator")
    rows = table.compare([_result("p", status=("HTTP 200, fast", True))], [skipped])
    assert rows[0].real == "skipped: needs an accelerator" and not rows[0].agree


def test_mooncake_rows_come_from_source_with_citations() -> None:
    rows = json.loads(FACTS_FILE.read_text(encoding="utf-8"))
    assert rows, "the Mooncake facts file is empty"
    for row in rows:
        assert row["source"].startswith("vllm/") and ":" in row["source"], row
    results = mooncake_results()
    assert all(f.source and f.source.startswith("from source: vLLM") for r in results for f in r.facts)
    only = mooncake_results(["handoff"])
    assert {r.probe for r in only} == {"handoff", "source_only"}
    fake = _result("handoff", **{"prefill params": ("none", True), "prefill status": ("HTTP 200", True)})
    kept = restrict_to_source([fake], only)
    assert [f.name for f in kept[0].facts] == ["prefill params"]
    assert kept[-1].probe == "source_only" and all(not f.actionable for f in kept[-1].facts)
    rows = table.compare(kept, only)
    assert rows[0].agree and rows[0].source and "mooncake_connector.py" in rows[0].source


def test_source_only_rows_are_shown_not_compared() -> None:
    source = [_result("source_only", **{"bootstrap query": ("GET /query", True)})]
    fake = [_result("source_only", **{"bootstrap query": ("not probed (read from source)", False)})]
    (row,) = table.compare(fake, source)
    assert not row.compared and row.verdict.startswith("from source only")
    assert table.unexplained([row]) == []  # an actionable fact the fake cannot measure fails nothing
    assert "from source only" in table.render_markdown([row], "vLLM (from source)")
    assert row.to_json()["compared"] is False
