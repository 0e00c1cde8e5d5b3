"""The gRPC fidelity probes' reductions of what came back (pure)."""

from __future__ import annotations

import json

from harness.fidelity.grpc_probes import (
    complete_of,
    fields_set,
    message_kinds,
    near_context_request,
    params_of,
)
from harness.fidelity.observe import ANSWER_BUDGET_S, GrpcAnswer, grpc_outcome
from pdchaos.proto import vllm_engine_pb2 as pb


def _chunk() -> pb.GenerateResponse:
    return pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[5]))


def _complete(**kw: object) -> pb.GenerateResponse:
    return pb.GenerateResponse(complete=pb.GenerateComplete(**kw))


def test_outcome_hides_a_successs_time_and_classes_a_failures() -> None:
    assert grpc_outcome(GrpcAnswer("OK", [], 9.0)) == "OK"
    assert grpc_outcome(GrpcAnswer("INVALID_ARGUMENT", [], 0.01)) == "INVALID_ARGUMENT, fast"
    assert grpc_outcome(GrpcAnswer("INTERNAL", [], 5.2)) == "INTERNAL, after a wait"
    assert grpc_outcome(GrpcAnswer("DEADLINE_EXCEEDED", [], None)) == f"no answer in {ANSWER_BUDGET_S:g} s"


def test_message_kinds_say_the_streams_shape() -> None:
    assert message_kinds(GrpcAnswer("OK", [])) == "no messages"
    assert message_kinds(GrpcAnswer("OK", [_complete()])) == "ends with complete"
    assert message_kinds(GrpcAnswer("OK", [_chunk(), _complete()])) == "one chunk, ends with complete"
    assert message_kinds(GrpcAnswer("OK", [_chunk(), _chunk()])) == "chunks, ends with chunk"


def test_params_come_from_the_json_field_only_when_it_is_an_object() -> None:
    good = GrpcAnswer("OK", [_complete(kv_transfer_params_json=json.dumps({"remote_port": 3}))])
    assert params_of(complete_of(good)) == {"remote_port": 3}
    assert params_of(complete_of(GrpcAnswer("OK", [_complete(kv_transfer_params_json="[1]")]))) is None
    assert params_of(complete_of(GrpcAnswer("OK", [_complete(kv_transfer_params_json="{bad")]))) is None
    assert complete_of(GrpcAnswer("OK", [_chunk()])) is None and params_of(None) is None
    assert fields_set(pb.GenerateComplete(finish_reason="length", completion_tokens=2)) == (
        "completion_tokens,finish_reason")
    assert fields_set(None) == "none"


def test_near_context_request_leaves_the_room_asked_for() -> None:
    req = near_context_request(100, room=4, max_tokens=50)
    assert len(req.tokenized.input_ids) == 96 and req.sampling_params.max_tokens == 50
    assert len(near_context_request(100, room=0, max_tokens=1).tokenized.input_ids) == 100
