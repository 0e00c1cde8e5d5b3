"""KV store, side-channel framing, bootstrap answers, faults, records, identity and timing."""

from __future__ import annotations

import json
import re
import struct
import uuid

import pytest

from fake_engines.core import (
    EngineIdentity,
    FaultState,
    Frame,
    FrameDecoder,
    HandshakeRequest,
    HandshakeResponse,
    KvBlock,
    KvStore,
    PullRequest,
    PullResponse,
    TimingModel,
    WireError,
    build_query_answer,
    decode_message,
    dp_engine_id,
    encode_frame,
    fake_kv_bytes,
    find_engine_addr,
    find_tag,
    make_engine_id,
    make_record,
    n_blocks,
    parse_query_answer,
    parse_tcp_addr,
    rank_engine_ids,
    serve_handshake,
    serve_pull,
    wire,
)

# -- KV store ----------------------------------------------------------------------------------------------


def test_kv_store_pull_removes() -> None:
    store = KvStore(abort_timeout_s=10.0)
    block = store.allocate("xfer-1", "d1", 40, now=0.0)
    assert block == KvBlock("d1", 40, (0, 1, 2), 0.0)
    assert store.allocate("xfer-2", "d2", 1, now=0.0).block_ids == (3,)  # ids never reused
    assert store.pull("xfer-1", now=1.0) == block
    assert store.pull("xfer-1", now=1.0) is None
    assert len(store) == 1


def test_kv_store_expiry() -> None:
    store = KvStore(abort_timeout_s=10.0)
    store.allocate("a", "d", 16, now=0.0)
    store.allocate("b", "d", 16, now=5.0)
    assert store.pull("b", now=15.0) is None  # expired at pull time: gone, not served
    assert "a" in store and "b" not in store


def test_kv_store_bounded_evicts_oldest() -> None:
    store = KvStore(abort_timeout_s=100.0, max_entries=2)
    store.allocate("a", "d", 1, 0.0)
    store.allocate("b", "d", 1, 0.0)
    assert store.put("c", KvBlock("d", 1, (9,), 0.0)) == ["a"]
    assert len(store) == 2 and "a" not in store
    store.clear()
    assert len(store) == 0


def test_kv_store_bad_input() -> None:
    with pytest.raises(ValueError):
        KvStore(abort_timeout_s=0)
    with pytest.raises(ValueError):
        KvStore(max_entries=0)
    with pytest.raises(ValueError):
        KvStore().put("", KvBlock("d", 1, (0,), 0.0))


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 1), (1, 1), (16, 1), (17, 2), (33, 3)])
def test_n_blocks(tokens: int, blocks: int) -> None:
    assert n_blocks(tokens) == blocks


# -- wire --------------------------------------------------------------------------------------------------

MESSAGES = [
    PullRequest("eng-1", "xfer-1"),
    PullResponse(True, "0123456789abcdef", 12, None, "eng-1"),
    PullResponse(False, None, 0, "no KV held", "eng-1"),
    HandshakeRequest("eng-1"),
    HandshakeResponse(False, "eng-2", "mismatch"),
]


@pytest.mark.parametrize("msg", MESSAGES)
def test_message_round_trip(msg: object) -> None:
    frames = FrameDecoder().feed(msg.encode())  # type: ignore[attr-defined]
    assert len(frames) == 1
    assert decode_message(frames[0]) == msg


def test_decoder_handles_partial_reads_byte_by_byte() -> None:
    payload = fake_kv_bytes("abc", 10)
    stream = b"".join(m.encode() for m in MESSAGES) + MESSAGES[1].encode(payload)  # type: ignore[attr-defined]
    dec = FrameDecoder()
    got: list[Frame] = []
    for i in range(len(stream)):
        got.extend(dec.feed(stream[i : i + 1]))
    assert dec.pending == 0
    assert [decode_message(f) for f in got] == [*MESSAGES, MESSAGES[1]]
    assert got[-1].payload == payload and len(payload) == 640


