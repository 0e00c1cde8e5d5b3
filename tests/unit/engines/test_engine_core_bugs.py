"""The engine bug switches (`fake_engines.core.bugs`): each branch next to the correct code it replaces,
driven with a fake clock and scripted peers."""

from __future__ import annotations

from typing import Any

import pytest
from test_engine_core_request_flow import (
    PREFILL_ID,
    SIDE_PORT,
    FakeClock,
    make_state,
    mooncake_decode_params,
    request,
    sleep_through,
    through_gate,
)

from fake_engines.config import config_from_args
from fake_engines.core import (
    Done,
    Finish,
    Handshake,
    HandshakeCache,
    HandshakeResponse,
    KvStore,
    MooncakeDecodePlan,
    NixlDecodePlan,
    Outcome,
    PullFrom,
    PullRequest,
    QueryBootstrap,
    Reject,
    RequestFlow,
    build_query_answer,
    serve_pull,
)
from fake_engines.core.bugs import (
    ENGINE_BUGS,
    HEALTHY_WHILE_DRAINING,
    KV_FREED_WHILE_READ,
    REPORTS_FIRST_ID,
    SHUTDOWN_DROPS_PULLS,
    STALE_PEER_HANDSHAKE,
    engine_bug_names,
    validate_engine_bugs,
)

NEW_ID = "prefill-new"


def test_the_catalog_declares_the_engine_field_bugs_with_public_references() -> None:
    assert engine_bug_names() == (HEALTHY_WHILE_DRAINING, KV_FREED_WHILE_READ, REPORTS_FIRST_ID,
                                  SHUTDOWN_DROPS_PULLS, STALE_PEER_HANDSHAKE)
    for switch in ENGINE_BUGS.values():
        assert (switch.side, switch.zoo) == ("engine", "field")
        assert switch.reference.startswith("https://") and switch.symptom
    assert validate_engine_bugs([STALE_PEER_HANDSHAKE]) == frozenset({STALE_PEER_HANDSHAKE})
    with pytest.raises(ValueError, match="unknown bug name"):
        validate_engine_bugs(["stale_engine_id"])


def test_the_cli_turns_inject_bug_flags_into_the_config() -> None:
    base = ["--role", "prefill", "--http-port", "1"]
    assert config_from_args(base).bugs == frozenset()
    cfg = config_from_args([*base, "--inject-bug", KV_FREED_WHILE_READ, "--inject-bug", SHUTDOWN_DROPS_PULLS])
    assert cfg.bugs == frozenset({KV_FREED_WHILE_READ, SHUTDOWN_DROPS_PULLS})


def test_list_bugs_prints_the_switches_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        config_from_args(["--list-bugs"])  # no --role needed
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ENGINE_BUGS) and "see: https://" in out


# -- kv_freed_while_read -----------------------------------------------------------------------------------


def _late_pull(bugs: frozenset[str], reuse: bool) -> tuple[Any, Any]:
    """A's KV is held at t=0 (abort timeout 1 s), B's computed at t=1.5 when `reuse`, A pulled at t=2."""
    store = KvStore(abort_timeout_s=1.0, bugs=bugs)
    a = store.allocate("xfer-a", "digest-a", 20, now=0.0)
    b = store.allocate("xfer-b", "digest-b", 20, now=1.5) if reuse else None
    answer = serve_pull(store, PullRequest("p", "xfer-a"), "p", now=2.0)
    return answer, (a, b)


def test_a_pull_after_the_abort_timeout_fails_cleanly_and_blocks_are_never_reused() -> None:
    answer, (a, b) = _late_pull(frozenset(), reuse=True)
    assert not answer.ok and answer.error == "no KV held for xfer-a"
    assert not set(a.block_ids) & set(b.block_ids)


