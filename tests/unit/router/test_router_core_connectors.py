"""KV handoff params per connector, transfer-id minting, DP ranks, prefill sanitising (DESIGN §2)."""

from __future__ import annotations

import re
import uuid

import pytest

from reference_router.core import (
    MINT_CONNECTOR_UNKNOWN,
    MINT_NO_ENGINE_ID,
    NIXL_NO_PARAMS,
    Connector,
    HandoffPlan,
    HealthConfig,
    MetadataRead,
    ReadOutcome,
    Worker,
    apply_metadata_read,
    apply_property_update,
    decode_body,
    make_worker_spec,
    mint_transfer_id,
    plan_handoff,
    ranked_engine_id,
    sanitize_prefill_body,
)

FIXED = uuid.UUID("12345678123456781234567812345678")


def prefill(url: str = "http://127.0.0.1:8100", **kw: object) -> Worker:
    return Worker.new("w1", make_worker_spec(url, "prefill", **kw))  # type: ignore[arg-type]


def test_mint_transfer_id_format_and_factory() -> None:
    assert mint_transfer_id(lambda: FIXED) == "xfer-12345678123456781234567812345678"
    ids = {mint_transfer_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"xfer-[0-9a-f]{32}", t) for t in ids)


def test_mooncake_params_on_both_legs() -> None:
    w = prefill(bootstrap_port=9001, engine_id="eng-1")
    plan = plan_handoff(w, new_uuid=lambda: FIXED)
    tid = "xfer-12345678123456781234567812345678"
    assert plan.connector is Connector.MOONCAKE and plan.mint_skipped is None and plan.transfer_id == tid
    assert plan.prefill_params == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
    assert plan.decode_params() == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": tid,
        "remote_engine_id": "eng-1",
        "remote_bootstrap_addr": "http://127.0.0.1:9001",
    }
    # The prefill's response params do not change what Mooncake sends.
    assert plan.decode_params({"remote_engine_id": "other"}) == plan.decode_params()


def test_mooncake_default_bootstrap_port_and_explicit_transfer_id() -> None:
    plan = plan_handoff(prefill(engine_id="e"), transfer_id="xfer-given")
    assert plan.transfer_id == "xfer-given"
    assert plan.remote_bootstrap_addr == "http://127.0.0.1:8998"


def test_mooncake_mints_the_id_in_force_not_the_seed() -> None:
    w = prefill(engine_id="seed")
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="now"), 1.0, HealthConfig())
    assert plan_handoff(w, transfer_id="t").remote_engine_id == "now"


def test_mooncake_survives_a_property_update() -> None:
    """Bug #7 seen from dispatch: after a labels update the handoff is unchanged."""
    w = prefill(bootstrap_port=9001, engine_id="e")
    before = plan_handoff(w, transfer_id="t")
    w.spec = apply_property_update(w.spec, {"labels": {"x": "y"}, "priority": 9})
    assert plan_handoff(w, transfer_id="t") == before


def test_mooncake_without_id_does_not_mint() -> None:
    plan = plan_handoff(prefill(), new_uuid=lambda: FIXED)
    assert plan.mint_skipped == MINT_NO_ENGINE_ID
    assert plan.prefill_params is None and plan.transfer_id is None and plan.decode_params() is None


def test_grpc_prefill_with_unknown_connector_does_not_mint() -> None:
    w = prefill("grpc://127.0.0.1:7000", engine_id="e")
    plan = plan_handoff(w)
    assert plan.connector is None and plan.mint_skipped == MINT_CONNECTOR_UNKNOWN
    assert plan.prefill_params is None and plan.decode_params({"a": 1}) is None


def test_grpc_prefill_learned_mooncake_uses_default_bootstrap_port() -> None:
    w = prefill("grpc://127.0.0.1:7000")
    apply_metadata_read(
        w,
        MetadataRead(ReadOutcome.COMPLETE, engine_id="g", connector="MooncakeConnector"),
        0.0,
        HealthConfig(),
    )
    plan = plan_handoff(w, transfer_id="t")
    assert plan.remote_bootstrap_addr == "http://127.0.0.1:8998" and plan.remote_engine_id == "g"


