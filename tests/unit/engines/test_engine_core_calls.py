"""Engine call records (`fake_engines.core.calls`): the record, the caller, the shape of a leg."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fake_engines.core.calls import (
    CALLS,
    ENGINE_CALL,
    HARNESS,
    HEALTH,
    ROUTER,
    caller_of,
    engine_caller,
    is_call_record,
    leg_of_openai,
    leg_shape,
    make_call,
    tag_of_openai,
)

KV = {
    "do_remote_decode": False,
    "do_remote_prefill": True,
    "transfer_id": "x1",
    "remote_engine_id": "e0",
    "remote_bootstrap_addr": "http://p:8998",
    "remote_block_ids": [1, 2, 3],  # long and the same for every correct router: left out
}


def call(**over: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        ts=10.0, engine="p0", engine_id="e0", generation=2, role="prefill", call=HEALTH, status=200,
        duration_s=0.25, caller=HARNESS, detail={"healthy": True},
    )
    fields.update(over)
    return make_call(**fields)


def test_make_call_has_the_record_keys() -> None:
    rec = call()
    assert rec == {
        "record": ENGINE_CALL, "ts": 10.0, "engine": "p0", "engine_id": "e0", "generation": 2,
        "role": "prefill", "call": "health", "status": 200, "duration_s": 0.25, "caller": "harness",
        "detail": {"healthy": True},
    }  # fmt: skip
    assert is_call_record(rec)
    assert json.loads(json.dumps(rec)) == rec


def test_make_call_copies_the_detail_and_defaults_it_empty() -> None:
    detail = {"healthy": False}
    rec = call(detail=detail)
    detail["healthy"] = True
    assert rec["detail"] == {"healthy": False}
    assert call(detail=None)["detail"] == {}


@pytest.mark.parametrize("name", ["Health", "generation", "", "control"])
def test_make_call_refuses_an_unknown_call(name: str) -> None:
    with pytest.raises(ValueError, match="call must be one of"):
        call(call=name)


def test_every_call_name_is_accepted() -> None:
    assert {call(call=name)["call"] for name in CALLS} == set(CALLS)


def test_a_handoff_record_is_not_a_call_record() -> None:
    assert not is_call_record({"kind": "prefill", "outcome": "computed"})
    assert not is_call_record({"record": "handoff"})


@pytest.mark.parametrize(
    ("value", "caller"),
    [(None, ROUTER), ("", ROUTER), ("   ", ROUTER), ("harness", HARNESS), (" harness ", HARNESS),
     ("engine:d0", "engine:d0")],
)  # fmt: skip
def test_caller_of(value: str | None, caller: str) -> None:
    assert caller_of(value) == caller


def test_engine_caller() -> None:
    assert engine_caller("d0") == "engine:d0"


def test_leg_shape_leaves_out_what_a_surface_cannot_tell_from_its_default() -> None:
    assert leg_shape() == {"stream": False}
    assert leg_shape(stream=None, max_tokens=None, min_tokens=0, n=1, ignore_eos=False) == {"stream": False}
    assert leg_shape(n=0) == {"stream": False}  # proto3's unset n


def test_leg_shape_keeps_what_was_told() -> None:
    shape = leg_shape(stream=1, max_tokens=1, min_tokens=2, n=3, ignore_eos=True,
                      stream_options={"include_usage": True}, kv_transfer_params=KV)
    assert shape == {
        "stream": True, "max_tokens": 1, "min_tokens": 2, "n": 3, "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "kv_transfer_params": {k: v for k, v in KV.items() if k != "remote_block_ids"},
    }  # fmt: skip
    assert leg_shape(max_tokens=0)["max_tokens"] == 0  # a bad value is evidence too


def test_leg_shape_keeps_kv_params_that_are_not_an_object_as_sent() -> None:
    assert leg_shape(kv_transfer_params="not json")["kv_transfer_params"] == "not json"
    assert leg_shape(kv_transfer_params={})["kv_transfer_params"] == {}


def test_leg_of_openai_completion() -> None:
    body = {"prompt": "hi", "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True},
            "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "t"}, "temperature": 0.0}
    assert leg_of_openai(body, chat=False) == {
        "stream": True, "max_tokens": 1, "stream_options": {"include_usage": True},
        "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "t"},
    }  # fmt: skip


def test_leg_of_openai_chat_reads_max_completion_tokens_first() -> None:
    body = {"messages": [], "max_completion_tokens": 4, "max_tokens": 9}
    assert leg_of_openai(body, chat=True)["max_tokens"] == 4
    assert leg_of_openai({"messages": [], "max_tokens": 9}, chat=True)["max_tokens"] == 9
    # A completion has no max_completion_tokens: only max_tokens counts.
    assert leg_of_openai(body, chat=False)["max_tokens"] == 9


def test_leg_of_openai_grpc_drops_stream_options() -> None:
    body = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert leg_of_openai(body, chat=False, grpc=True) == {"stream": True, "ignore_eos": True}
    # The same leg told over either surface: one shape, once the HTTP-only field is gone.
    http = leg_of_openai(body, chat=False)
    del http["stream_options"]
    assert http == leg_of_openai(body, chat=False, grpc=True)


def test_leg_of_openai_takes_a_malformed_body_as_it_is() -> None:
    body = {"prompt": 5, "stream": "yes", "n": [], "min_tokens": {"a": 1}, "kv_transfer_params": [1]}
    assert leg_of_openai(body, chat=False) == {
        "stream": True, "n": [], "min_tokens": {"a": 1}, "kv_transfer_params": [1],
    }  # fmt: skip


def test_leg_shape_lists_the_fields_and_kv_keys_vllm_would_pass_by() -> None:
    # A misspelt field or KV key is lost without an error in vLLM: the shape keeps its name.
    body = {"prompt": "hi", "max_tokens": 1, "N": 1, "max_completion_tokens": 1, "temperature": 0.0,
            "kv_transfer_params": {"do_remote_prefill": True, "DO_REMOTE_DECODE": False, "tp_size": 1}}
    shape = leg_of_openai(body, chat=False)
    assert shape["ignored"] == ["N", "kv_transfer_params.DO_REMOTE_DECODE", "max_completion_tokens"]
    # A chat body knows max_completion_tokens; a gRPC request carries no field the proto lacks, but its
    # KV params are free-form.
    assert leg_of_openai({**body, "messages": []}, chat=True)["ignored"] == [
        "N", "kv_transfer_params.DO_REMOTE_DECODE", "prompt"]
    assert leg_of_openai(body, chat=False, grpc=True)["ignored"] == ["kv_transfer_params.DO_REMOTE_DECODE"]
    assert "ignored" not in leg_of_openai({"prompt": "hi", "kv_transfer_params": KV}, chat=False)


@pytest.mark.parametrize(
    ("body", "tag"),
    [
        ({"prompt": "[pdchaos:a:1] hello"}, "[pdchaos:a:1]"),
        ({"prompt": ["x [pdchaos:b:2]", "[pdchaos:c:3]"]}, "[pdchaos:b:2]"),
        ({"prompt": [[1, 2, 3]]}, None),
        ({"prompt": "no tag"}, None),
        ({"messages": [{"role": "system", "content": "sys"},
                       {"role": "user", "content": "[pdchaos:m:4] q"}]}, "[pdchaos:m:4]"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "[pdchaos:x]"}]}]}, None),
        ({"messages": "not a list"}, None),
        ({"messages": ["not a message", {"content": None}]}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_tag_of_openai(body: dict[str, object], tag: str | None) -> None:
    assert tag_of_openai(body) == tag