def test_kv_freed_while_read_hands_the_late_reader_the_blocks_next_owner() -> None:
    answer, (a, b) = _late_pull(frozenset({KV_FREED_WHILE_READ}), reuse=True)
    assert set(a.block_ids) <= set(b.block_ids)  # A's blocks went to B at the abort timeout
    assert answer.ok and answer.prompt_digest == "digest-b"


def test_kv_freed_while_read_with_nothing_reused_yet_still_reads_the_old_data() -> None:
    answer, _ = _late_pull(frozenset({KV_FREED_WHILE_READ}), reuse=False)
    assert answer.ok and answer.prompt_digest == "digest-a"  # freed, but nobody wrote over it: lucky


def test_kv_freed_while_read_leaves_timely_pulls_alone() -> None:
    store = KvStore(abort_timeout_s=1.0, bugs={KV_FREED_WHILE_READ})
    store.allocate("xfer-a", "digest-a", 20, now=0.0)
    store.allocate("xfer-b", "digest-b", 20, now=0.5)
    block = store.pull("xfer-a", now=0.9)
    assert block is not None and block.prompt_digest == "digest-a"


# -- shutdown_drops_pulls ----------------------------------------------------------------------------------


def _stopping_prefill(bugs: frozenset[str]) -> tuple[Any, FakeClock]:
    state = make_state("prefill", "mooncake", bootstrap_port=8998, kv_abort_timeout_s=5.0, bugs=bugs)
    clock = FakeClock(now=10.0)
    flow = RequestFlow(state, request(do_remote_decode=True, do_remote_prefill=False, transfer_id="xfer-1"))
    assert isinstance(sleep_through(flow, through_gate(flow, clock), clock), Finish)
    state.begin_drain(clock.now)
    return state, clock


def test_a_graceful_stop_refuses_new_work_and_waits_for_the_pending_pull() -> None:
    state, clock = _stopping_prefill(frozenset())
    assert state.draining and not state.healthy
    refused = through_gate(RequestFlow(state, request(do_remote_decode=True, transfer_id="x2")), clock)
    assert refused == Reject(503, "engine is shutting down", "ServiceUnavailableError")
    assert not state.drained(clock.now)  # the decode has yet to pull xfer-1
    assert state.drain_wake(clock.now) == pytest.approx(clock.now - state.timing.ttft_s(0) + 5.0, abs=0.1)
    assert state.store.pull("xfer-1", clock.now) is not None
    assert state.drained(clock.now)


def test_a_graceful_stop_is_bounded_by_the_kv_abort_timeout() -> None:
    state, clock = _stopping_prefill(frozenset())
    assert not state.drained(clock.now + 4.9)
    assert state.drained(clock.now + 5.0)


def test_shutdown_drops_pulls_ends_the_stop_with_kv_still_held() -> None:
    state, clock = _stopping_prefill(frozenset({SHUTDOWN_DROPS_PULLS}))
    assert state.store.live(clock.now) == 1 and state.drained(clock.now)


def test_a_restart_ends_a_drain() -> None:
    state, clock = _stopping_prefill(frozenset())
    state.restart(clock.now)
    assert not state.draining and state.healthy


def test_healthy_while_draining_keeps_passing_its_health_checks_until_it_dies() -> None:
    state, _ = _stopping_prefill(frozenset({HEALTHY_WHILE_DRAINING}))
    assert state.draining and state.healthy
    state.die()
    assert not state.healthy


# -- reports_first_id ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({REPORTS_FIRST_ID})])
def test_reports_first_id_tells_the_first_starts_id_after_a_restart_in_place(bugs: frozenset[str]) -> None:
    state = make_state("prefill", "mooncake", bootstrap_port=8998, bugs=bugs)
    state.side_channel_ports = [SIDE_PORT]
    first = state.engine_id
    state.restart(1.0)
    assert state.engine_id != first
    told = first if bugs else state.engine_id
    assert state.reported_engine_id() == told
    assert state.bootstrap_answer()["0"]["engine_id"] == told
    state.faults.apply_spec({"fault": "no_engine_id"})
    assert state.reported_engine_id() == ""