def test_decoder_keeps_partial_tail() -> None:
    a, b = encode_frame({"type": "x", "n": 1}), encode_frame({"type": "y"}, b"pay")
    dec = FrameDecoder()
    frames = dec.feed(a + b[:5])
    assert frames == [Frame({"type": "x", "n": 1})]
    assert dec.pending == 5
    assert dec.feed(b[5:]) == [Frame({"type": "y"}, b"pay")]


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack(">II", wire.MAX_HEADER_BYTES + 1, 0),
        struct.pack(">II", 10, wire.MAX_PAYLOAD_BYTES + 1),
        struct.pack(">II", 3, 0) + b"{x}",
        struct.pack(">II", 2, 0) + b"[]",
        struct.pack(">II", 2, 0) + b"{}",
        struct.pack(">II", 2, 0) + b"\xff\xfe",
    ],
)
def test_decoder_rejects_bad_frames(raw: bytes) -> None:
    with pytest.raises(WireError):
        FrameDecoder().feed(raw)


@pytest.mark.parametrize(
    "header",
    [
        {"type": "nope"},
        {"type": "pull", "engine_id": 5, "transfer_key": "x"},
        {"type": "pull_result", "ok": "yes"},
        {"type": "pull_result", "ok": True, "n_tokens": -1},
        {"type": "handshake"},
        {"type": "handshake_result", "ok": True},
    ],
)
def test_decode_message_rejects_bad_fields(header: dict[str, object]) -> None:
    with pytest.raises(WireError):
        decode_message(Frame(header))


def test_encode_frame_bounds() -> None:
    with pytest.raises(WireError):
        encode_frame({"type": "x", "pad": "a" * wire.MAX_HEADER_BYTES})


def test_serve_pull_and_handshake() -> None:
    store = KvStore(abort_timeout_s=5.0)
    store.allocate("xfer-1", "d1", 20, now=0.0)
    wrong = serve_pull(store, PullRequest("eng-old", "xfer-1"), "eng-new", now=1.0)
    assert not wrong.ok and "mismatch" in (wrong.error or "")
    assert "xfer-1" in store  # a refused pull does not consume the KV
    ok = serve_pull(store, PullRequest("eng-new", "xfer-1"), "eng-new", now=1.0)
    assert ok == PullResponse(True, "d1", 20, None, "eng-new")
    again = serve_pull(store, PullRequest("eng-new", "xfer-1"), "eng-new", now=1.0)
    assert not again.ok and "no KV held" in (again.error or "")
    assert serve_handshake(HandshakeRequest("a"), "a") == HandshakeResponse(True, "a")
    refused = serve_handshake(HandshakeRequest("a"), "b")
    assert not refused.ok and refused.engine_id == "b"


def test_fake_kv_bytes_deterministic() -> None:
    assert fake_kv_bytes("d", 3, 10) == fake_kv_bytes("d", 3, 10)
    assert fake_kv_bytes("d", 3, 10) != fake_kv_bytes("e", 3, 10)
    assert len(fake_kv_bytes("d", 0)) == 0


# -- bootstrap ---------------------------------------------------------------------------------------------


def test_query_answer_shape_single_rank() -> None:
    answer = build_query_answer("eng", "127.0.0.1", [4567])
    assert answer == {"0": {"engine_id": "eng", "worker_addr": {"0": {"0": "tcp://127.0.0.1:4567"}}}}
    assert json.loads(json.dumps(answer)) == answer
    assert find_engine_addr(answer, "eng") == ("127.0.0.1", 4567)
    assert find_engine_addr(answer, "other") is None


def test_query_answer_dp_ranks() -> None:
    answer = build_query_answer("eng", "127.0.0.1", [4000, 4001])
    entries = parse_query_answer(answer)
    assert [(e.dp_rank, e.engine_id) for e in entries] == [(0, "eng_dp0"), (1, "eng_dp1")]
    assert find_engine_addr(answer, "eng_dp1") == ("127.0.0.1", 4001)
    with pytest.raises(ValueError):
        build_query_answer("eng", "127.0.0.1", [])


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"x": {"engine_id": "e", "worker_addr": {}}},
        {"0": {"worker_addr": {}}},
        {"0": {"engine_id": "e"}},
        {"0": {"engine_id": "e", "worker_addr": {"0": "tcp://h:1"}}},
        {"0": {"engine_id": "e", "worker_addr": {"0": {"0": "tcp://h:99999"}}}},
    ],
)
def test_parse_query_answer_rejects_malformed(answer: object) -> None:
    with pytest.raises(ValueError):
        parse_query_answer(answer)


@pytest.mark.parametrize("addr", ["http://h:1", "tcp://h", "tcp://:1", "tcp://h:x", "tcp://h:0", 5])
def test_parse_tcp_addr_rejects(addr: object) -> None:
    with pytest.raises(ValueError):
        parse_tcp_addr(addr)  # type: ignore[arg-type]


