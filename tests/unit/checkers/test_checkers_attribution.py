"""Which side a bad handoff is on (`harness.checkers.attribution`), and the checkers that say so."""

from __future__ import annotations

from typing import Any

from test_checkers_builders import HB, WALL0

from harness.checkers import HandoffExpect, check_handoff, check_output, check_transfer_timeout
from harness.checkers.attribution import blame


def _record(hb: HB, t: float, kind: str, tag: str, **fields: Any) -> None:
    rec: dict[str, Any] = {
        "ts": WALL0 + t, "engine": "prefill-0" if kind == "prefill" else "decode-0", "engine_id": "A",
        "generation": 1, "role": kind, "kind": kind, "request_id": f"r-{tag}", "tag": tag,
        "connector": "mooncake", "transfer_id": f"x-{tag}", "remote_engine_id": None,
        "remote_request_id": None, "prompt_digest": f"p-{tag}", "kv_digest": None, "outcome": "computed",
        "error": None, "duration_s": 0.01, "output_digest": "o",
    }
    rec.update(fields)
    hb.at(t).handoff(rec)


def _pd(hb: HB, t: float, late_s: float = 0.01, **decode: Any) -> str:
    """A request whose prefill computed at t and whose decode (fields overridden) ended at t + late_s."""
    tag = hb.request(t, late_s + 0.02, status=200 if decode.get("outcome", "pulled") == "pulled" else 500,
                     text_ok=decode.pop("text_ok", True))
    _record(hb, t, "prefill", tag)
    fields = {"engine_id": "D", "remote_engine_id": "A", "kv_digest": f"p-{tag}", "outcome": "pulled",
              "duration_s": late_s, "peer": "127.0.0.1:4000", "peer_engine_id": "A", **decode}
    _record(hb, t + late_s, "decode", tag, **fields)
    return tag


def _history(hb: HB) -> Any:
    hb.engine(0.0, "prefill-0", "A", "prefill")
    hb.engine(0.0, "decode-0", "D", "decode")
    return hb.history()


def test_another_prompts_kv_with_the_right_parameters_is_the_engines_fault() -> None:
    hb = HB(settings={"engines": {"kv_abort_timeout_s": 0.3}})
    other = _pd(hb, 1.5)
    tag = _pd(hb, 1.0, late_s=0.8, kv_digest=f"p-{other}", text_ok=False, duration_s=0.01)
    h = _history(hb)
    v = check_handoff(h, HandoffExpect(grace_s=0.0))
    assert v.status == "fail" and v.numbers["sides"] == {"engine": 1}
    (ev,) = v.evidence
    assert ev["tag"] == tag and ev["side"] == "engine"
    assert f"the KV of {other}" in ev["why"] and "past the KV abort timeout (0.3 s)" in ev["why"]
    assert "the one the router minted, in force then" in ev["why"]
    out = check_output(h)
    assert out.status == "fail" and "engine side: 1" in out.reason
    assert out.evidence[0].startswith("2 ") and "engine side:" in out.evidence[0]


def test_a_transfer_of_another_request_is_the_routers_fault() -> None:
    hb = HB()
    other = _pd(hb, 1.0)
    _pd(hb, 2.0, transfer_id=f"x-{other}", kv_digest=f"p-{other}", text_ok=False)
    v = check_handoff(_history(hb), HandoffExpect(grace_s=0.0))
    (ev,) = v.evidence
    assert ev["side"] == "router" and f"which prefill-0 computed for {other}" in ev["why"]


def test_a_stale_engine_id_is_the_routers_fault() -> None:
    hb = HB()
    _pd(hb, 1.0, remote_engine_id="OLD", outcome="timed_out", kv_digest=None, peer_engine_id="OLD")
    v = check_handoff(_history(hb), HandoffExpect(grace_s=0.0))
    assert {e["problem"] for e in v.evidence} == {"timed_out", "stale_engine_id"}
    assert {e["side"] for e in v.evidence} == {"router"} and "router side: 2" in v.reason


def test_a_pull_from_a_peer_cached_for_another_engine_id_is_the_engines_fault() -> None:
    hb = HB(settings={"transfer_timeout_s": 2.0})
    hb.engine(0.0, "prefill-0", "OLD", "prefill")
    tag = _pd(hb, 3.0, late_s=2.0, outcome="timed_out", kv_digest=None, peer_engine_id="OLD",
              peer="127.0.0.1:40000")
    h = _history(hb)
    v = check_handoff(h, HandoffExpect(grace_s=0.0))
    (ev,) = v.evidence
    assert ev["side"] == "engine" and "pulled from the peer it had cached as OLD" in ev["why"]
    assert "127.0.0.1:40000" in ev["why"]
    tt = check_transfer_timeout(h)
    assert tt.status == "fail" and "engine side: 1" in tt.reason and tag in tt.evidence[0]


def test_a_pull_lost_to_a_graceful_stop_is_the_engines_fault_and_to_a_crash_nobodys() -> None:
    for kind, killed, side in (("graceful_stop", False, "engine"), ("graceful_stop", True, "fault"),
                               ("crash", False, "fault")):
        hb = HB()
        hb.at(1.05).fault_applied("stop", kind, "prefill-0", {}, {})
        hb.at(1.06).fault_verified("stop", True, {"health": "ok:503"})
        hb.at(1.1).note("graceful stop of prefill-0 ended", fault="stop", engine="prefill-0",
                        exited_after_s=0.01, killed_after_grace=killed)
        _pd(hb, 1.0, late_s=0.4, outcome="failed", kv_digest=None)
        v = check_handoff(_history(hb), HandoffExpect(grace_s=0.0, excuse_kinds=(), excuse_in_flight=False))
        (ev,) = v.evidence
        assert ev["side"] == side, (kind, killed, ev)
        if side == "engine":
            assert "stopped gracefully at t=1.05 (stop) and exited 0.01 s later" in ev["why"]


def test_without_a_prefill_record_the_side_is_unknown() -> None:
    hb = HB()
    tag = hb.request(1.0, 0.05, status=500, text_ok=None)
    _record(hb, 1.02, "decode", tag, engine_id="D", remote_engine_id="A", outcome="failed")
    h = _history(hb)
    (d,) = [x for x in h.handoffs if x.kind == "decode"]
    assert blame(h, d, "failed").side == "unknown"


def test_a_pull_across_a_faulted_side_channel_is_the_faults_even_when_it_began_before() -> None:
    """A partition applied before the prefill computed is still in force while the decode pulls."""
    for link, side in (("side_channel", "fault"), ("bootstrap", "fault"), ("serve", "unknown")):
        hb = HB()
        hb.at(0.5).fault_applied("cut", "partition", "prefill-0", {"link": link}, {}, link=link)
        hb.at(0.5).fault_verified("cut", True, {"probe": "silent"})
        _pd(hb, 1.0, late_s=2.0, outcome="timed_out", kv_digest=None)
        hb.at(3.5).fault_healed("cut", "partition", "prefill-0")
        h = _history(hb)
        (d,) = [x for x in h.handoffs if x.kind == "decode"]
        b = blame(h, d, "timed_out")
        assert b.side == side, (link, b)
        if side == "fault":
            assert f"prefill-0's {link} link had fault cut (partition) from t=0.50 to t=3.50" in b.why
        else:
            assert "no fault on it" in b.why
