"""Behaviour of the fake engines' core that mutation testing (bench/mutation.py) showed no other test pinned:
each test kills mutants that survived the rest of tests/unit/engines."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fake_engines.core import (
    DEFAULT_MAX_TOKENS,
    Action,
    EngineConfig,
    EngineIdentity,
    EngineState,
    FaultState,
    Finish,
    Frame,
    FrameDecoder,
    GenRequest,
    Handshake,
    HandshakeCache,
    HandshakeRequest,
    HandshakeResponse,
    KvBlock,
    KvStore,
    MooncakeDecodePlan,
    NixlDecodePlan,
    Outcome,
    PullFrom,
    PullRequest,
    PullResponse,
    QueryBootstrap,
    Reject,
    RequestError,
    RequestFlow,
    Sleep,
    TimingModel,
    WaitUntil,
    WireError,
    answer_frame,
    build_query_answer,
    decode,
    decode_message,
    encode,
    encode_frame,
    engine_timing,
    expected_completion,
    fake_kv_bytes,
    find_engine_addr,
    generate_text,
    max_tokens_problem,
    nixl_prefill_params,
    parse_tcp_addr,
    prefill_transfer_key,
    prompt_digest,
    render_chat,
    serve_handshake,
    serve_pull,
    vocab_size,
)
from fake_engines.core.chat import message_text
from fake_engines.core.gen_request import (
    MAX_MODEL_LEN,
    budget_problem,
    encode_bounded,
    gen_request_from_openai,
    parse_kv_params,
)
from fake_engines.core.wire import MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES

PROMPT = "[pdchaos:t:1] hello there"


def seeded_ids() -> Iterator[uuid.UUID]:
    n = 0
    while True:
        n += 1
        yield uuid.UUID(int=n)


def make_state(role: str = "both", connector: str = "none", now: float = 0.0, **fields: Any) -> EngineState:
    base: dict[str, Any] = {"name": "e0", "ttft_ms": 20.0, "itl_ms": 5.0, "transfer_timeout_s": 3.0}
    base.update(fields)
    ids = seeded_ids()
    return EngineState(EngineConfig(role=role, connector=connector, **base),  # type: ignore[arg-type]
                       now=now, new_id=lambda: next(ids))


# ---- gen_request: OpenAI bodies -> the engine's request ----------------------------------------------------


def test_completion_body_defaults() -> None:
    req, stream = gen_request_from_openai({"prompt": PROMPT}, False, "r1", None)
    leg = {"stream": False}  # the shape as told: no max_tokens, whatever the default
    assert req == GenRequest("r1", PROMPT, encode(PROMPT), DEFAULT_MAX_TOKENS, None, None, leg)
    assert stream is False


def test_completion_body_fields() -> None:
    body = {"prompt": PROMPT, "max_tokens": 3, "seed": 9, "stream": True, "n": 1,
            "kv_transfer_params": {"do_remote_decode": True}}
    req, stream = gen_request_from_openai(body, False, "r1", 5)
    assert (req.max_tokens, req.seed, req.kv_params, stream) == (3, 9, {"do_remote_decode": True}, True)
    assert gen_request_from_openai({"prompt": PROMPT}, False, "r1", 5)[0].seed == 5  # the engine's default
    null_max = gen_request_from_openai({"prompt": PROMPT, "max_tokens": None}, False, "r", None)[0]
    assert null_max.max_tokens == DEFAULT_MAX_TOKENS


def test_completion_prompts_batches_of_one_and_token_ids() -> None:
    ids = encode(PROMPT)
    for prompt in ([PROMPT], ids, [ids]):
        req, _ = gen_request_from_openai({"prompt": prompt}, False, "r1", None)
        assert (req.prompt_text, req.prompt_ids) == (PROMPT, ids)


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": 5},
        {"prompt": []},
        {"prompt": [True, 2]},
        {"prompt": ["a", "b"]},
        {"prompt": [10**9]},
        {"prompt": [-1]},
        {"prompt": PROMPT, "max_tokens": "3"},
        {"prompt": PROMPT, "max_tokens": True},
        {"prompt": PROMPT, "seed": 1.5},
        {"prompt": PROMPT, "stream": "yes"},
        {"prompt": PROMPT, "n": 2},
        {"prompt": PROMPT, "kv_transfer_params": [1]},
    ],
)
def test_bad_completion_bodies_are_400(body: dict[str, Any]) -> None:
    # (The messages are the shared OpenAI request checks' business; only the refusal is pinned here.)
    with pytest.raises(RequestError) as exc:
        gen_request_from_openai(body, False, "r1", None)
    assert exc.value.status == 400 and exc.value.err_type == "BadRequestError"
    assert exc.value.message and str(exc.value) == exc.value.message


def test_token_id_prompts_are_bounded_by_the_vocabulary() -> None:
    assert gen_request_from_openai({"prompt": [0, 5]}, False, "r1", None)[0].prompt_ids == [0, 5]
    with pytest.raises(RequestError) as exc:
        gen_request_from_openai({"prompt": [vocab_size()]}, False, "r1", None)
    assert exc.value.status == 400


def test_chat_body() -> None:
    messages = [{"role": "user", "content": "hi"}]
    req, _ = gen_request_from_openai({"messages": messages, "max_tokens": 3}, True, "r1", None)
    assert (req.prompt_text, req.prompt_ids, req.max_tokens) == (render_chat(messages),
                                                                 encode(render_chat(messages)), 3)
    both = {"messages": messages, "max_tokens": 3, "max_completion_tokens": 6}
    assert gen_request_from_openai(both, True, "r1", None)[0].max_tokens == 6
    null = {"messages": messages, "max_tokens": 3, "max_completion_tokens": None}
    assert gen_request_from_openai(null, True, "r1", None)[0].max_tokens == 3
    with pytest.raises(RequestError, match="messages must be a non-empty list") as exc:
        gen_request_from_openai({"messages": []}, True, "r1", None)
    assert exc.value.status == 400


def test_max_tokens_problem_boundary() -> None:
    assert max_tokens_problem(0) == "max_tokens must be at least 1"
    assert max_tokens_problem(1) is None


# ---- chat rendering ----------------------------------------------------------------------------------------


def test_message_text_parts() -> None:
    assert message_text(None) == ""
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    for bad in (["x"], [{"type": "image", "text": "a"}], [{"type": "text", "text": 5}]):
        with pytest.raises(ValueError, match="only text content parts are supported"):
            message_text(bad)


def test_render_chat_rejects_non_lists_and_bad_roles() -> None:
    for bad in (5, "hi", []):
        with pytest.raises(ValueError, match="messages must be a non-empty list"):
            render_chat(bad)  # type: ignore[arg-type]
    for role in (5, ""):
        with pytest.raises(ValueError, match="needs a string 'role'"):
            render_chat([{"role": role, "content": "x"}])


# ---- bootstrap ---------------------------------------------------------------------------------------------


def test_parse_tcp_addr_ipv6_and_port_bounds() -> None:
    assert parse_tcp_addr("tcp://[::1]:5000") == ("[::1]", 5000)
    assert parse_tcp_addr("tcp://h:1") == ("h", 1)
    assert parse_tcp_addr("tcp://h:65535") == ("h", 65535)
    with pytest.raises(ValueError, match="bad tcp:// address"):
        parse_tcp_addr("tcp://h:65536")


def answer_with(workers: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"0": {"engine_id": "e", "worker_addr": workers}}


def test_find_engine_addr_prefers_tp0_pp0_else_the_lowest() -> None:
    both = answer_with({"0": {"1": "tcp://h:2", "0": "tcp://h:1"}})
    assert find_engine_addr(both, "e") == ("h", 1)
    no_origin = answer_with({"1": {"0": "tcp://h:3"}, "0": {"1": "tcp://h:2"}})
    assert find_engine_addr(no_origin, "e") == ("h", 2)
    assert find_engine_addr(answer_with({}), "e") is None
    assert find_engine_addr(build_query_answer("e", "h", [7]), "other") is None


# ---- engine state ------------------------------------------------------------------------------------------


def test_engine_timing_from_config() -> None:
    assert engine_timing(EngineConfig(ttft_ms=20.0, itl_ms=7.0)) == TimingModel(20.0, 0.05, 7.0)
    assert engine_timing(EngineConfig(ttft_ms=0.5, itl_ms=1.0)) == TimingModel(0.5, 0.05, 1.0)
    assert engine_timing(EngineConfig(ttft_ms=0.0, itl_ms=1.0)) == TimingModel(0.0, 0.0, 1.0)


def test_a_fresh_state() -> None:
    s = EngineState(EngineConfig(engine_id="pinned"))
    assert (s.engine_id, s.identity.generation, s.identity.started_at) == ("pinned", 1, 0.0)
    assert (s.side_channel_ports, s.active, s.served, s.prompt_tokens_total, s.generation_tokens_total,
            s.outcome_counts, s.last_receive, s.dead) == ([], 0, 0, 0, 0, {}, 0.0, False)
    assert make_state(now=5.0).identity.started_at == 5.0


def test_records_reach_the_sink_given_at_construction() -> None:
    seen: list[dict[str, Any]] = []
    s = EngineState(EngineConfig(), on_record=seen.append)
    assert s.add_record(1.0, **record_fields()) is seen[0]


def test_config_with_changes_a_copy() -> None:
    base = EngineConfig()
    changed = base.with_(name="x", ttft_ms=1.0)
    assert (changed.name, changed.ttft_ms, base.name, base.ttft_ms) == ("x", 1.0, "engine", 20.0)


def test_start_keeps_a_pinned_id() -> None:
    s = make_state(engine_id="pin")
    s.start(3.0)
    assert (s.engine_id, s.identity.started_at) == ("pin", 3.0)


def test_start_mints_the_id_then_and_restart_keeps_the_pin() -> None:
    s = make_state()
    s.start(7.0)
    assert (s.engine_id, s.identity.started_at, s.identity.generation) == (str(uuid.UUID(int=2)), 7.0, 1)
    s.restart(9.0)
    assert (s.engine_id, s.identity.generation) == (str(uuid.UUID(int=3)), 2)  # from the seeded source
    pinned = make_state(engine_id="pin")
    pinned.die()
    pinned.restart(1.0)
    assert (pinned.engine_id, pinned.dead) == ("pin", False)
    pinned.restart(2.0, engine_id="other")
    assert pinned.engine_id == "other"


def test_bootstrap_answer_advertises_the_bound_port_without_a_proxy() -> None:
    s = make_state("prefill", "mooncake")
    s.side_channel_ports = [4000]
    assert s.bootstrap_answer()["0"]["worker_addr"] == {"0": {"0": "tcp://127.0.0.1:4000"}}
    p = make_state("prefill", "mooncake", advertise_side_channel_port=5000)
    p.side_channel_ports = [4000]
    assert p.bootstrap_answer()["0"]["worker_addr"] == {"0": {"0": "tcp://127.0.0.1:5000"}}


def test_side_channel_answers_handshakes() -> None:
    s = make_state("prefill", "nixl")
    assert s.answer_side_channel(HandshakeRequest("me"), "me", 0.0) == HandshakeResponse(True, "me")
    with pytest.raises(WireError):
        s.answer_side_channel(HandshakeResponse(True, "me"), "me", 0.0)


def test_nixl_prefill_params_carry_the_host() -> None:
    s = make_state("prefill", "nixl", host="10.0.0.5", nixl_port=6000)
    params = s.prefill_params("r1", [0, 1])
    assert params == nixl_prefill_params(s.engine_id, "10.0.0.5", 6000, [0, 1], "r1")
    assert params["tp_size"] == 1 and params["remote_host"] == "10.0.0.5"


def record_fields(outcome: str = "computed") -> dict[str, Any]:
    return {"kind": "local", "request_id": "r", "tag": None, "prompt_digest": "d", "outcome": outcome,
            "duration_s": 0.0, "output_digest": None}


def test_records_carry_the_engine_and_are_counted() -> None:
    seen: list[dict[str, Any]] = []
    s = make_state("decode", "nixl")
    s.on_record = seen.append
    s.restart(1.0)
    r1 = s.add_record(100.0, **record_fields())
    s.add_record(101.0, **record_fields())
    assert (r1["engine"], r1["generation"], r1["connector"], r1["role"], r1["ts"]) == ("e0", 2, "nixl",
                                                                                       "decode", 100.0)
    assert s.outcome_counts == {"computed": 2} and len(seen) == 2
    assert s.records_since(-3) == (s.records, 2)
    assert s.records_since(1) == ([s.records[1]], 2)
    assert s.records_since(2) == ([], 2)


def test_count_served_accumulates() -> None:
    s = make_state()
    s.count_served(10, 3)
    s.count_served(5, 2)
    assert (s.served, s.prompt_tokens_total, s.generation_tokens_total) == (2, 15, 5)


# ---- faults ----------------------------------------------------------------------------------------------


def test_fault_flags_are_booleans() -> None:
    f = FaultState()
    assert f.fail_server_info is False and f.no_engine_id is False
    f.apply("fail_server_info")
    f.apply("no_engine_id")
    f.clear("fail_server_info")
    f.clear("no_engine_id")
    assert f.fail_server_info is False and f.no_engine_id is False


def test_fail_requests_defaults_bounds_and_clear() -> None:
    f = FaultState()
    f.apply("fail_requests")
    assert [f.take_failure(), f.take_failure()] == [500, None]  # one request, status 500
    f.apply("fail_requests", {"count": 3, "status": 599})
    assert f.clear("fail_requests") == {"fail_requests": {"old": {"count": 3, "status": 599}, "new": None}}
    assert f.take_failure() is None
    with pytest.raises(ValueError, match="status must be in"):
        f.apply("fail_requests", {"status": 600})


def test_latency_defaults_to_every_surface_and_zero_removes_quietly() -> None:
    f = FaultState()
    f.apply("latency", {"ms": 100})
    assert f.latency_s("generate") == 0.1 and f.latency_s("health") == 0.1
    assert f.apply("latency", {"surface": "health", "ms": 0}) == {}
    assert f.as_dict() == {"latency": {"all": 100.0}}


# ---- identity, kv store, timing, generator ---------------------------------------------------------------


def test_identity_pin_and_factory() -> None:
    first = EngineIdentity.first(1.0, "pin")
    assert first.engine_id == "pin"
    again = first.restarted(2.0, None, lambda: uuid.UUID(int=9))
    assert (again.engine_id, again.generation, again.started_at) == (str(uuid.UUID(int=9)), 2, 2.0)


def test_kv_store_defaults_and_bounds() -> None:
    s = KvStore()
    assert (s.abort_timeout_s, s.max_entries) == (480.0, 4096)
    assert KvStore(abort_timeout_s=0.5, max_entries=1).max_entries == 1


def test_kv_store_allocates_fresh_blocks_of_its_size() -> None:
    s = KvStore(block_size=4)
    assert s.allocate("a", "d", 9, 0.0).block_ids == (0, 1, 2)
    assert s.allocate("b", "d", 5, 0.0).block_ids == (3, 4)
    assert s.allocate("c", "d", 1, 0.0).block_ids == (5,)


def test_kv_store_put_again_makes_the_entry_newest() -> None:
    s = KvStore(max_entries=2)
    block = KvBlock("d", 1, (0,), 0.0)
    for key in ("a", "b", "a"):
        assert s.put(key, block) == []
    assert s.put("c", block) == ["b"]
    assert "a" in s and "c" in s


def test_timing_accepts_zero() -> None:
    zero = TimingModel(ttft_ms=0.0, ttft_per_token_ms=0.0, itl_ms=0.0)
    assert zero.ttft_s(10) == 0.0 and zero.itl_s() == 0.0


def test_expected_completion_uses_the_seed() -> None:
    seeded = expected_completion(PROMPT, 6, seed=7)
    assert seeded == generate_text(prompt_digest(encode(PROMPT)), 6, 7)
    assert seeded != expected_completion(PROMPT, 6)


# ---- handoff plans -----------------------------------------------------------------------------------------


def test_prefill_transfer_key_needs_a_non_empty_string() -> None:
    assert prefill_transfer_key("mooncake", {"transfer_id": ""}, "r1") is None
    assert prefill_transfer_key("mooncake", {"transfer_id": 123}, "r1") is None
    assert prefill_transfer_key("mooncake", {"transfer_id": "x"}, "r1") == "x"


def mooncake(params: dict[str, Any] | None = None, now: float = 0.0, **kw: Any) -> MooncakeDecodePlan:
    p = {"transfer_id": "t", "remote_engine_id": "e", "remote_bootstrap_addr": "http://h:1/"}
    p.update(params or {})
    return MooncakeDecodePlan(p, "d", HandshakeCache(), "fail", now, 3.0, **kw)


def nixl(params: dict[str, Any] | None = None, now: float = 0.0, **kw: Any) -> NixlDecodePlan:
    p = {"remote_engine_id": "e", "remote_request_id": "r", "remote_host": "10.0.0.1", "remote_port": 7}
    p.update(params or {})
    return NixlDecodePlan(p, "d", HandshakeCache(), "fail", now, 3.0, **kw)


def test_mooncake_query_url_and_default_timeout() -> None:
    assert mooncake().next_step() == QueryBootstrap("http://h:1/query", 5.0)
    assert nixl().next_step() == Handshake("10.0.0.1", 7, "e", 5.0)


def test_mooncake_incomplete_params_name_what_is_missing() -> None:
    plan = mooncake({"transfer_id": "", "remote_engine_id": None})
    assert plan.transfer_id is None
    done = plan.next_step()
    assert done.error == "incomplete kv_transfer_params: ['transfer_id', 'remote_engine_id']"  # type: ignore
    assert mooncake({"transfer_id": 123}).next_step().outcome is Outcome.RECOMPUTED  # type: ignore[union-attr]


def test_mooncake_missing_bootstrap_addr_is_named() -> None:
    done = mooncake({"remote_bootstrap_addr": None}).next_step()
    assert done.error == "incomplete kv_transfer_params: ['remote_bootstrap_addr']"  # type: ignore


def test_a_short_transfer_timeout_is_allowed() -> None:
    plan = MooncakeDecodePlan({}, "d", HandshakeCache(), "fail", 10.0, 0.5)
    assert plan.deadline == 10.5


def test_mooncake_query_failures_fail_fast() -> None:
    answer = build_query_answer("e", "h", [9])
    plan = mooncake()
    plan.next_step()
    step = plan.on_query_result(answer, 1.0, error="HTTP 500")
    assert (step.outcome, step.error) == (Outcome.FAILED, "bootstrap query failed: HTTP 500")  # type: ignore
    plan = mooncake()
    plan.next_step()
    assert plan.on_query_result(None, 1.0).error == "bootstrap query failed: no answer"  # type: ignore


def test_pull_timeout_is_what_is_left_of_the_transfer() -> None:
    plan = mooncake()
    plan.next_step()
    step = plan.on_query_result(build_query_answer("e", "h", [9]), 2.5)
    assert step == PullFrom("h", 9, "e", "t", 0.5)


def pulling(plan: MooncakeDecodePlan | NixlDecodePlan) -> MooncakeDecodePlan | NixlDecodePlan:
    plan.cache.put("e", ("10.0.0.1", 7))
    assert isinstance(plan.next_step(), PullFrom)
    return plan


def test_a_pull_timeout_ends_timed_out_even_before_the_deadline() -> None:
    step = pulling(mooncake()).on_pull_result(None, 1.5, error="timeout")
    assert (step.outcome, step.error) == (Outcome.TIMED_OUT, "KV transfer timed out after 1.500s")  # type: ignore
    late = pulling(mooncake(now=10.0)).on_pull_result(None, 11.5, error="timeout")
    assert late.error == "KV transfer timed out after 1.500s"  # type: ignore[union-attr]


def test_a_transport_error_at_the_deadline_is_a_timeout() -> None:
    assert pulling(mooncake()).on_pull_result(None, 3.0, error="refused").outcome is Outcome.TIMED_OUT  # type: ignore
    assert pulling(mooncake()).on_pull_result(None, 1.0, error="refused") == WaitUntil(3.0)


def test_nixl_transport_errors_say_what_failed() -> None:
    step = pulling(nixl()).on_pull_result(None, 1.0, error="refused")
    assert (step.outcome, step.error) == (Outcome.FAILED, "NIXL read from 10.0.0.1:7 failed: refused")  # type: ignore
    step = pulling(nixl()).on_pull_result(None, 1.0)
    assert step.error == "NIXL read from 10.0.0.1:7 failed: transport error"  # type: ignore[union-attr]


def test_nixl_pull_goes_to_the_remote_host() -> None:
    plan = nixl()
    plan.next_step()
    step = plan.on_handshake_result(HandshakeResponse(True, "e"), 1.0)
    assert step == PullFrom("10.0.0.1", 7, "e", "r", 2.0)


@pytest.mark.parametrize("port", ["7", True, None])
def test_nixl_port_must_be_an_integer(port: Any) -> None:
    step = nixl({"remote_port": port}).next_step()
    assert (step.action, step.error) == (Action.FAIL, "incomplete kv_transfer_params for NIXL")  # type: ignore


# ---- request flow ----------------------------------------------------------------------------------------


def gen(kv: dict[str, Any] | None = None, seed: int | None = None, rid: str = "req-1") -> GenRequest:
    return GenRequest(rid, PROMPT, encode(PROMPT), 4, seed, kv)


def test_an_engine_without_connector_serves_every_request_locally() -> None:
    flow = RequestFlow(make_state(), gen({"do_remote_decode": True}))
    assert flow.kind.value == "local"


def test_active_counts_every_admitted_request() -> None:
    s = make_state()
    flows = [RequestFlow(s, gen(rid=f"r{i}")) for i in range(2)]
    for f in flows:
        f.on_gate_passed(0.0, 100.0)
    assert s.active == 2


def test_seeded_request_output_and_record() -> None:
    s = make_state()
    flow = RequestFlow(s, gen(seed=7))
    step = flow.on_gate_passed(0.0, 100.0)
    assert isinstance(step, Sleep)
    done = flow.on_slept(step.seconds, 100.0 + step.seconds)
    assert isinstance(done, Finish)
    assert done.result.text == expected_completion(PROMPT, 4, seed=7) and done.result.request_id == "req-1"
    rec = done.result.record
    assert rec["request_id"] == "req-1"
    assert rec["output_digest"] == prompt_digest(done.result.token_ids)
    assert decode(done.result.token_ids) == done.result.text


def test_abort_and_reject_error() -> None:
    flow = RequestFlow(make_state(), gen())
    r = flow.abort()
    assert (r.status, r.message, r.err_type) == (499, "request req-1 aborted", "RequestAborted")
    err = Reject(400, "m", "T").error()
    assert (err.status, err.message, err.err_type) == (400, "m", "T")


def decode_flow(connector: str, params: dict[str, Any], **cfg: Any) -> tuple[RequestFlow, Any]:
    flow = RequestFlow(make_state("decode", connector, **cfg), gen(params))
    return flow, flow.on_gate_passed(10.0, 1000.0)


def test_decode_failures_leave_a_record_stamped_now() -> None:
    _, step = decode_flow("nixl", {"do_remote_prefill": True})  # nothing to load from
    assert isinstance(step, Reject) and step.record is not None
    assert (step.record["ts"], step.record["duration_s"], step.record["request_id"]) == (1000.0, 0.0, "req-1")


MOONCAKE = {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "e",
            "remote_bootstrap_addr": "http://h:1"}
NIXL = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r",
        "remote_host": "10.0.0.1", "remote_port": 7}


def test_mooncake_query_uses_the_configured_timeout_and_reports_its_error() -> None:
    flow, step = decode_flow("mooncake", MOONCAKE, handshake_timeout_s=2.0)
    assert step == QueryBootstrap("http://h:1/query", 2.0)
    rej = flow.on_query_result(None, 11.0, 1001.0, error="refused")
    assert isinstance(rej, Reject) and rej.record is not None
    rec = rej.record
    assert (rec["ts"], rec["duration_s"], rec["error"]) == (1001.0, 1.0, "bootstrap query failed: refused")
    assert (rec["transfer_id"], rec["remote_engine_id"]) == ("t", "e")


def test_nixl_handshake_error_is_recorded() -> None:
    flow, step = decode_flow("nixl", NIXL)
    assert isinstance(step, Handshake)
    rej = flow.on_handshake_result(None, 11.0, 1001.0, error="refused")
    assert isinstance(rej, Reject) and rej.record is not None
    assert (rej.record["ts"], rej.record["duration_s"]) == (1001.0, 1.0)
    assert rej.record["error"] == "NIXL handshake with 10.0.0.1:7 failed: refused"


def test_pull_timeout_is_recorded_as_timed_out() -> None:
    flow, step = decode_flow("nixl", NIXL)
    step = flow.on_handshake_result(HandshakeResponse(True, "e"), 11.0, 1001.0)
    assert isinstance(step, PullFrom)
    rej = flow.on_pull_result(None, 12.0, 1002.0, error="timeout")
    assert isinstance(rej, Reject) and rej.record is not None
    assert (rej.record["outcome"], rej.record["ts"], rej.record["duration_s"]) == ("timed_out", 1002.0, 2.0)


def test_nixl_prefill_record_has_no_transfer_id() -> None:
    s = make_state("prefill", "nixl")
    flow = RequestFlow(s, gen({"do_remote_decode": True}))
    step = flow.on_gate_passed(0.0, 100.0)
    assert isinstance(step, Sleep)
    done = flow.on_slept(step.seconds, 100.0)
    assert isinstance(done, Finish) and done.result.record["transfer_id"] is None


# ---- wire ------------------------------------------------------------------------------------------------


def test_frames_are_compact_sorted_json() -> None:
    raw = b'{"a":2,"b":1,"type":"x"}'
    assert encode_frame({"type": "x", "b": 1, "a": 2}) == struct.pack(">II", len(raw), 0) + raw


def test_frame_size_bounds_are_inclusive() -> None:
    pad = MAX_HEADER_BYTES - len(b'{"p":"","type":"x"}')
    frame = encode_frame({"type": "x", "p": "a" * pad})
    assert FrameDecoder().feed(frame)[0].header["type"] == "x"
    with pytest.raises(WireError):
        encode_frame({"type": "x", "p": "a" * (pad + 1)})
    dec = FrameDecoder()
    assert dec.feed(struct.pack(">II", MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES)) == [] and dec.pending == 8


def roundtrip(data: bytes) -> Any:
    (frame,) = FrameDecoder().feed(data)
    return frame


def test_pull_result_defaults_and_types() -> None:
    assert roundtrip(PullResponse(False).encode()).payload == b""
    bare = decode_message(Frame({"type": "pull_result", "ok": True}))
    assert bare == PullResponse(True, None, 0, None, None)
    for n in (True, "3"):
        with pytest.raises(WireError):
            decode_message(Frame({"type": "pull_result", "ok": True, "n_tokens": n}))
    assert decode_message(Frame({"type": "handshake_result", "ok": True, "engine_id": "e"})) == (
        HandshakeResponse(True, "e", None))


def test_fake_kv_bytes_of_zero_width() -> None:
    assert fake_kv_bytes("d", 10, 0) == b""
    assert len(fake_kv_bytes("d", 10, 3)) == 30


def test_refusals_name_this_engine() -> None:
    store = KvStore()
    wrong = serve_pull(store, PullRequest("other", "k"), "me", 0.0)
    assert wrong.ok is False and wrong.engine_id == "me"
    missing = serve_pull(store, PullRequest("me", "k"), "me", 0.0)
    assert (missing.ok, missing.error, missing.engine_id) == (False, "no KV held for k", "me")
    hs = serve_handshake(HandshakeRequest("other"), "me")
    assert (hs.ok, hs.engine_id, hs.error) == (False, "me", "engine id mismatch: expected other, this is me")


def test_answer_frame_payloads() -> None:
    ok = roundtrip(answer_frame(PullResponse(True, "dig", 4, None, "me")))
    assert ok.payload == fake_kv_bytes("dig", 4) and len(ok.payload) == 4 * 64
    assert roundtrip(answer_frame(PullResponse(False, "dig", 4, "no", "me"))).payload == b""
    assert roundtrip(answer_frame(HandshakeResponse(True, "me"))).header == {
        "type": "handshake_result", "ok": True, "engine_id": "me", "error": None}


def test_a_prompt_the_engine_cannot_encode_is_a_400_that_says_why() -> None:
    with pytest.raises(RequestError) as lone:
        encode_bounded("ok \ud800 not")
    assert (lone.value.status, lone.value.message) == (
        400, "prompt is not valid Unicode text (a lone surrogate)"
    )
    with pytest.raises(RequestError) as huge:
        encode_bounded("x" * (MAX_MODEL_LEN * 1000))
    assert huge.value.status == 400
    assert huge.value.message.startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens")
    assert encode_bounded("hello") != []


def test_a_one_token_budget_is_allowed_and_bad_token_ids_or_params_are_400s() -> None:
    assert budget_problem([1, 2], 1) is None  # every prefill leg asks for exactly one token
    assert budget_problem([1], 0) == "max_tokens must be at least 1"
    req, stream = gen_request_from_openai({"prompt": "hi", "max_tokens": 1}, False, "r", None)
    assert (req.max_tokens, stream) == (1, False)
    with pytest.raises(RequestError) as out_of_range:
        gen_request_from_openai({"prompt": [10**9]}, False, "r", None)
    assert out_of_range.value.status == 400 and out_of_range.value.message.startswith("token id out of range")
    with pytest.raises(RequestError) as bad_params:
        parse_kv_params("x")
    assert (bad_params.value.status, bad_params.value.message) == (
        400, "kv_transfer_params must be an object"
    )


def test_the_engines_kv_store_takes_its_abort_timeout_and_bugs_from_the_config() -> None:
    s = EngineState(EngineConfig(kv_abort_timeout_s=7.5, bugs=frozenset({"kv_freed_while_read"})))
    assert (s.store.abort_timeout_s, s.store.bugs) == (7.5, frozenset({"kv_freed_while_read"}))
    assert s.draining is False
