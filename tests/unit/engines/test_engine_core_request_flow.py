"""The engine's request path as a sans-IO flow, driven with a fake clock and scripted results only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from fake_engines.core import (
    AwaitGate,
    EngineConfig,
    EngineState,
    Finish,
    FlowStep,
    GenRequest,
    Handshake,
    HandshakeResponse,
    PullFrom,
    PullRequest,
    PullResponse,
    QueryBootstrap,
    Reject,
    RequestFlow,
    Sleep,
    WaitUntil,
    build_query_answer,
    encode,
    eos_token_id,
    expected_completion,
    prompt_digest,
)
from fake_engines.core.generator import natural_length, seed_for_length

EPOCH = 1_700_000_000.0  # the fake wall clock: EPOCH + the fake monotonic clock
PREFILL_ID = "prefill-eng"
SIDE_PORT = 4567


class FakeClock:
    def __init__(self, now: float = 10.0) -> None:
        self.now = now

    @property
    def wall(self) -> float:
        return EPOCH + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def seeded_ids() -> Iterator[uuid.UUID]:
    n = 0
    while True:
        n += 1
        yield uuid.UUID(int=n)


def make_state(role: str = "both", connector: str = "none", **fields: Any) -> EngineState:
    base: dict[str, Any] = {"name": "e0", "ttft_ms": 20.0, "itl_ms": 5.0, "transfer_timeout_s": 3.0}
    base.update(fields)
    config = EngineConfig(role=role, connector=connector, **base)  # type: ignore[arg-type]
    ids = seeded_ids()
    return EngineState(config, now=0.0, new_id=lambda: next(ids))


def request(prompt: str = "[pdchaos:t:1] hello there", max_tokens: int = 4, **kv: Any) -> GenRequest:
    return GenRequest("req-1", prompt, encode(prompt), max_tokens, None, dict(kv) if kv else None)


def mooncake_decode_params(engine_id: str = PREFILL_ID, transfer_id: str = "xfer-1") -> dict[str, Any]:
    return {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": transfer_id,
        "remote_engine_id": engine_id,
        "remote_bootstrap_addr": "http://127.0.0.1:8998",
    }


def through_gate(flow: RequestFlow, clock: FakeClock) -> FlowStep:
    assert flow.next_step() == AwaitGate("generate")
    return flow.on_gate_passed(clock.now, clock.wall)


def sleep_through(flow: RequestFlow, step: FlowStep, clock: FakeClock) -> FlowStep:
    assert isinstance(step, Sleep)
    clock.advance(step.seconds)
    return flow.on_slept(clock.now, clock.wall)


# -- local and prefill -------------------------------------------------------------------------------------


def test_local_request_sleeps_ttft_then_finishes_with_record() -> None:
    seen: list[dict[str, Any]] = []
    state = make_state()
    state.on_record = seen.append
    clock = FakeClock()
    req = request()
    flow = RequestFlow(state, req)

    step = through_gate(flow, clock)
    assert step == Sleep(state.timing.ttft_s(len(req.prompt_ids)), "ttft")
    assert step.seconds > state.timing.itl_s()
    assert state.active == 1 and state.last_receive == clock.wall
    done = sleep_through(flow, step, clock)

    assert isinstance(done, Finish) and flow.finished
    r = done.result
    assert r.text == expected_completion(req.prompt_text, 4)
    assert (len(r.token_ids), r.finish_reason, r.kv_transfer_params) == (4, "length", None)
    assert r.itl_s == pytest.approx(0.005) and r.prompt_tokens == len(req.prompt_ids)
    rec = r.record
    assert (rec["kind"], rec["outcome"], rec["error"]) == ("local", "computed", None)
    assert rec["tag"] == "[pdchaos:t:1]"
    assert rec["ts"] == clock.wall and rec["duration_s"] == pytest.approx(step.seconds)
    assert rec["engine_id"] == state.engine_id == str(uuid.UUID(int=1))
    assert state.records == [rec] and seen == [rec]
    assert (state.active, state.served, state.generation_tokens_total) == (0, 1, 4)
    assert state.outcome_counts == {"computed": 1}


def test_mooncake_prefill_holds_kv_and_returns_no_params() -> None:
    # vLLM 0.32's Mooncake prefill answers kv_transfer_params null: the router mints the decode's params.
    state = make_state("prefill", "mooncake", bootstrap_port=8998)
    clock = FakeClock()
    req = request(do_remote_decode=True, do_remote_prefill=False, transfer_id="xfer-7")
    flow = RequestFlow(state, req)

    done = sleep_through(flow, through_gate(flow, clock), clock)

    assert isinstance(done, Finish)
    assert done.result.kv_transfer_params is None
    block = state.store.pull("xfer-7", clock.now)
    assert block is not None and block.prompt_digest == prompt_digest(req.prompt_ids)
    assert block.created_at == clock.now  # held from when the prefill finished, not when it arrived
    rec = done.result.record
    assert (rec["kind"], rec["transfer_id"], rec["error"]) == ("prefill", "xfer-7", None)


def _first_word(prompt: str) -> str:
    return expected_completion(prompt, 4).split()[0]


def test_a_stop_string_ends_the_output_where_it_begins() -> None:
    state = make_state()
    clock = FakeClock()
    prompt = "[pdchaos:t:1] hello there"
    words = expected_completion(prompt, 4).split()
    req = replace(request(prompt), stop=("no such words", words[1]))
    flow = RequestFlow(state, req)
    done = sleep_through(flow, through_gate(flow, clock), clock)
    assert isinstance(done, Finish)
    r = done.result
    # The second token completes the stop string: two tokens, the text ends just before the word.
    assert (len(r.token_ids), r.finish_reason) == (2, "stop")
    assert r.text == f" {words[0]} " == expected_completion(prompt, 4, None, req.stop)
    # Streamed, the pieces cut the last token where the stop string begins.
    assert r.token_texts() == [f" {words[0]}", " "]
    assert "".join(r.token_texts()) == r.text


@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
def test_a_prefill_a_stop_string_ends_frees_its_kv_and_returns_no_params(connector: str) -> None:
    # vLLM's connectors hold a prefill's KV only when it ends at its length cap (FINISHED_LENGTH_CAPPED).
    state = make_state("prefill", connector, bootstrap_port=8998)
    clock = FakeClock()
    prompt = "[pdchaos:t:1] hello there"
    base = request(prompt, 1, do_remote_decode=True, do_remote_prefill=False, transfer_id="xfer-7")
    req = replace(base, stop=(_first_word(prompt),))
    flow = RequestFlow(state, req)
    done = sleep_through(flow, through_gate(flow, clock), clock)
    assert isinstance(done, Finish)
    r = done.result
    assert (r.finish_reason, r.kv_transfer_params, r.text) == ("stop", None, " ")
    assert state.store.pull("xfer-7", clock.now) is None
    assert "KV freed" in done.result.record["error"]
    # Without the stop string the same prefill holds it (NIXL: and returns its params).
    kept = RequestFlow(state, base)
    done = sleep_through(kept, through_gate(kept, clock), clock)
    assert isinstance(done, Finish) and done.result.finish_reason == "length"
    assert (done.result.kv_transfer_params is not None) == (connector == "nixl")


def _eos_first_seed(prompt: str) -> int:
    return seed_for_length(prompt_digest(encode(prompt)), 0)


@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
def test_a_prefill_end_of_sequence_ends_frees_its_kv_unless_told_to_ignore_it(connector: str) -> None:
    # vLLM checks end of sequence before the length cap: a one-token prefill whose token is end of sequence
    # ends "stop", not length-capped, and its connector frees the KV.
    state = make_state("prefill", connector, bootstrap_port=8998)
    clock = FakeClock()
    prompt = "[pdchaos:t:1] hello there"
    base = replace(request(prompt, 1, do_remote_decode=True, do_remote_prefill=False, transfer_id="xfer-8"),
                   seed=_eos_first_seed(prompt))
    flow = RequestFlow(state, base)
    done = sleep_through(flow, through_gate(flow, clock), clock)
    assert isinstance(done, Finish)
    r = done.result
    assert (r.finish_reason, r.kv_transfer_params, r.text) == ("stop", None, "")
    assert r.token_ids == [eos_token_id()]
    assert state.store.pull("xfer-8", clock.now) is None
    assert r.record["error"] == "end of sequence ended the prefill before its length cap: KV freed"
    # ignore_eos: the id is sampled and the prefill ends at its cap; min_tokens 1 masks it (a word instead).
    for told in (replace(base, ignore_eos=True), replace(base, min_tokens=1)):
        kept = RequestFlow(state, told)
        done = sleep_through(kept, through_gate(kept, clock), clock)
        assert isinstance(done, Finish) and done.result.finish_reason == "length"
        assert done.result.record["error"] is None
        assert (done.result.token_ids == [eos_token_id()]) == told.ignore_eos
        if connector == "nixl":
            assert done.result.kv_transfer_params is not None
        else:
            assert state.store.pull("xfer-8", clock.now) is not None


def test_an_answer_ends_at_its_natural_length_with_finish_reason_stop() -> None:
    state = make_state()
    clock = FakeClock()
    prompt = "[pdchaos:t:1] hello there"
    digest = prompt_digest(encode(prompt))
    whole = expected_completion(prompt, 6, seed_for_length(digest, 9))
    for length, finish in ((2, "stop"), (5, "stop"), (6, "length")):
        seed = seed_for_length(digest, length)
        assert natural_length(digest, seed) == length
        flow = RequestFlow(state, replace(request(prompt, 6), seed=seed))
        done = sleep_through(flow, through_gate(flow, clock), clock)
        assert isinstance(done, Finish)
        r = done.result
        assert r.finish_reason == finish, length
        # The end-of-sequence id counts as a token but has no text; the harness predicts the same text.
        assert len(r.token_ids) == min(length + 1, 6) and (r.token_ids[-1] == eos_token_id()) == (length < 6)
        assert r.text == expected_completion(prompt, 6, seed) and len(r.text.split()) == min(length, 6)
        assert "".join(r.token_texts()) == r.text
        if length < 6:
            assert r.token_texts()[-1] == ""
    # The seed picks the words too: an unseeded answer differs from a seeded one.
    assert whole != expected_completion(prompt, 6)


def test_mooncake_prefill_without_transfer_id_holds_nothing() -> None:
    state = make_state("prefill", "mooncake", bootstrap_port=8998)
    clock = FakeClock()
    flow = RequestFlow(state, request(do_remote_decode=True))
    done = sleep_through(flow, through_gate(flow, clock), clock)
    assert isinstance(done, Finish) and done.result.kv_transfer_params is None
    assert len(state.store) == 0
    assert done.result.record["error"] == "no transfer_id: KV not held"


def test_prefill_under_no_engine_id_hands_out_an_empty_id() -> None:
    state = make_state("prefill", "nixl", nixl_port=7001, advertise_side_channel_port=7100)
    state.faults.apply("no_engine_id")
    clock = FakeClock()
    flow = RequestFlow(state, request(do_remote_decode=True))
    done = sleep_through(flow, through_gate(flow, clock), clock)
    assert isinstance(done, Finish) and done.result.kv_transfer_params is not None
    params = done.result.kv_transfer_params
    assert params["remote_engine_id"] == ""
    assert (params["remote_port"], params["remote_request_id"]) == (7100, "req-1")


# -- decode ------------------------------------------------------------------------------------------------


def test_mooncake_decode_pulls_then_first_token_costs_one_itl() -> None:
    state = make_state("decode", "mooncake")
    clock = FakeClock()
    req = request(**mooncake_decode_params())
    flow = RequestFlow(state, req)

    step = through_gate(flow, clock)
    assert step == QueryBootstrap("http://127.0.0.1:8998/query", 5.0)
    clock.advance(0.1)
    answer = build_query_answer(PREFILL_ID, "127.0.0.1", [SIDE_PORT])
    step = flow.on_query_result(answer, clock.now, clock.wall)
    assert isinstance(step, PullFrom)
    assert (step.port, step.engine_id, step.transfer_key) == (SIDE_PORT, PREFILL_ID, "xfer-1")
    assert step.timeout_s == pytest.approx(2.9)
    clock.advance(0.2)
    pulled = PullResponse(True, prompt_digest(req.prompt_ids), len(req.prompt_ids), None, PREFILL_ID)
    step = flow.on_pull_result(pulled, clock.now, clock.wall)
    assert step == Sleep(state.timing.itl_s(), "itl")
    done = sleep_through(flow, step, clock)

    assert isinstance(done, Finish)
    assert done.result.text == expected_completion(req.prompt_text, 4)
    rec = done.result.record
    assert (rec["kind"], rec["outcome"], rec["transfer_id"], rec["remote_engine_id"]) == (
        "decode",
        "pulled",
        "xfer-1",
        PREFILL_ID,
    )
    assert rec["kv_digest"] == rec["prompt_digest"]
    assert rec["duration_s"] == pytest.approx(0.3 + state.timing.itl_s())
    assert state.bootstrap_cache.get(PREFILL_ID) == ("127.0.0.1", SIDE_PORT)
    assert state.active == 0


def test_decode_of_someone_elses_kv_generates_from_that_kv() -> None:
    state = make_state("decode", "mooncake")
    state.bootstrap_cache.put(PREFILL_ID, ("127.0.0.1", SIDE_PORT))
    clock = FakeClock()
    req = request(**mooncake_decode_params())
    other = request("[pdchaos:t:2] another prompt entirely")
    flow = RequestFlow(state, req)
    assert isinstance(through_gate(flow, clock), PullFrom)
    step = flow.on_pull_result(PullResponse(True, prompt_digest(other.prompt_ids), 3), clock.now, clock.wall)
    done = sleep_through(flow, step, clock)
    assert isinstance(done, Finish)
    assert done.result.text == expected_completion(other.prompt_text, 4)
    assert done.result.text != expected_completion(req.prompt_text, 4)
    assert done.result.record["kv_digest"] == prompt_digest(other.prompt_ids)


def test_decode_on_a_dead_cached_address_waits_out_the_transfer_timeout() -> None:
    state = make_state("decode", "mooncake", transfer_timeout_s=3.0)
    state.bootstrap_cache.put(PREFILL_ID, ("127.0.0.1", 1))  # the prefill restarted: nobody listens there
    clock = FakeClock(now=50.0)
    flow = RequestFlow(state, request(**mooncake_decode_params()))

    step = through_gate(flow, clock)
    assert isinstance(step, PullFrom) and step.port == 1
    step = flow.on_pull_result(None, clock.now, clock.wall, error="ConnectionRefusedError: refused")
    assert step == WaitUntil(53.0)
    clock.advance(1.0)
    assert flow.on_deadline(clock.now, clock.wall) == WaitUntil(53.0)  # woke early: keep waiting
    clock.now = 53.0
    done = flow.on_deadline(clock.now, clock.wall)

    assert isinstance(done, Reject)
    assert (done.status, done.err_type) == (500, "InternalServerError")
    assert done.message.startswith("KV load failed: KV transfer timed out")
    assert done.record is not None and done.record is state.records[-1]
    assert (done.record["outcome"], done.record["kv_digest"], done.record["output_digest"]) == (
        "timed_out",
        None,
        None,
    )
    assert done.record["duration_s"] == pytest.approx(3.0) and done.record["ts"] == EPOCH + 53.0
    assert state.active == 0 and state.served == 0


def test_recompute_policy_turns_a_failed_load_into_a_ttft() -> None:
    state = make_state("decode", "mooncake", load_failure_policy="recompute")
    clock = FakeClock()
    req = request(**mooncake_decode_params())
    flow = RequestFlow(state, req)
    assert isinstance(through_gate(flow, clock), QueryBootstrap)
    step = flow.on_query_result(None, clock.now, clock.wall, error="timeout")
    assert step == Sleep(state.timing.ttft_s(len(req.prompt_ids)), "ttft")
    done = sleep_through(flow, step, clock)
    assert isinstance(done, Finish) and done.result.text == expected_completion(req.prompt_text, 4)
    assert done.result.record["outcome"] == "recomputed"


def test_nixl_decode_handshakes_then_pulls() -> None:
    state = make_state("decode", "nixl", handshake_timeout_s=0.5)
    clock = FakeClock()
    params = {
        "do_remote_prefill": True,
        "remote_engine_id": PREFILL_ID,
        "remote_request_id": "pre-9",
        "remote_host": "127.0.0.1",
        "remote_port": 7001,
    }
    req = request(**params)
    flow = RequestFlow(state, req)
    assert through_gate(flow, clock) == Handshake("127.0.0.1", 7001, PREFILL_ID, 0.5)
    step = flow.on_handshake_result(HandshakeResponse(True, PREFILL_ID), clock.now, clock.wall)
    assert isinstance(step, PullFrom) and step.transfer_key == "pre-9"
    step = flow.on_pull_result(PullResponse(True, prompt_digest(req.prompt_ids), 3), clock.now, clock.wall)
    done = sleep_through(flow, step, clock)
    assert isinstance(done, Finish)
    assert (done.result.record["remote_request_id"], done.result.record["outcome"]) == ("pre-9", "pulled")
    assert PREFILL_ID in state.nixl_cache


# -- refusals ----------------------------------------------------------------------------------------------


def test_dead_engine_refuses_with_503_and_no_record() -> None:
    state = make_state()
    assert state.die() == {"dead": {"old": False, "new": True}}
    flow = RequestFlow(state, request())
    done = through_gate(flow, FakeClock())
    assert done == Reject(503, "engine is dead", "ServiceUnavailableError")
    assert state.records == [] and state.active == 0


def test_fail_requests_consumes_one_failure_per_request() -> None:
    state = make_state()
    state.faults.apply("fail_requests", {"count": 1, "status": 502})
    clock = FakeClock()
    first = through_gate(RequestFlow(state, request()), clock)
    assert isinstance(first, Reject)
    assert (first.status, first.err_type) == (502, "InternalServerError")
    assert "injected failure" in first.message
    assert isinstance(through_gate(RequestFlow(state, request()), clock), Sleep)


def test_max_tokens_below_one_is_400() -> None:
    state = make_state()
    done = through_gate(RequestFlow(state, request(max_tokens=0)), FakeClock())
    assert isinstance(done, Reject) and (done.status, done.err_type) == (400, "BadRequestError")
    assert "max_tokens" in done.message and state.active == 0


def test_a_wedged_generate_surface_parks_at_the_gate() -> None:
    state = make_state()
    flow = RequestFlow(state, request())
    state.faults.apply("wedge", {"surface": "generate"})
    assert flow.next_step() == AwaitGate("generate")
    assert state.faults.gate_delay("generate") is None  # the shell parks until the faults change
    assert state.faults.gate_delay("health") == 0.0
    state.faults.apply("latency", {"surface": "all", "ms": 250})
    state.faults.clear("wedge")
    assert state.faults.gate_delay("generate") == pytest.approx(0.25)
    assert state.active == 0  # nothing is admitted before the gate is passed


def test_results_out_of_order_are_refused() -> None:
    flow = RequestFlow(make_state(), request())
    clock = FakeClock()
    with pytest.raises(RuntimeError):
        flow.on_slept(clock.now, clock.wall)
    through_gate(flow, clock)
    with pytest.raises(RuntimeError):
        flow.on_gate_passed(clock.now, clock.wall)


def test_abort_releases_an_admitted_request_once() -> None:
    state = make_state()
    clock = FakeClock()
    waiting = RequestFlow(state, request())
    assert waiting.abort().status == 499 and state.active == 0  # never admitted: nothing to release
    flow = RequestFlow(state, request())
    through_gate(flow, clock)
    assert state.active == 1
    aborted = flow.abort()
    assert (aborted.status, aborted.err_type) == (499, "RequestAborted")
    assert flow.abort() is aborted and state.active == 0
    assert state.records == []


# -- engine state ------------------------------------------------------------------------------------------


def test_restart_resets_identity_kv_caches_dead_flag_and_faults() -> None:
    state = make_state("prefill", "mooncake")
    state.store.allocate("xfer-1", "d", 3, now=0.0)
    state.bootstrap_cache.put("x", ("127.0.0.1", 1))
    state.nixl_cache.put("y", ("127.0.0.1", 2))
    state.faults.apply("wedge", {"surface": "generate"})
    state.die()
    first = state.identity

    cleared = state.restart(now=5.0)

    assert cleared == {"wedge": {"old": ["generate"], "new": None}}
    assert state.identity.engine_id not in ("", first.engine_id)
    assert (state.identity.generation, state.identity.started_at) == (2, 5.0)
    assert (len(state.store), len(state.bootstrap_cache), len(state.nixl_cache)) == (0, 0, 0)
    assert not state.dead and state.faults.as_dict() == {}
    state.restart(now=6.0, engine_id="pinned")
    assert (state.engine_id, state.identity.generation) == ("pinned", 3)


def test_bootstrap_answer_and_side_channel_pull() -> None:
    state = make_state("prefill", "mooncake", advertise_side_channel_port=9100)
    state.side_channel_ports = [SIDE_PORT, SIDE_PORT + 1]
    answer = state.bootstrap_answer()
    assert answer["0"]["worker_addr"] == {"0": {"0": "tcp://127.0.0.1:9100"}}  # rank 0 through the proxy
    assert answer["1"]["engine_id"] == f"{state.engine_id}_dp1"
    state.store.allocate("xfer-1", "digest-a", 20, now=0.0)
    granted = state.answer_side_channel(PullRequest(state.engine_id, "xfer-1"), state.engine_id, 1.0)
    assert isinstance(granted, PullResponse) and (granted.ok, granted.prompt_digest) == (True, "digest-a")
    again = state.answer_side_channel(PullRequest(state.engine_id, "xfer-1"), state.engine_id, 1.0)
    assert isinstance(again, PullResponse) and not again.ok  # a pull hands the KV over once
