"""History recorder and reader: records as in CONTRACTS.md section 3, joins, robustness to damaged files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_checkers_builders import HB, WALL0, restart_run

from harness.history import PER_REQUEST_TYPES, History, base_engine_id, load_history
from harness.history_writer import HistoryRecorder, ManualClock


def test_records_carry_t_from_the_given_clock_and_contract_fields(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    path = tmp_path / "h" / "history.jsonl"
    rec = HistoryRecorder(path, clock, wall_clock=lambda: WALL0)
    rec.run_started("s1", "1p1d", "nixl", "grpc", "reference", seed=3, settings={"a": 1})
    clock.advance(1.5)
    rec.request_invoked("r1", "[pdchaos:x:1]", stream=True, deadline_s=4.0, prompt_chars=12)
    clock.advance(0.25)
    rec.request_completed(
        "r1", "[pdchaos:x:1]", status=200, ok=True, latency_s=0.25, ttft_s=0.1, text_ok=True
    )
    rec.fault_applied("f1", "wedge", "decode-0", {"surface": "all"}, {"wedge": [None, "all"]})
    rec.fault_verified("f1", False, {"probe": "answered"})
    rec.fault_healed("f1", "wedge", "decode-0")
    rec.note("hello", step="x")
    rec.run_ended("done")
    rec.close()
    rec.note("after close is kept in memory only")

    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["type"] for x in lines] == [
        "run_started",
        "request_invoked",
        "request_completed",
        "fault_applied",
        "fault_verified",
        "fault_healed",
        "note",
        "run_ended",
    ]
    assert lines[0]["t"] == 0.0 and lines[0]["wall_start"] == WALL0 and lines[0]["seed"] == 3
    assert lines[1]["t"] == 1.5 and lines[1]["stream"] is True and lines[1]["endpoint"] == "/v1/completions"
    assert lines[2]["t"] == 1.75
    done = lines[2]
    assert (done["status"], done["ok"], done["ttft_s"], done["text_ok"], done["timed_out"]) == (
        200,
        True,
        0.1,
        True,
        False,
    )
    assert lines[3]["params"] == {"surface": "all"}
    assert lines[6]["step"] == "x"
    # With a file, the per-request records are in the file and the view's typed objects only.
    assert rec.history().record_count == 9 and len(rec.records) == 7
    assert not {r["type"] for r in rec.records} & PER_REQUEST_TYPES


def test_reader_joins_requests_and_faults(tmp_path: Path) -> None:
    hb = restart_run(path=tmp_path / "h.jsonl")
    hb.flush().close()
    h = load_history(tmp_path / "h.jsonl")
    assert h.complete and h.run is not None and h.run["scenario"] == "restart"
    assert h.settings == {"engines": {"transfer_timeout_s": 3.0}}
    first = h.request_list()[0]
    assert first.req == 1 and first.completed and first.succeeded and first.invoked_t == pytest.approx(0.1)
    assert first.deadline_t == pytest.approx(5.1)
    f = h.faults["f1"]
    assert (f.kind, f.target, f.applied_t, f.healed_t, f.verified_ok) == (
        "restart",
        "prefill-0",
        2.0,
        2.5,
        True,
    )
    assert h.fault_windows() == [(f, 2.0, 2.5)]
    failed = [r for r in h.requests_started_in(2.0, 3.0)]
    assert failed and all(r.status == 503 and not r.succeeded for r in failed)
    # Same view whether read back from disk or taken from the recorder.
    assert h.requests == hb.history().requests


def test_status_timeline_engine_ids_and_target_mapping() -> None:
    h = restart_run().history()
    assert [p.status for p in h.status_timeline("w-p0")] == ["ready", "not_ready", "ready"]
    point = h.status_at("w-p0", 2.7)
    assert point is not None and point.status == "not_ready"
    assert h.status_at("w-p0", -1.0) is None
    assert h.first_status_after("w-p0", 2.5) == 3.0
    assert h.engine_id_at("prefill-0", 1.0) == "A"
    assert h.engine_id_at("prefill-0", 2.6) == "B"
    assert h.engine_id_at("prefill-0", -0.1) is None
    assert h.workers_for("prefill-0") == ["w-p0"]
    assert h.workers_for("w-d0") == ["w-d0"]
    assert h.workers_for("http://d0") == ["w-d0"]
    assert h.workers_for("nobody") == []
    assert h.engine_role("decode-0") == "decode"


def test_router_status_engine_extra_maps_target() -> None:
    hb = HB()
    hb.at(0.5).router_status("7", "http://127.0.0.1:9", "decode", "ready", "X", engine="decode-3")
    assert hb.history().workers_for("decode-3") == ["7"]


def test_handoffs_by_tag_and_wall_clock_mapping() -> None:
    hb = HB()
    tag = hb.request(1.0, 0.1)
    # Fetched late (t=3) but happened at engine wall time WALL0 + 1.05.
    hb.at(3.0).handoff(
        {"ts": WALL0 + 1.05, "engine": "decode-0", "kind": "decode", "tag": tag, "outcome": "pulled"}
    )
    h = hb.history()
    [ho] = h.handoffs_by_tag(tag)
    assert ho.t == 3.0 and ho.at == pytest.approx(1.05)
    assert h.handoffs_by_tag(None) == [] and h.handoffs_by_tag("[pdchaos:none]") == []
    assert h.handoffs_of("decode-0") == [ho]
    req = h.request_by_tag(tag)
    assert req is not None and req.req == 1


def test_router_event_keeps_its_own_type_as_event() -> None:
    hb = HB()
    hb.at(1.0).router_event({"type": "status_change", "worker": "w1", "from": "ready", "to": "not_ready"})
    hb.probe(1.2, "w1", ok=False)
    h = hb.history()
    assert [e.event for e in h.router_events] == ["status_change", "probe"]
    [probe] = h.router_events_of("probe")
    assert probe.get("ok") is False and probe.worker == "w1" and probe.at == pytest.approx(1.2)
    assert h.of_type("router_event")[0]["from"] == "ready"


def test_truncated_file_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    hb = restart_run(path=path, ended=False)
    hb.flush().close()
    whole = path.read_text()
    path.write_text(whole + '{"type": "request_invoked", "t": 9.0, "req": 99, "ta')  # killed mid-line
    h = load_history(path)
    assert not h.complete
    assert 99 not in h.requests
    assert len(h.requests) == len(hb.history().requests)


def test_garbage_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('[1, 2]\n{"type": "note"}\n{"t": 1.0}\n{"type": "note", "t": 1.0, "message": "m"}\n\n')
    h = load_history(path)
    assert h.bad_records == 3
    assert h.notes == [(1.0, "m")]
    assert h.end_t == 1.0 and not h.complete and h.run is None


def test_missing_file_raises_and_empty_file_is_empty(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_history(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    h = load_history(tmp_path / "empty.jsonl")
    assert isinstance(h, History) and not h.records and not h.complete and h.end_t == 0.0


def test_completion_without_invocation_still_has_a_start() -> None:
    h = History.from_records(
        [{"type": "request_completed", "t": 2.0, "req": "x", "status": 200, "ok": True, "latency_s": 0.5}]
    )
    r = h.requests["x"]
    assert r.start_t == 1.5 and r.invoked_t is None and r.deadline_t is None


def test_manual_clock_refuses_to_go_back() -> None:
    c = ManualClock(1.0)
    c.advance(0.5)
    assert c() == 1.5
    with pytest.raises(ValueError):
        c.set(1.0)


def test_base_engine_id_strips_dp_suffix() -> None:
    assert base_engine_id("abc_dp3") == "abc"
    assert base_engine_id("abc") == "abc"
    assert base_engine_id("") is None and base_engine_id(None) is None


def test_recorder_starts_a_fresh_file_unless_appending(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"type": "note", "t": 9.0, "message": "old run"}\n')
    with HistoryRecorder(path, ManualClock()) as rec:
        rec.note("new run")
    assert [n for _t, n in load_history(path).notes] == ["new run"]
    with HistoryRecorder(path, ManualClock(), append=True) as rec:
        rec.note("more")
    assert [n for _t, n in load_history(path).notes] == ["new run", "more"]


def test_a_view_copies_records_it_is_lent_and_holds_records_it_is_handed() -> None:
    lent = {"type": "note", "t": 1.0, "message": "m", "fault": "f1"}
    h = History.from_records([lent])
    lent["message"] = "changed later"
    assert h.notes == [(1.0, "m")] and h.records[0]["message"] == "m"

    handed = dict(lent)
    owned = History.from_records([handed, "not a record"], owned=True)
    assert owned.records[0] is handed and owned.bad_records == 1 and owned.record_count == 1


def test_per_request_records_live_as_typed_views_only() -> None:
    records = [
        {"type": "request_invoked", "t": 0.5, "req": 1, "tag": "[pdchaos:x:1]", "stream": False},
        {"type": "handoff", "t": 1.0, "engine": "decode-0", "tag": "[pdchaos:x:1]", "kind": "decode",
         "peer": "127.0.0.1:40000", "peer_engine_id": "e1"},
        {"type": "request_completed", "t": 1.2, "req": 1, "tag": "[pdchaos:x:1]", "status": 200, "ok": True},
        {"type": "note", "t": 1.3, "message": "end"},
    ]
    h = History.from_records(records, owned=True)
    assert [r["type"] for r in h.records] == ["note"] and h.record_count == 4 and h.end_t == 1.3
    ho = h.handoffs[0]
    assert (ho.peer, ho.peer_engine_id) == ("127.0.0.1:40000", "e1")
    assert h.requests[1].status == 200 and h.request_by_tag("[pdchaos:x:1]") is h.requests[1]
    assert h.handoffs_by_tag("[pdchaos:x:1]") == [ho]


def test_the_recorders_view_grows_with_its_records(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    rec = HistoryRecorder(tmp_path / "h.jsonl", clock)
    rec.request_invoked(1, "[pdchaos:x:1]", stream=False)
    assert rec.history().requests[1].invoked_t == 0.0 and rec.records == []
    clock.advance(1.0)
    rec.request_completed(1, "[pdchaos:x:1]", status=200, ok=True, latency_s=1.0)
    view = rec.history()
    assert view.requests[1].completed_t == 1.0 and view.record_count == 2
    rec.close()
    # The file holds every record; read back, it gives the same view.
    again = load_history(tmp_path / "h.jsonl")
    assert again.record_count == 2 and again.requests[1].status == 200


def test_the_recorders_view_shares_its_records() -> None:
    rec = HistoryRecorder(None, ManualClock(0.0))
    rec.router_event({"type": "probe", "worker": "w1", "ok": True})
    view = rec.history()
    assert view.records[0] is rec.records[0] and view.router_events[0].fields is rec.records[0]


def test_a_file_whose_records_come_before_run_started_still_places_them(tmp_path: Path) -> None:
    """A history put together by hand (records appended before the run's first line) is read once, and a
    wall-stamped record before run_started lands on the scenario clock by its wall_start."""
    path = tmp_path / "history.jsonl"
    lines = [
        {"type": "handoff", "t": 0.0, "ts": 1000.0 + 2.5, "engine": "prefill-0", "tag": "[x]"},
        "not json at all",
        {"type": "run_started", "t": 0.0, "wall_start": 1000.0, "scenario": "s"},
        {"type": "handoff", "t": 3.0, "ts": 1000.0 + 3.5, "engine": "decode-0", "tag": "[y]"},
    ]
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    h = load_history(path)
    assert h.wall_start == 1000.0
    assert [(x.engine, x.at) for x in h.handoffs] == [("prefill-0", 2.5), ("decode-0", 3.5)]
    assert h.bad_lines == [2] and h.record_count == 3