# -- stale_peer_handshake ----------------------------------------------------------------------------------


def _nixl(cache: HandshakeCache, engine_id: str, bugs: frozenset[str]) -> NixlDecodePlan:
    params = {"remote_engine_id": engine_id, "remote_request_id": "r1", "remote_host": "127.0.0.1",
              "remote_port": 7001}
    return NixlDecodePlan(params, "d", cache, "fail", 0.0, 3.0, bugs=bugs)


def _handshaken(bugs: frozenset[str]) -> HandshakeCache:
    cache = HandshakeCache()
    plan = _nixl(cache, PREFILL_ID, bugs)
    assert isinstance(plan.next_step(), Handshake)
    assert isinstance(plan.on_handshake_result(HandshakeResponse(True, PREFILL_ID), 0.1), PullFrom)
    return cache


def test_nixl_handshakes_again_with_a_peer_replaced_on_the_same_port() -> None:
    cache = _handshaken(frozenset())
    assert _nixl(cache, NEW_ID, frozenset()).next_step() == Handshake("127.0.0.1", 7001, NEW_ID, 5.0)


def test_stale_peer_handshake_reads_a_replaced_nixl_peer_as_the_dead_agent() -> None:
    bugs = frozenset({STALE_PEER_HANDSHAKE})
    plan = _nixl(_handshaken(bugs), NEW_ID, bugs)
    step = plan.next_step()
    assert isinstance(step, PullFrom) and step.engine_id == PREFILL_ID  # not NEW_ID: no handshake
    done = plan.on_pull_result(serve_pull(KvStore(), PullRequest(step.engine_id, "r1"), NEW_ID, 0.2), 0.2)
    assert isinstance(done, Done) and done.outcome == Outcome.FAILED
    assert "engine id mismatch" in str(done.error)


def _mooncake(cache: HandshakeCache, engine_id: str, bugs: frozenset[str]) -> MooncakeDecodePlan:
    params = {"transfer_id": "x1", "remote_engine_id": engine_id, "remote_bootstrap_addr": "http://h:8998"}
    return MooncakeDecodePlan(params, "d", cache, "fail", 0.0, 3.0, bugs=bugs)


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({STALE_PEER_HANDSHAKE})])
def test_mooncake_looks_up_a_new_engine_id_unless_the_cache_follows_the_address(bugs: frozenset[str]) -> None:
    cache = HandshakeCache()
    first = _mooncake(cache, PREFILL_ID, bugs)
    assert isinstance(first.next_step(), QueryBootstrap)
    first.on_query_result(build_query_answer(PREFILL_ID, "127.0.0.1", [SIDE_PORT]), 0.1)
    step = _mooncake(cache, NEW_ID, bugs).next_step()
    if bugs:
        assert step == PullFrom("127.0.0.1", SIDE_PORT, PREFILL_ID, "x1", 3.0)  # the dead start's port
    else:
        assert step == QueryBootstrap("http://h:8998/query", 5.0)


def test_a_decode_record_names_the_peer_it_pulled_from_and_as_which_engine() -> None:
    state = make_state("decode", "mooncake", bugs=frozenset({STALE_PEER_HANDSHAKE}))
    state.bootstrap_cache.put("http://127.0.0.1:8998", ("127.0.0.1", SIDE_PORT), "prefill-old")
    clock = FakeClock()
    flow = RequestFlow(state, request(**mooncake_decode_params()))
    step = through_gate(flow, clock)
    assert isinstance(step, PullFrom)
    done = flow.on_pull_result(None, clock.now + 3.0, clock.wall + 3.0, error="timeout")
    assert isinstance(done, Reject) and done.record is not None
    rec = done.record
    assert (rec["remote_engine_id"], rec["peer_engine_id"]) == (PREFILL_ID, "prefill-old")
    assert (rec["peer"], rec["outcome"]) == (f"127.0.0.1:{SIDE_PORT}", "timed_out")