def test_nixl_tags_prefill_and_relays_verbatim() -> None:
    w = prefill(connector="nixl", engine_id="ignored")
    plan = plan_handoff(w, new_uuid=lambda: FIXED)
    assert plan.prefill_params == {"do_remote_decode": True, "do_remote_prefill": False}
    assert plan.transfer_id is None and plan.mint_skipped is None
    resp = {
        "do_remote_prefill": True,
        "remote_engine_id": "n1",
        "remote_request_id": "r",
        "remote_block_ids": [1, 2],
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
    }
    relayed = plan.decode_params(resp)
    assert relayed == resp and relayed is not resp
    assert plan.decode_params(None) is None and plan.decode_params({}) is None
    assert HandoffPlan.nixl_relay_problem(None) == NIXL_NO_PARAMS
    assert HandoffPlan.nixl_relay_problem(resp) is None


def test_connector_none_sends_nothing() -> None:
    plan = plan_handoff(prefill(connector="none", engine_id="e"))
    assert plan.prefill_params is None and plan.decode_params({"x": 1}) is None and plan.mint_skipped is None


@pytest.mark.parametrize(("dp_size", "rank", "want"), [(1, 0, "e"), (2, 0, "e_dp0"), (4, 3, "e_dp3")])
def test_ranked_engine_id(dp_size: int, rank: int, want: str) -> None:
    assert ranked_engine_id("e", dp_size, rank) == want


@pytest.mark.parametrize(("dp_size", "rank"), [(2, 2), (2, -1), (4, 9)])
def test_ranked_engine_id_rejects_bad_rank(dp_size: int, rank: int) -> None:
    with pytest.raises(ValueError, match="dp_rank"):
        ranked_engine_id("e", dp_size, rank)


def test_mooncake_dp_suffix() -> None:
    w = prefill(engine_id="e", dp_size=2)
    assert plan_handoff(w, transfer_id="t", dp_rank=1).remote_engine_id == "e_dp1"
    assert plan_handoff(prefill(engine_id="e"), transfer_id="t").remote_engine_id == "e"


def test_sanitize_prefill_body() -> None:
    body = {
        "model": "m",
        "prompt": "hi",
        "stream": True,
        "max_tokens": 50,
        "n": 3,
        "min_tokens": 10,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 40,
        "temperature": 0.0,
        "kv_transfer_params": {"client": "junk"},
        "stop": ["end"],
        "stop_token_ids": [2],
    }
    out = sanitize_prefill_body(body, {"do_remote_decode": True})
    assert out == {
        "model": "m",
        "prompt": "hi",
        "stream": False,
        "max_tokens": 1,
        "n": 1,
        "max_completion_tokens": 1,
        "temperature": 0.0,
        "ignore_eos": True,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    assert body["stream"] is True and body["max_tokens"] == 50  # the client's body is untouched


def test_sanitize_prefill_body_minimal_and_without_params() -> None:
    out = sanitize_prefill_body({"messages": [{"role": "user", "content": "x"}]}, None)
    assert out == {"messages": [{"role": "user", "content": "x"}], "stream": False, "max_tokens": 1, "n": 1,
                   "ignore_eos": True}
    assert "max_completion_tokens" not in out


def test_decode_body_carries_params_and_keeps_the_clients_request() -> None:
    body = {"prompt": "p", "stream": True, "max_tokens": 7, "kv_transfer_params": {"client": 1}}
    assert decode_body(body, {"t": 1}) == {
        "prompt": "p",
        "stream": True,
        "max_tokens": 7,
        "kv_transfer_params": {"t": 1},
    }
    assert decode_body(body, None) == {"prompt": "p", "stream": True, "max_tokens": 7}