# -- faults ------------------------------------------------------------------------------------------------


def test_wedge_surfaces() -> None:
    f = FaultState()
    assert f.apply("wedge", {"surface": "metadata"}) == {"wedge": {"old": None, "new": ["metadata"]}}
    assert f.is_wedged("metadata") and f.is_wedged("server_info")
    assert not f.is_wedged("health") and not f.is_wedged("generate")
    assert f.apply("wedge", {"surface": "metadata"}) == {}  # no change
    f.apply("wedge", {})  # default: all
    assert all(f.is_wedged(s) for s in ("health", "generate", "side_channel"))
    assert f.as_dict() == {"wedge": ["all", "metadata"]}
    assert f.clear("wedge") == {"wedge": {"old": ["all", "metadata"], "new": None}}
    assert not f.is_wedged("health")
    f.apply("wedge", {"surface": "server_info"})
    assert f.is_wedged("server_info") and not f.is_wedged("metadata")


def test_gate_delay_with_and_without_faults() -> None:
    f = FaultState()
    surfaces = ("health", "metadata", "server_info", "generate", "side_channel", "all")
    assert [f.gate_delay(s) for s in surfaces] == [0.0] * len(surfaces)
    with pytest.raises(ValueError, match="unknown surface"):
        f.gate_delay("nowhere")  # refused with no fault set too
    f.apply("latency", {"surface": "metadata", "ms": 300})
    assert f.gate_delay("server_info") == pytest.approx(0.3) and f.gate_delay("generate") == 0.0
    f.apply("wedge", {"surface": "generate"})
    assert f.gate_delay("generate") is None and f.gate_delay("metadata") == pytest.approx(0.3)
    with pytest.raises(ValueError, match="unknown surface"):
        f.gate_delay("nowhere")
    f.clear_all()
    assert [f.gate_delay(s) for s in surfaces] == [0.0] * len(surfaces)


def test_fail_requests_counts_down() -> None:
    f = FaultState()
    changed = f.apply_spec({"fault": "fail_requests", "count": 2, "status": 503})
    assert changed == {"fail_requests": {"old": None, "new": {"count": 2, "status": 503}}}
    assert [f.take_failure(), f.take_failure(), f.take_failure()] == [503, 503, None]
    assert f.as_dict() == {}
    f.apply("fail_requests", {})
    assert f.take_failure() == 500


def test_latency_and_flags() -> None:
    f = FaultState()
    f.apply("latency", {"surface": "health", "ms": 200})
    f.apply("latency", {"surface": "all", "ms": 50})
    assert f.latency_s("health") == pytest.approx(0.2)
    assert f.latency_s("generate") == pytest.approx(0.05)
    f.apply("latency", {"surface": "metadata", "ms": 300})
    assert f.latency_s("server_info") == pytest.approx(0.3)
    assert f.apply("latency", {"surface": "health", "ms": 0})["latency"]["new"] == {
        "all": 50.0,
        "metadata": 300.0,
    }
    f.apply("fail_server_info")
    f.apply("no_engine_id")
    assert f.fail_server_info and f.no_engine_id
    changed = f.clear_all()
    assert set(changed) == {"latency", "fail_server_info", "no_engine_id"}
    assert f.as_dict() == {} and not f.fail_server_info and f.latency_s("health") == 0.0
    assert f.clear_all() == {}


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("explode", {}, "unknown fault kind 'explode'"),
        ("wedge", {"surface": "disk"}, "surface must be one of"),
        ("fail_requests", {"count": 0}, "count must be >= 1"),
        ("fail_requests", {"count": "3"}, "count must be an integer"),
        ("fail_requests", {"count": True}, "count must be an integer"),
        ("fail_requests", {"count": 1, "status": 200}, "status must be in [400, 599]"),
        ("latency", {"surface": "health"}, "ms must be a number"),
        ("latency", {"surface": "health", "ms": -5}, "ms must be >= 0"),
        ("latency", {"surface": "health", "ms": float("nan")}, "ms must be >= 0"),
    ],
)
def test_bad_fault_input_is_rejected_without_change(
    kind: str, params: dict[str, object], message: str
) -> None:
    f = FaultState()
    with pytest.raises(ValueError, match=re.escape(message)):
        f.apply(kind, params)
    assert f.as_dict() == {}


