"""Engine call records (CONTRACTS.md §1): every call a real in-process fake engine answers, as its records
file has it (handoff records for served legs, `engine_call` records for the rest)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from fake_engines import grpc_health
from fake_engines.core import tokenizer
from fake_engines.core.calls import (
    CALLER_HEADER,
    CALLER_METADATA,
    CLIENT_GONE,
    HARNESS,
    ROUTER,
    is_call_record,
)
from fake_engines.core.timing import TimingModel
from fake_engines.runtime import EngineHandle
from fake_engines.testing import loopback_config, running_engine
from harness.routers.gateways.kv_facts import read_query
from harness.worlds.real.probes import grpc_health_probe, http_probe, tcp_probe
from pdchaos.jsonl import read_jsonl
from pdchaos.proto import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc
from pdchaos.sse import parse_sse
from pdchaos.waiting import poll_until

pb = vllm_engine_pb2
HARNESS_MD = ((CALLER_METADATA, HARNESS),)


def calls(path: Path, call: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if is_call_record(r) and call in (None, r["call"])]


def handoffs(path: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if not is_call_record(r)]


@pytest.fixture
def records(tmp_path: Path) -> Path:
    return tmp_path / "engine.jsonl"


@pytest.fixture
async def engine(records: Path) -> AsyncIterator[EngineHandle]:
    async with running_engine(loopback_config("prefill", "mooncake", name="p0", records=str(records))) as h:
        yield h


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


@pytest.fixture
async def stub(engine: EngineHandle) -> AsyncIterator[vllm_engine_pb2_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.grpc_port}") as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)


# -- HTTP probes and metadata --------------------------------------------------------------------------------


async def test_health_probe_records_its_caller_status_and_times(
    engine: EngineHandle, session: aiohttp.ClientSession, records: Path
) -> None:
    # Latency on the gate: the call is stamped when it arrived, before the gate held it.
    engine.engine.faults.apply_spec({"fault": "latency", "surface": "health", "ms": 200})
    before = time.time()
    async with session.get(engine.url() + "/health", headers={CALLER_HEADER: HARNESS}) as r:
        assert r.status == 200
    async with session.get(engine.url() + "/health") as r:
        assert r.status == 200
    after = time.time()
    probe, routed = calls(records, "health")
    assert (probe["caller"], routed["caller"]) == (HARNESS, ROUTER)
    for rec in (probe, routed):
        assert rec["status"] == 200 and rec["detail"] == {"healthy": True}
        assert rec["engine"] == "p0" and rec["engine_id"] == engine.engine_id and rec["generation"] == 1
        assert rec["role"] == "prefill"
        assert rec["duration_s"] >= 0.19
        assert before <= rec["ts"] < rec["ts"] + rec["duration_s"] <= after
    assert probe["ts"] + probe["duration_s"] <= routed["ts"]
    assert engine.engine.records == []  # the handoff records (/control/records) keep no calls


async def test_unhealthy_health_and_metadata_reads(
    engine: EngineHandle, session: aiohttp.ClientSession, records: Path
) -> None:
    for path in ("/v1/models", "/version", "/metrics"):
        async with session.get(engine.url() + path) as r:
            assert r.status == 200
    engine.engine.state.die()
    async with session.get(engine.url() + "/health") as r:
        assert r.status == 503
    got = [(c["call"], c["status"], c["detail"]) for c in calls(records)]
    assert got == [
        ("models", 200, {}), ("version", 200, {}), ("metrics", 200, {}), ("health", 503, {"healthy": False}),
    ]  # fmt: skip


async def test_wedged_health_whose_caller_gives_up(
    engine: EngineHandle, session: aiohttp.ClientSession, records: Path
) -> None:
    # aiohttp does not cancel a handler whose caller hung up: it is recorded when the wedge lifts, gone,
    # and timed to when its caller left (how long the caller held it), not to the lift.
    engine.engine.faults.apply_spec({"fault": "wedge", "surface": "health"})
    with pytest.raises(TimeoutError):
        async with session.get(engine.url() + "/health", timeout=aiohttp.ClientTimeout(total=0.2)):
            pass
    await asyncio.sleep(0.4)
    assert calls(records) == []
    engine.engine.faults.clear("wedge")
    assert await poll_until(lambda: bool(calls(records)), 2.0, 0.02)
    (rec,) = calls(records)
    assert rec["call"] == "health" and rec["status"] == CLIENT_GONE
    assert 0.19 <= rec["duration_s"] < 0.45, rec


async def test_calls_still_parked_when_the_engine_stops_are_recorded(records: Path) -> None:
    async with running_engine(loopback_config(records=str(records))) as engine:
        engine.engine.faults.apply_spec({"fault": "wedge", "surface": "all"})
        async with aiohttp.ClientSession() as s:
            # One caller gave up (its handler outlives the connection), one still waits.
            with pytest.raises(TimeoutError):
                await s.get(engine.url() + "/health", timeout=aiohttp.ClientTimeout(total=0.2))
            waiting = asyncio.create_task(s.get(engine.url() + "/version"))
            await asyncio.sleep(0.2)
            await engine.close()
            with pytest.raises(aiohttp.ClientError):
                await waiting
    got = sorted((c["call"], c["status"]) for c in calls(records))
    assert got == [("health", CLIENT_GONE), ("version", CLIENT_GONE)]


# -- gRPC ----------------------------------------------------------------------------------------------------


async def test_grpc_health_and_server_info(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub, records: Path
) -> None:
    assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5, metadata=HARNESS_MD)).healthy
    info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    engine.engine.faults.apply_spec({"fault": "fail_server_info"})
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    engine.engine.state.die()
    assert not (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)).healthy
    health, served, failed, dead = calls(records)
    assert (health["call"], health["caller"], health["status"]) == ("grpc_health", HARNESS, 200)
    assert health["detail"] == {"healthy": True}
    assert (served["call"], served["caller"], served["status"]) == ("server_info", ROUTER, 200)
    assert served["detail"] == {"kv_engine_id": info.kv_engine_id} and info.kv_engine_id == engine.engine_id
    assert (failed["call"], failed["status"], failed["detail"]) == ("server_info", 503, {})
    # Unhealthy is an answer: the RPC itself succeeded.
    assert (dead["call"], dead["status"], dead["detail"]) == ("grpc_health", 200, {"healthy": False})


async def test_grpc_metadata_reads_and_abort(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, records: Path
) -> None:
    await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
    await stub.GetLoads(pb.GetLoadsRequest(), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.GetLoads(pb.GetLoadsRequest(dp_rank=7), timeout=5)
    assert [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=5)]
    await stub.Abort(pb.AbortRequest(request_ids=["a", "b"]), timeout=5)
    got = [(c["call"], c["status"]) for c in calls(records)]
    assert got == [("model_info", 200), ("loads", 200), ("loads", 400), ("tokenizer", 200), ("abort", 200)]
    assert calls(records, "abort")[0]["detail"] == {"request_ids": ["a", "b"]}


async def test_wedged_grpc_health_past_its_deadline_is_client_gone(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub, records: Path
) -> None:
    engine.engine.faults.apply_spec({"fault": "wedge", "surface": "health"})
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.HealthCheck(pb.HealthCheckRequest(), timeout=0.2)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await poll_until(lambda: bool(calls(records)), 2.0, 0.02)
    (rec,) = calls(records)
    assert (rec["call"], rec["status"], rec["detail"]) == ("grpc_health", CLIENT_GONE, {})
    assert rec["duration_s"] >= 0.15


async def test_standard_grpc_health_check_and_watch(engine: EngineHandle, records: Path) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.grpc_port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=grpc_health.encode_request,
            response_deserializer=grpc_health.decode_response,
        )
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=grpc_health.encode_request,
            response_deserializer=grpc_health.decode_response,
        )
        assert await check("", timeout=5, metadata=HARNESS_MD) == grpc_health.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            await check("no.such.Service", timeout=5)
        stream = watch("", timeout=5)
        assert await stream.read() == grpc_health.SERVING
        await asyncio.sleep(0.3)  # the Watch looks again: still one record, at its start
        stream.cancel()
    got = [(c["call"], c["caller"], c["status"], c["detail"]) for c in calls(records)]
    assert got == [
        ("grpc_health_v1", HARNESS, 200, {"service": "", "watch": False, "healthy": True}),
        ("grpc_health_v1", ROUTER, 404, {"service": "no.such.Service", "watch": False}),
        ("grpc_health_v1", ROUTER, 200, {"service": "", "watch": True, "healthy": True}),
    ]  # fmt: skip


# -- generation legs -----------------------------------------------------------------------------------------


async def test_refused_http_legs_are_generate_calls(
    engine: EngineHandle, session: aiohttp.ClientSession, records: Path
) -> None:
    url = engine.url() + "/v1/completions"
    async with session.post(url, data=b"{not json", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
    wrong_model = {"model": "other", "prompt": "[pdchaos:w:1] hi", "max_tokens": 2, "stream": True}
    async with session.post(url, json=wrong_model) as r:
        assert r.status == 404
    engine.engine.faults.apply_spec({"fault": "fail_requests", "count": 2, "status": 503})
    failed = {"prompt": "[pdchaos:f:2] hi", "max_tokens": 1, "request_id": "req-f",
              "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "t-f"}}
    async with session.post(url, json=failed) as r:
        assert r.status == 503
    chat = {"messages": [{"role": "user", "content": "[pdchaos:f:3] hi"}], "max_completion_tokens": 4,
            "stream": True}
    async with session.post(engine.url() + "/v1/chat/completions", json=chat) as r:
        assert r.status == 200  # refused after its headers: the error chunk tells
        assert parse_sse(await r.text()).chunks[0]["error"]["code"] == 503
    bad_json, model, injected, streamed = calls(records, "generate")
    assert (bad_json["status"], bad_json["caller"]) == (400, ROUTER)
    assert bad_json["detail"]["leg"] is None and bad_json["detail"]["tag"] is None
    assert "malformed JSON" in bad_json["detail"]["error"]
    assert model["status"] == 404 and model["detail"]["tag"] == "[pdchaos:w:1]"
    assert model["detail"]["leg"] == {"stream": True, "max_tokens": 2}
    assert injected["status"] == 503 and injected["detail"]["request_id"] == "req-f"
    assert injected["detail"]["tag"] == "[pdchaos:f:2]"
    assert injected["detail"]["leg"] == {
        "stream": False, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "t-f"},
    }  # fmt: skip
    assert streamed["status"] == 503 and streamed["detail"]["tag"] == "[pdchaos:f:3]"
    assert streamed["detail"]["leg"] == {"stream": True, "max_tokens": 4}
    assert handoffs(records) == []


async def test_served_http_prefill_leg_carries_its_shape(
    session: aiohttp.ClientSession, engine: EngineHandle, records: Path
) -> None:
    body = {"prompt": "[pdchaos:s:1] hand me off", "max_tokens": 1, "stream": True,
            "stream_options": {"include_usage": True},
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "x1"}}
    async with session.post(engine.url() + "/v1/completions", json=body) as r:
        assert r.status == 200
        await r.read()
    (rec,) = handoffs(records)
    assert rec["kind"] == "prefill" and rec["tag"] == "[pdchaos:s:1]"
    assert rec["leg"] == {
        "stream": True, "max_tokens": 1, "stream_options": {"include_usage": True},
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "x1"},
    }  # fmt: skip
    assert calls(records) == []  # a served leg leaves its handoff record only


async def test_fields_vllm_passes_by_are_logged_and_kept_on_the_leg(
    session: aiohttp.ClientSession, engine: EngineHandle, records: Path, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"prompt": "[pdchaos:s:2] hand me off", "max_tokens": 1, "N": 1,
            "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "x2", "Transfer_Id": "x2"}}
    with caplog.at_level("WARNING", logger="fake_engines.http_api"):
        async with session.post(engine.url() + "/v1/completions", json=body) as r:
            assert r.status == 200  # served all the same, as vLLM serves it
            await r.read()
    (rec,) = handoffs(records)
    assert rec["leg"]["ignored"] == ["N", "kv_transfer_params.Transfer_Id"]
    # vLLM's own line names the body's unknown fields (its KV keys go unmentioned).
    assert "The following fields were present in the request but ignored: {'N'}" in caplog.text


async def test_grpc_served_leg_keeps_max_tokens_as_sent(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub, records: Path
) -> None:
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
    tok = tokenizer.encode("x")[0]
    near = pb.GenerateRequest(
        request_id="near",
        tokenized=pb.TokenizedInput(input_ids=[tok] * (info.max_context_length - 3)),
        sampling_params=pb.SamplingParams(max_tokens=50, ignore_eos=True),
        kv_transfer_params_json=json.dumps({"do_remote_decode": True, "transfer_id": "t-near"}),
    )
    (resp,) = [m async for m in stub.Generate(near, timeout=30)]
    assert resp.complete.completion_tokens == 3  # clamped to the context by the servicer
    (rec,) = handoffs(records)
    assert rec["leg"] == {
        "stream": False, "max_tokens": 50, "ignore_eos": True,
        "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "t-near"},
    }  # fmt: skip


async def test_grpc_refused_and_cut_legs(
    engine: EngineHandle, stub: vllm_engine_pb2_grpc.VllmEngineStub, records: Path
) -> None:
    bad = pb.GenerateRequest(request_id="bad", text="[pdchaos:g:1] hi", stream=True,
                             sampling_params=pb.SamplingParams(max_tokens=2), kv_transfer_params_json="{nope")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        _ = [m async for m in stub.Generate(bad, timeout=5, metadata=HARNESS_MD)]
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A leg whose caller gives up mid-prefill is cut: no handoff record, a generate call gone.
    engine.engine.timing = TimingModel(ttft_ms=5000.0)
    slow = pb.GenerateRequest(request_id="slow", text="[pdchaos:g:2] hi",
                              sampling_params=pb.SamplingParams(max_tokens=1))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        _ = [m async for m in stub.Generate(slow, timeout=0.3)]
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # An aborted one ends 499 too (the engine's own answer: cancelled).
    aborted = stub.Generate(pb.GenerateRequest(request_id="ab", text="[pdchaos:g:3] hi",
                                               sampling_params=pb.SamplingParams(max_tokens=1)), timeout=5)
    assert await poll_until(lambda: "ab" in engine.engine._inflight, 2.0, 0.02)
    await stub.Abort(pb.AbortRequest(request_ids=["ab"]), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError):
        _ = [m async for m in aborted]
    assert await poll_until(lambda: len(calls(records, "generate")) == 3, 2.0, 0.02)
    refused, cut, ab = calls(records, "generate")
    assert (refused["status"], refused["caller"], refused["detail"]["request_id"]) == (400, HARNESS, "bad")
    assert refused["detail"]["tag"] == "[pdchaos:g:1]"
    assert refused["detail"]["leg"] == {"stream": True, "max_tokens": 2, "kv_transfer_params": "{nope"}
    assert (cut["status"], cut["detail"]["request_id"], cut["detail"]["tag"]) == (CLIENT_GONE, "slow",
                                                                                 "[pdchaos:g:2]")
    assert cut["detail"]["leg"] == {"stream": False, "max_tokens": 1}
    assert cut["duration_s"] >= 0.25
    assert (ab["status"], ab["detail"]["request_id"]) == (CLIENT_GONE, "ab")
    assert handoffs(records) == []


async def test_mooncake_bootstrap_lookup_is_the_decodes(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    pcfg = loopback_config("prefill", "mooncake", name="p0", records=str(tmp_path / "p.jsonl"))
    dcfg = loopback_config("decode", "mooncake", name="d0", records=str(tmp_path / "d.jsonl"))
    async with running_engine(pcfg) as p, running_engine(dcfg) as d:
        prompt = "[pdchaos:b:1] a prompt to hand off"
        kv = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "xb"}
        async with session.post(p.url() + "/v1/completions",
                                json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": kv}) as r:
            assert r.status == 200
        kv = {"do_remote_decode": False, "do_remote_prefill": True, "transfer_id": "xb",
              "remote_engine_id": p.engine_id, "remote_bootstrap_addr": f"http://127.0.0.1:{p.bootstrap_port}"}
        async with session.post(d.url() + "/v1/completions",
                                json={"prompt": prompt, "max_tokens": 2, "kv_transfer_params": kv}) as r:
            assert r.status == 200
        async with session.get(f"http://127.0.0.1:{p.bootstrap_port}/query",
                               headers={CALLER_HEADER: HARNESS}) as r:
            assert r.status == 200
        # A failed KV load is answered 500 and leaves its handoff record: no generate call besides.
        kv["remote_engine_id"] = "no-such-engine"
        async with session.post(d.url() + "/v1/completions",
                                json={"prompt": prompt, "max_tokens": 2, "kv_transfer_params": kv}) as r:
            assert r.status == 500
    lookup, read, again = calls(tmp_path / "p.jsonl", "bootstrap_query")
    assert (lookup["caller"], lookup["status"]) == ("engine:d0", 200)
    assert lookup["detail"] == {"engine_ids": [p.engine_id]}
    assert read["caller"] == HARNESS and again["caller"] == "engine:d0"
    pulled, failed = handoffs(tmp_path / "d.jsonl")
    assert pulled["outcome"] == "pulled" and failed["outcome"] == "failed"
    assert pulled["leg"]["kv_transfer_params"]["remote_engine_id"] == p.engine_id
    assert calls(tmp_path / "d.jsonl") == []


async def test_the_harness_probes_say_they_are_the_harness(
    engine: EngineHandle, session: aiohttp.ClientSession, records: Path
) -> None:
    assert await http_probe(engine.url() + "/health", 5) == "ok:200"
    assert await grpc_health_probe(f"127.0.0.1:{engine.grpc_port}", 5) == "ok:200"
    assert await tcp_probe(engine.http_port) == "answered"
    assert await read_query(session, "127.0.0.1", engine.bootstrap_port, 5) is not None
    assert await poll_until(lambda: len(calls(records)) == 4, 2.0, 0.02)
    assert sorted(c["call"] for c in calls(records)) == ["bootstrap_query", "grpc_health", "health", "health"]
    assert {(c["caller"], c["status"]) for c in calls(records)} == {(HARNESS, 200)}
