"""Handoff state machines: every outcome the fake decode can reach, for Mooncake and NIXL."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fake_engines.core import (
    Action,
    Done,
    Handshake,
    HandshakeCache,
    HandshakeResponse,
    MooncakeDecodePlan,
    NixlDecodePlan,
    Outcome,
    PullFrom,
    PullResponse,
    QueryBootstrap,
    RequestKind,
    WaitUntil,
    build_query_answer,
    classify_request,
    nixl_prefill_params,
    prefill_transfer_key,
)

DIGEST = "0123456789abcdef"
OTHER = "fedcba9876543210"
ENGINE = "eng-1"
TIMEOUT = 3.0


def mc_params(engine_id: str = ENGINE, transfer_id: str = "xfer-1") -> dict[str, object]:
    return {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": transfer_id,
        "remote_engine_id": engine_id,
        "remote_bootstrap_addr": "http://127.0.0.1:8998",
    }


def mooncake(
    cache: HandshakeCache, policy: str = "fail", now: float = 100.0, **kw: str
) -> MooncakeDecodePlan:
    return MooncakeDecodePlan(mc_params(**kw), DIGEST, cache, policy, now, TIMEOUT, query_timeout_s=1.0)


def ok_pull(digest: str = DIGEST) -> PullResponse:
    return PullResponse(True, digest, 12, None, ENGINE)


# -- Mooncake ----------------------------------------------------------------------------------------------


def test_mooncake_new_id_queries_then_pulls_and_caches() -> None:
    cache = HandshakeCache()
    plan = mooncake(cache)
    step = plan.next_step()
    assert step == QueryBootstrap("http://127.0.0.1:8998/query", 1.0)
    assert plan.next_step() is step  # idempotent
    step = plan.on_query_result(build_query_answer(ENGINE, "127.0.0.1", [4567]), now=100.5)
    assert isinstance(step, PullFrom)
    assert (step.host, step.port, step.engine_id, step.transfer_key) == ("127.0.0.1", 4567, ENGINE, "xfer-1")
    assert step.timeout_s == pytest.approx(2.5)  # what is left of the transfer timeout
    assert cache.get(ENGINE) == ("127.0.0.1", 4567)
    done = plan.on_pull_result(ok_pull(), now=100.6)
    assert done == Done(Outcome.PULLED, Action.USE_KV, DIGEST, None, digest_mismatch=False)
    assert plan.done is done


def test_mooncake_seen_id_skips_query() -> None:
    cache = HandshakeCache()
    cache.put(ENGINE, ("127.0.0.1", 5555))
    step = mooncake(cache).next_step()
    assert isinstance(step, PullFrom)
    assert (step.port, step.timeout_s) == (5555, TIMEOUT)


@pytest.mark.parametrize(
    ("answer", "error", "expect_error"),
    [
        (build_query_answer("someone-else", "127.0.0.1", [4567]), None, "not found"),
        ({}, None, "not found"),
        (None, "connection refused", "bootstrap query failed: connection refused"),
        (None, "timeout", "bootstrap query failed: timeout"),
        ({"0": {"engine_id": ENGINE, "worker_addr": {"0": {"0": "http://x"}}}}, None, "bad bootstrap answer"),
        (["not", "a", "map"], None, "bad bootstrap answer"),
    ],
)
def test_mooncake_query_failures_fail_fast_and_cache_nothing(
    answer: object, error: str | None, expect_error: str
) -> None:
    cache = HandshakeCache()
    plan = mooncake(cache)
    plan.next_step()
    done = plan.on_query_result(answer, now=100.01, error=error)
    assert isinstance(done, Done)
    assert (done.outcome, done.action) == (Outcome.FAILED, Action.FAIL)
    assert expect_error in (done.error or "")
    assert ENGINE not in cache


def test_mooncake_cached_dead_address_waits_full_timeout_then_times_out() -> None:
    cache = HandshakeCache()
    cache.put(ENGINE, ("127.0.0.1", 1))  # the prefill that owned this port has restarted
    plan = mooncake(cache, now=10.0)
    assert isinstance(plan.next_step(), PullFrom)
    # connection refused does not error: the transfer just never completes
    step = plan.on_pull_result(None, now=10.01, error="connection refused")
    assert step == WaitUntil(13.0)
    assert plan.on_deadline(now=12.0) == WaitUntil(13.0)  # woke early: still waiting
    done = plan.on_deadline(now=13.0)
    assert isinstance(done, Done)
    assert (done.outcome, done.action, done.kv_digest) == (Outcome.TIMED_OUT, Action.FAIL, None)
    assert "timed out after 3.000s" in (done.error or "")
    assert cache.get(ENGINE) == ("127.0.0.1", 1)  # still cached: every later request hangs too (#2491)


def test_mooncake_wedged_side_channel_times_out() -> None:
    plan = mooncake(HandshakeCache())
    plan.next_step()
    plan.on_query_result(build_query_answer(ENGINE, "127.0.0.1", [4567]), now=100.0)
    done = plan.on_pull_result(None, now=103.0, error="timeout")
    assert isinstance(done, Done) and done.outcome == Outcome.TIMED_OUT


def test_mooncake_pull_of_a_transfer_the_prefill_does_not_hold_waits_out_the_deadline() -> None:
    # vLLM's Mooncake prefill parks such a pull until its 480 s abort timeout instead of refusing it.
    plan = mooncake(HandshakeCache())
    plan.next_step()
    plan.on_query_result(build_query_answer(ENGINE, "127.0.0.1", [4567]), now=100.0)
    wait = plan.on_pull_result(PullResponse(False, error="no KV held for xfer-1"), now=100.1)
    assert wait == WaitUntil(103.0)
    assert plan.on_deadline(101.0) == WaitUntil(103.0)
    done = plan.on_deadline(103.0)
    assert isinstance(done, Done)
    assert (done.outcome, done.action) == (Outcome.TIMED_OUT, Action.FAIL)


def test_mooncake_pull_without_digest_is_a_failure() -> None:
    plan = mooncake(HandshakeCache())
    plan.next_step()
    plan.on_query_result(build_query_answer(ENGINE, "127.0.0.1", [4567]), now=100.0)
    done = plan.on_pull_result(PullResponse(True, None, 3), now=100.1)
    assert isinstance(done, Done) and done.outcome == Outcome.FAILED


def test_mooncake_wrong_kv_is_used_but_flagged() -> None:
    cache = HandshakeCache()
    cache.put(ENGINE, ("127.0.0.1", 4567))
    plan = mooncake(cache)
    plan.next_step()
    done = plan.on_pull_result(ok_pull(OTHER), now=100.1)
    assert isinstance(done, Done)
    assert (done.outcome, done.kv_digest, done.digest_mismatch) == (Outcome.PULLED, OTHER, True)


def test_mooncake_dp_rank_ids_resolve_to_their_port() -> None:
    cache = HandshakeCache()
    plan = mooncake(cache, engine_id=f"{ENGINE}_dp1")
    plan.next_step()
    step = plan.on_query_result(build_query_answer(ENGINE, "127.0.0.1", [4000, 4001]), now=100.0)
    assert isinstance(step, PullFrom) and step.port == 4001


@pytest.mark.parametrize("missing", ["transfer_id", "remote_engine_id", "remote_bootstrap_addr"])
@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_mooncake_unminted_params_recompute(missing: str, policy: str) -> None:
    params = mc_params()
    del params[missing]
    plan = MooncakeDecodePlan(params, DIGEST, HandshakeCache(), policy, 0.0, TIMEOUT)
    done = plan.next_step()
    assert isinstance(done, Done)
    assert (done.outcome, done.action) == (Outcome.RECOMPUTED, Action.RECOMPUTE)
    assert missing in (done.error or "")


# -- load failure policy -----------------------------------------------------------------------------------


def _fail_by_missing_id(plan: MooncakeDecodePlan) -> Done:
    plan.next_step()
    step = plan.on_query_result({}, now=100.0)
    assert isinstance(step, Done)
    return step


def _fail_by_dead_address(plan: MooncakeDecodePlan) -> Done:
    plan.cache.put(ENGINE, ("127.0.0.1", 1))
    plan.next_step()
    plan.on_pull_result(None, now=100.0, error="refused")
    step = plan.on_deadline(now=200.0)
    assert isinstance(step, Done)
    return step


@pytest.mark.parametrize(
    ("fail_how", "policy", "outcome", "action"),
    [
        (_fail_by_missing_id, "fail", Outcome.FAILED, Action.FAIL),
        (_fail_by_missing_id, "recompute", Outcome.RECOMPUTED, Action.RECOMPUTE),
        (_fail_by_dead_address, "fail", Outcome.TIMED_OUT, Action.FAIL),
        (_fail_by_dead_address, "recompute", Outcome.RECOMPUTED, Action.RECOMPUTE),
    ],
)
def test_load_failure_policy(
    fail_how: Callable[[MooncakeDecodePlan], Done], policy: str, outcome: Outcome, action: Action
) -> None:
    done = fail_how(mooncake(HandshakeCache(), policy=policy))
    assert (done.outcome, done.action) == (outcome, action)
    assert done.kv_digest is None
    assert done.error


def test_bad_policy_and_timeout_rejected() -> None:
    with pytest.raises(ValueError):
        mooncake(HandshakeCache(), policy="retry")
    with pytest.raises(ValueError):
        MooncakeDecodePlan(mc_params(), DIGEST, HandshakeCache(), "fail", 0.0, 0.0)


def test_results_out_of_order_are_refused() -> None:
    plan = mooncake(HandshakeCache())
    plan.next_step()  # at QueryBootstrap
    with pytest.raises(RuntimeError):
        plan.on_pull_result(ok_pull(), now=100.0)
    with pytest.raises(RuntimeError):
        plan.on_deadline(now=200.0)


# -- NIXL --------------------------------------------------------------------------------------------------


def nixl_params(engine_id: str = ENGINE) -> dict[str, object]:
    return nixl_prefill_params(engine_id, "127.0.0.1", 7777, [0, 1], "req-9", tp_size=1)


def nixl(cache: HandshakeCache, policy: str = "fail", engine_id: str = ENGINE) -> NixlDecodePlan:
    return NixlDecodePlan(
        nixl_params(engine_id), DIGEST, cache, policy, 50.0, TIMEOUT, handshake_timeout_s=0.5
    )


def test_nixl_prefill_params_shape() -> None:
    p = nixl_params()
    assert p == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": ENGINE,
        "remote_request_id": "req-9",
        "remote_block_ids": [[0, 1]],  # one list per KV cache group, as vLLM 0.32
        "remote_host": "127.0.0.1",
        "remote_port": 7777,
        "tp_size": 1,
    }
    assert classify_request(p) == RequestKind.DECODE


def test_nixl_handshake_then_pull_and_cache() -> None:
    cache = HandshakeCache()
    plan = nixl(cache)
    assert plan.next_step() == Handshake("127.0.0.1", 7777, ENGINE, 0.5)
    step = plan.on_handshake_result(HandshakeResponse(True, ENGINE), now=50.1)
    assert isinstance(step, PullFrom)
    assert (step.transfer_key, step.engine_id, step.port) == ("req-9", ENGINE, 7777)
    assert step.timeout_s == pytest.approx(2.9)
    assert cache.get(ENGINE) == ("127.0.0.1", 7777)
    done = plan.on_pull_result(ok_pull(), now=50.2)
    assert isinstance(done, Done) and done.outcome == Outcome.PULLED and not done.digest_mismatch
    # the next request to the same engine skips the handshake
    assert isinstance(nixl(cache).next_step(), PullFrom)


@pytest.mark.parametrize(
    ("response", "error", "expect"),
    [
        (HandshakeResponse(True, "eng-2"), None, "mismatch"),
        (HandshakeResponse(False, "eng-2", "engine id mismatch"), None, "mismatch"),
        (None, "timeout", "failed: timeout"),
        (None, "connection refused", "failed: connection refused"),
    ],
)
def test_nixl_handshake_failures_fail_fast_and_are_not_cached(
    response: HandshakeResponse | None, error: str | None, expect: str
) -> None:
    cache = HandshakeCache()
    plan = nixl(cache)
    plan.next_step()
    done = plan.on_handshake_result(response, now=50.1, error=error)
    assert isinstance(done, Done)
    assert (done.outcome, done.action) == (Outcome.FAILED, Action.FAIL)
    assert expect in (done.error or "")
    assert len(cache) == 0
    assert isinstance(nixl(cache).next_step(), Handshake)  # tried again next time


def test_nixl_handshake_failure_with_recompute_policy() -> None:
    plan = nixl(HandshakeCache(), policy="recompute")
    plan.next_step()
    done = plan.on_handshake_result(None, now=50.1, error="timeout")
    assert isinstance(done, Done)
    assert (done.outcome, done.action) == (Outcome.RECOMPUTED, Action.RECOMPUTE)


def test_nixl_read_error_fails_fast_unlike_mooncake() -> None:
    cache = HandshakeCache()
    cache.put(ENGINE, ("127.0.0.1", 7777))
    plan = nixl(cache)
    assert isinstance(plan.next_step(), PullFrom)
    done = plan.on_pull_result(None, now=50.1, error="connection reset")
    assert isinstance(done, Done) and done.outcome == Outcome.FAILED


@pytest.mark.parametrize("drop", ["remote_engine_id", "remote_host", "remote_port", "remote_request_id"])
def test_nixl_incomplete_params_fail_per_policy(drop: str) -> None:
    params = nixl_params()
    del params[drop]
    done = NixlDecodePlan(params, DIGEST, HandshakeCache(), "fail", 0.0, TIMEOUT).next_step()
    assert isinstance(done, Done) and done.outcome == Outcome.FAILED
    done = NixlDecodePlan(params, DIGEST, HandshakeCache(), "recompute", 0.0, TIMEOUT).next_step()
    assert isinstance(done, Done) and done.outcome == Outcome.RECOMPUTED


# -- request classification --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "kind"),
    [
        (None, RequestKind.LOCAL),
        ({}, RequestKind.LOCAL),
        ({"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "x"}, RequestKind.PREFILL),
        (mc_params(), RequestKind.DECODE),
        ({"do_remote_decode": False, "do_remote_prefill": False}, RequestKind.LOCAL),
        ({"do_remote_decode": "yes"}, RequestKind.LOCAL),
    ],
)
def test_classify_request(params: dict[str, object] | None, kind: RequestKind) -> None:
    assert classify_request(params) == kind


def test_prefill_transfer_key() -> None:
    assert prefill_transfer_key("mooncake", {"transfer_id": "xfer-7"}, "req-1") == "xfer-7"
    assert prefill_transfer_key("mooncake", {}, "req-1") is None
    assert prefill_transfer_key("nixl", {"do_remote_decode": True}, "req-1") == "req-1"
    assert prefill_transfer_key("none", {}, "req-1") is None
    with pytest.raises(ValueError):
        prefill_transfer_key("rdma", {}, "req-1")


@pytest.mark.parametrize(("tp_size", "expect"), [
    (2, "Decode TP cannot be smaller than prefill TP"),
    (0, "tp_size 0 is not a positive integer"),
    ("1", "tp_size '1' is not a positive integer"),
    (True, "tp_size True is not a positive integer"),
])
def test_nixl_tp_size_the_decode_cannot_read_from_fails_the_handshake(tp_size: object, expect: str) -> None:
    cache = HandshakeCache()
    params = {**nixl_params(), "tp_size": tp_size}
    plan = NixlDecodePlan(params, DIGEST, cache, "fail", 50.0, TIMEOUT)
    assert isinstance(plan.next_step(), Handshake)
    done = plan.on_handshake_result(HandshakeResponse(True, ENGINE), now=50.1)
    assert isinstance(done, Done) and done.outcome == Outcome.FAILED and expect in (done.error or "")
    assert len(cache) == 0  # no agent added: the next request handshakes again


def test_nixl_tp_size_left_out_reads_as_one() -> None:
    params = nixl_params()
    del params["tp_size"]
    plan = NixlDecodePlan(params, DIGEST, HandshakeCache(), "fail", 50.0, TIMEOUT)
    plan.next_step()
    assert isinstance(plan.on_handshake_result(HandshakeResponse(True, ENGINE), now=50.1), PullFrom)