def test_bad_fault_specs_and_queries() -> None:
    f = FaultState()
    for spec in ({}, {"fault": 3}, "wedge"):
        with pytest.raises(ValueError):
            f.apply_spec(spec)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        f.apply("wedge", ["all"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        f.clear("explode")
    with pytest.raises(ValueError):
        f.is_wedged("disk")
    with pytest.raises(ValueError):
        f.latency_s("disk")


# -- records -----------------------------------------------------------------------------------------------

RECORD_KEYS = set(
    [
        "ts",
        "engine",
        "engine_id",
        "generation",
        "role",
        "kind",
        "request_id",
        "tag",
        "connector",
        "transfer_id",
        "remote_engine_id",
        "remote_request_id",
        "prompt_digest",
        "kv_digest",
        "outcome",
        "error",
        "duration_s",
        "output_digest",
    ]
)


def test_make_record_has_exactly_the_contract_keys() -> None:
    rec = make_record(
        ts=1.5, engine="d0", engine_id="e", generation=2, role="decode", kind="decode", request_id="r",
        tag="[pdchaos:r:1]", connector="mooncake", prompt_digest="p", outcome="pulled", duration_s=0.1,
        output_digest="o", transfer_id="xfer-1", remote_engine_id="e0", kv_digest="p",
    )  # fmt: skip
    # The contract's keys plus its compatible extensions (where a decode pulled from, as which engine; the
    # leg's shape).
    assert set(rec) == RECORD_KEYS | {"peer", "peer_engine_id", "leg"}
    assert rec["leg"] is None
    assert rec["remote_request_id"] is None and rec["error"] is None
    assert json.loads(json.dumps(rec)) == rec


@pytest.mark.parametrize(("field", "value"), [("role", "router"), ("kind", "remote"), ("outcome", "ok")])
def test_make_record_rejects_bad_enums(field: str, value: str) -> None:
    args: dict[str, object] = dict(
        ts=0.0, engine="e", engine_id="e", generation=1, role="both", kind="local", request_id="r", tag=None,
        connector="none", prompt_digest="p", outcome="computed", duration_s=0.0, output_digest=None,
    )  # fmt: skip
    args[field] = value
    with pytest.raises(ValueError):
        make_record(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "tag"),
    [
        ("[pdchaos:run:1] hello", "[pdchaos:run:1]"),
        ("prefix [pdchaos:a:b:c] and [pdchaos:x:2]", "[pdchaos:a:b:c]"),
        ("[pdchaos:] empty", None),
        ("[pdchaos:unterminated", None),
        ("no tag", None),
    ],
)
def test_find_tag(text: str, tag: str | None) -> None:
    assert find_tag(text) == tag


# -- identity & timing -------------------------------------------------------------------------------------


def test_engine_ids() -> None:
    fixed = uuid.UUID(int=7)
    assert make_engine_id(None, lambda: fixed) == str(fixed)
    assert make_engine_id("pinned") == "pinned"
    assert make_engine_id() != make_engine_id()
    with pytest.raises(ValueError):
        make_engine_id("  ")
    assert dp_engine_id("e", 3) == "e_dp3"
    assert rank_engine_ids("e", 1) == ["e"]
    assert rank_engine_ids("e", 2) == ["e_dp0", "e_dp1"]
    with pytest.raises(ValueError):
        rank_engine_ids("e", 0)
    with pytest.raises(ValueError):
        dp_engine_id("e", -1)


def test_identity_restart_and_uptime() -> None:
    first = EngineIdentity.first(now=100.0)
    assert first.generation == 1 and first.uptime_s(110.0) == 10.0 and first.uptime_s(90.0) == 0.0
    second = first.restarted(now=200.0)
    assert second.generation == 2 and second.engine_id != first.engine_id
    assert second.uptime_s(201.0) < first.uptime_s(201.0)  # uptime goes backwards across a restart
    pinned = second.restarted(now=300.0, pinned="fixed")
    assert (pinned.engine_id, pinned.generation) == ("fixed", 3)


def test_timing_model() -> None:
    t = TimingModel(ttft_ms=10, ttft_per_token_ms=1, itl_ms=2)
    assert t.ttft_s(0) == pytest.approx(0.010)
    assert t.ttft_s(100) == pytest.approx(0.110)
    assert t.itl_s() == pytest.approx(0.002)
    with pytest.raises(ValueError):
        TimingModel(itl_ms=-1)
