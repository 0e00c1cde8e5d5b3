"""gRPC surface: every VllmEngine RPC, grpc.health.v1, and the gRPC-visible faults."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from fake_engines import grpc_health
from fake_engines.core import tokenizer
from fake_engines.core.generator import expected_completion, seed_for_length, text_digest
from fake_engines.core.timing import TimingModel
from fake_engines.runtime import EngineHandle
from fake_engines.testing import loopback_config, running_engine
from pdchaos.proto import SERVICE_NAME, common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc
from pdchaos.waiting import poll_until

pb = vllm_engine_pb2


@pytest.fixture
async def engine() -> AsyncIterator[EngineHandle]:
    async with running_engine(loopback_config("prefill", "mooncake", dp_size=2)) as handle:
        yield handle


@pytest.fixture
async def stub(engine: EngineHandle) -> AsyncIterator[vllm_engine_pb2_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.grpc_port}") as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)


async def collect(call: grpc.aio.UnaryStreamCall) -> list[pb.GenerateResponse]:
    return [msg async for msg in call]


async def test_generate_non_streaming_text_input(stub: vllm_engine_pb2_grpc.VllmEngineStub) -> None:
    prompt = "[pdchaos:g:1] grpc text"
    req = pb.GenerateRequest(request_id="r1", text=prompt, sampling_params=pb.SamplingParams(max_tokens=5))
    (resp,) = await collect(stub.Generate(req, timeout=5))
    c = resp.complete
    assert tokenizer.decode(list(c.output_ids)) == expected_completion(prompt, 5)
    assert c.finish_reason == "length"
    assert c.prompt_tokens == len(tokenizer.encode(prompt))
    assert c.completion_tokens == 5
    assert not c.HasField("kv_transfer_params_json")


async def test_generate_streaming_tokenized(stub: vllm_engine_pb2_grpc.VllmEngineStub) -> None:
    prompt = "tokenized prompt"
    ids = tokenizer.encode(prompt)
    req = pb.GenerateRequest(
        request_id="r2",
        tokenized=pb.TokenizedInput(original_text=prompt, input_ids=ids),
        sampling_params=pb.SamplingParams(max_tokens=4, seed=3),
        stream=True,
    )
    msgs = await collect(stub.Generate(req, timeout=5))
    # vLLM DELTA: every token in a chunk (delta counts); the complete repeats the last delta.
    assert [m.WhichOneof("response") for m in msgs] == ["chunk"] * 4 + ["complete"]
    out = [t for m in msgs[:-1] for t in m.chunk.token_ids]
    assert tokenizer.decode(out) == expected_completion(prompt, 4, seed=3)
    assert [m.chunk.completion_tokens for m in msgs[:-1]] == [1, 1, 1, 1]
    assert list(msgs[-1].complete.output_ids) == out[-1:]
    assert msgs[-1].complete.completion_tokens == 4


async def test_generate_mooncake_prefill_leg_holds_kv_and_returns_no_params(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub
) -> None:
    # vLLM's Mooncake prefill returns no kv_transfer_params: the router mints the decode's (DESIGN.md).
    kv = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "xfer-g"}
    req = pb.GenerateRequest(
        request_id="r3",
        text="prefill via grpc",
        kv_transfer_params_json=json.dumps(kv),
        sampling_params=pb.SamplingParams(max_tokens=1, ignore_eos=True),
    )
    (resp,) = await collect(stub.Generate(req, timeout=5))
    assert resp.complete.kv_transfer_params_json == ""
    assert "xfer-g" in engine.engine.store
    assert engine.engine.records[-1]["kind"] == "prefill"


@pytest.mark.parametrize(
    "req",
    [
        pb.GenerateRequest(request_id="bad1"),
        pb.GenerateRequest(request_id="bad2", text="x", kv_transfer_params_json="{nope"),
        pb.GenerateRequest(request_id="bad3", tokenized=pb.TokenizedInput(input_ids=[4_000_000])),
        pb.GenerateRequest(request_id="bad4", text="x", sampling_params=pb.SamplingParams(max_tokens=0)),
    ],
)
async def test_generate_bad_input(stub: vllm_engine_pb2_grpc.VllmEngineStub, req: pb.GenerateRequest) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await collect(stub.Generate(req, timeout=5))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_fail_requests_maps_to_grpc_status(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub
) -> None:
    engine.engine.faults.apply_spec({"fault": "fail_requests", "count": 1, "status": 503})
    req = pb.GenerateRequest(request_id="f", text="x", sampling_params=pb.SamplingParams(max_tokens=1))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await collect(stub.Generate(req, timeout=5))
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(await collect(stub.Generate(req, timeout=5))) == 1


async def test_health_model_server_info_loads(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub
) -> None:
    health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)
    assert health.healthy
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
    assert (Path(info.model_path) / "tokenizer.json").is_file()
    assert info.served_model_name == "pdchaos-fake"
    assert list(info.eos_token_ids) == [tokenizer.eos_token_id()]
    assert info.vocab_size == tokenizer.vocab_size()
    si = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert si.kv_connector == "MooncakeConnector"
    assert si.kv_role == "kv_producer"
    assert si.kv_engine_id == engine.engine_id
    assert si.data_parallel_size == 2
    assert (si.block_size, si.kv_cache_dtype, si.model_dtype, si.server_type) == (
        16,
        "auto",
        "torch.bfloat16",
        "vllm-grpc",
    )
    assert si.uptime_seconds >= 0
    loads = await stub.GetLoads(pb.GetLoadsRequest(), timeout=5)
    assert loads.dp_rank_count == 2 and [ld.dp_rank for ld in loads.loads] == [0, 1]
    one = await stub.GetLoads(pb.GetLoadsRequest(dp_rank=1), timeout=5)
    assert [ld.dp_rank for ld in one.loads] == [1]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetLoads(pb.GetLoadsRequest(dp_rank=5), timeout=5)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_server_info_uptime_goes_backwards_on_restart(engine: EngineHandle) -> None:
    await asyncio.sleep(0.2)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.grpc_port}") as ch:
        before = await vllm_engine_pb2_grpc.VllmEngineStub(ch).GetServerInfo(
            pb.GetServerInfoRequest(), timeout=5
        )
    await engine.restart()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.grpc_port}") as ch:
        after = await vllm_engine_pb2_grpc.VllmEngineStub(ch).GetServerInfo(
            pb.GetServerInfoRequest(), timeout=5
        )
    assert after.uptime_seconds < before.uptime_seconds
    assert after.kv_engine_id != before.kv_engine_id


async def test_get_tokenizer_zip(stub: vllm_engine_pb2_grpc.VllmEngineStub) -> None:
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=5)]
    assert all(c.sha256 == "" for c in chunks[:-1])
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert sorted(names) == ["config.json", "tokenizer.json", "tokenizer_config.json"]


async def test_abort_cancels_in_flight(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub
) -> None:
    engine.engine.timing = TimingModel(ttft_ms=5000.0)
    req = pb.GenerateRequest(request_id="slow", text="x", sampling_params=pb.SamplingParams(max_tokens=1))
    call = stub.Generate(req, timeout=5)
    assert await poll_until(lambda: "slow" in engine.engine._inflight, 1.0, 0.02)
    await stub.Abort(pb.AbortRequest(request_ids=["slow", "unknown"]), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await collect(call)
    assert exc.value.code() == grpc.StatusCode.CANCELLED
    assert "slow" not in engine.engine._inflight
    assert engine.engine.records == []


async def test_unimplemented_rpcs(stub: vllm_engine_pb2_grpc.VllmEngineStub) -> None:
    calls = [
        stub.Embed(pb.EmbedRequest(), timeout=5),
        stub.FlushCache(common_pb2.FlushCacheRequest(), timeout=5),
        stub.StartProfile(common_pb2.StartProfileRequest(), timeout=5),
        stub.StopProfile(common_pb2.StopProfileRequest(), timeout=5),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call
        assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await collect(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=5))
    assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_fail_server_info_is_a_partial_read(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub
) -> None:
    engine.engine.faults.apply_spec({"fault": "fail_server_info"})
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)).served_model_name == "pdchaos-fake"
    engine.engine.faults.clear("fail_server_info")
    assert (await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)).kv_engine_id == engine.engine_id


async def test_no_engine_id_fault(engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub) -> None:
    engine.engine.faults.apply_spec({"fault": "no_engine_id"})
    si = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert si.kv_engine_id == ""
    assert si.kv_connector == "MooncakeConnector"


async def test_wedged_server_info_answers_nothing(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub
) -> None:
    engine.engine.faults.apply_spec({"fault": "wedge", "surface": "server_info"})
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=0.3)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=2)).healthy
    assert (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=2)).vocab_size > 0
    # A parked call completes once the wedge is healed (like SIGCONT).
    parked = asyncio.ensure_future(stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5))
    await asyncio.sleep(0.1)
    assert not parked.done()
    engine.engine.faults.clear("wedge")
    assert (await parked).kv_engine_id == engine.engine_id


async def test_standard_grpc_health(engine: EngineHandle) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.grpc_port}") as ch:
        check = ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=grpc_health.encode_request,
            response_deserializer=grpc_health.decode_response,
        )
        assert await check("", timeout=5) == grpc_health.SERVING
        assert await check(SERVICE_NAME, timeout=5) == grpc_health.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await check("no.such.Service", timeout=5)
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND
        watch = ch.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=grpc_health.encode_request,
            response_deserializer=grpc_health.decode_response,
        )
        stream = watch("", timeout=5)
        assert await stream.read() == grpc_health.SERVING
        engine.die(exit_after_s=30)
        assert await check("", timeout=5) == grpc_health.NOT_SERVING
        assert await stream.read() == grpc_health.NOT_SERVING
        stream.cancel()
        stub = vllm_engine_pb2_grpc.VllmEngineStub(ch)
        assert not (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)).healthy


def test_health_codec_round_trip_and_bad_bytes() -> None:
    assert grpc_health.decode_request(grpc_health.encode_request("a.B")) == "a.B"
    assert grpc_health.decode_request(b"") == ""
    # An unknown varint field (2) is skipped.
    assert grpc_health.decode_request(b"\x10\x05" + grpc_health.encode_request("x")) == "x"
    for status in (grpc_health.UNKNOWN, grpc_health.SERVING, grpc_health.NOT_SERVING):
        assert grpc_health.decode_response(grpc_health.encode_response(status)) == status
    with pytest.raises(ValueError):
        grpc_health.decode_request(b"\x0a\x05ab")
    with pytest.raises(ValueError):
        grpc_health.decode_request(b"\x0a")


async def test_abort_ends_a_stream_between_tokens_with_finish_reason_abort(
    stub: vllm_engine_pb2_grpc.VllmEngineStub,
) -> None:
    # vLLM's servicer ends an aborted stream with a complete message, finish_reason "abort".
    req = pb.GenerateRequest(request_id="long", text="a long answer", stream=True,
                             sampling_params=pb.SamplingParams(max_tokens=400))
    kinds = []
    async for m in stub.Generate(req, timeout=10):
        kinds.append(m.WhichOneof("response"))
        if len(kinds) == 1:
            await stub.Abort(pb.AbortRequest(request_ids=["long"]), timeout=5)
        if m.WhichOneof("response") == "complete":
            assert m.complete.finish_reason == "abort"
            assert m.complete.completion_tokens == kinds.count("chunk") < 400
    assert kinds[-1] == "complete"


async def test_past_the_context_the_engine_stops_at_its_end(
    stub: vllm_engine_pb2_grpc.VllmEngineStub,
) -> None:
    # No OpenAI layer under the gRPC servicer refuses max_tokens past the context: generation stops there.
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
    tok = tokenizer.encode("x")[0]
    near = pb.GenerateRequest(request_id="near", tokenized=pb.TokenizedInput(
        input_ids=[tok] * (info.max_context_length - 3)), sampling_params=pb.SamplingParams(max_tokens=50))
    (resp,) = await collect(stub.Generate(near, timeout=30))
    assert (resp.complete.finish_reason, resp.complete.completion_tokens) == ("length", 3)
    full = pb.GenerateRequest(request_id="full", tokenized=pb.TokenizedInput(
        input_ids=[tok] * info.max_context_length), sampling_params=pb.SamplingParams(max_tokens=1))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await collect(stub.Generate(full, timeout=30))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_nixl_prefill_leg_also_sets_the_typed_params() -> None:
    async with running_engine(loopback_config("prefill", "nixl")) as p, grpc.aio.insecure_channel(
            f"127.0.0.1:{p.grpc_port}") as ch:
        req = pb.GenerateRequest(request_id="pre", text="prefill me", sampling_params=pb.SamplingParams(
            max_tokens=1), kv_transfer_params_json=json.dumps({"do_remote_decode": True}))
        (resp,) = await collect(vllm_engine_pb2_grpc.VllmEngineStub(ch).Generate(req, timeout=5))
        params = json.loads(resp.complete.kv_transfer_params_json)
        typed = resp.complete.kv_transfer_params
        assert (typed.remote_host, typed.remote_port) == (params["remote_host"], params["remote_port"])


async def test_an_answer_ends_at_end_of_sequence_unless_told_to_ignore_it(
    stub: vllm_engine_pb2_grpc.VllmEngineStub,
) -> None:
    # The output ids end with end of sequence (it counts as a token), finish_reason "stop"; the router
    # leaves it out of the text. With ignore_eos the same draw goes on to the cap.
    text = "[pdchaos:t:9] where does it end"
    seed = seed_for_length(text_digest(text), 2)
    for ignore, finish, count in ((False, "stop", 3), (True, "length", 6)):
        req = pb.GenerateRequest(request_id=f"eos-{ignore}", text=text, sampling_params=pb.SamplingParams(
            max_tokens=6, seed=seed, ignore_eos=ignore))
        (resp,) = await collect(stub.Generate(req, timeout=10))
        done = resp.complete
        ids = list(done.output_ids)
        assert (done.finish_reason, done.completion_tokens, len(ids)) == (finish, count, count)
        assert ids[2] == tokenizer.eos_token_id()
        # The words before it are the answer the harness predicts.
        assert tokenizer.decode(ids[:2]) == expected_completion(text, 6, seed)
