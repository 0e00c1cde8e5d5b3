"""The recording relay in front of an engine's serving port (real vLLM's provenance): a fake engine stands
behind it here. A router that hangs up once it has what it needs leaves a leg that did not fail."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from fake_engines.core.tokenizer import encode
from fake_engines.testing import loopback_config, running_engine
from harness.topology import EngineSpec
from harness.worlds.real.grpc_relay import GrpcRecordingRelay
from harness.worlds.real.relay import RecordingRelay
from pdchaos.jsonl import read_jsonl
from pdchaos.ports import free_ports, port_is_open
from pdchaos.proto import vllm_engine_pb2 as pb
from pdchaos.proto import vllm_engine_pb2_grpc as pbg
from pdchaos.waiting import poll_until


@contextlib.asynccontextmanager
async def relayed_engine(legs: Path, role: str, connector: str, **cfg: Any) -> AsyncIterator[str]:
    """A fake engine behind a relay; yields the relay's completions URL."""
    serving = free_ports(1)[0]
    relay = RecordingRelay(f"{role}-0", EngineSpec(f"{role}-0", role, 0, serving, 0, 0, 0, 0), legs)
    async with running_engine(loopback_config(role, connector, http_port=relay.backend_port, **cfg)):
        await relay.open()
        await relay.serve()
        try:
            yield f"http://127.0.0.1:{serving}/v1/completions"
        finally:
            await relay.close()


async def test_a_stream_the_router_closes_after_its_first_chunk_is_not_a_failed_leg(tmp_path: Path) -> None:
    legs = tmp_path / "legs.jsonl"
    async with relayed_engine(legs, "decode", "none", itl_ms=20.0) as url:
        body = {"model": "pdchaos-fake", "prompt": "[pdchaos:t:1] stream it", "max_tokens": 40,
                "stream": True}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.post(url, json=body) as resp:
                assert resp.status == 200
                await resp.content.readany()  # the first chunk, then the router hangs up
                resp.close()
            async with http.post(url, json={**body, "max_tokens": 2}) as resp:
                await resp.read()  # read to the end
    cut, whole = list(read_jsonl(legs))
    assert cut["reader_left"] is True and cut["error"] is None and cut["status"] == 200
    assert whole["reader_left"] is False and whole["error"] is None


async def test_a_leg_the_router_gave_up_on_is_recorded_as_the_engine_answered(tmp_path: Path) -> None:
    legs = tmp_path / "legs.jsonl"
    async with relayed_engine(legs, "prefill", "nixl", ttft_ms=600.0) as url:
        body = {"model": "pdchaos-fake", "prompt": "[pdchaos:t:2] prefill", "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}}
        async with aiohttp.ClientSession() as http:
            with contextlib.suppress(TimeoutError):
                async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=0.2)) as resp:
                    await resp.read()
        await poll_until(lambda: legs.exists() and bool(list(read_jsonl(legs))), 5.0)
    (leg,) = list(read_jsonl(legs))
    assert leg["kind"] == "prefill" and leg["status"] == 200
    assert leg["reader_left"] is True and leg["error"] is None
    assert leg["answered"]["remote_engine_id"]  # what the engine computed is kept


async def test_grpc_relay_forwards_the_service_and_records_generate_legs(tmp_path: Path) -> None:
    legs = tmp_path / "legs.jsonl"
    spec = EngineSpec("prefill-0", "prefill", 0, 0, free_ports(1)[0], 0, 0, 0)
    relay = GrpcRecordingRelay("prefill-0", spec, legs)
    relay.engine_id, relay.generation = "p-1", 1
    cfg = loopback_config("prefill", "nixl", grpc_port=relay.backend_port, engine_id="p-1")
    prompt = "[pdchaos:t:3] over grpc"
    async with running_engine(cfg):
        await relay.open()
        await relay.serve()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{spec.grpc_port}") as ch:
                stub = pbg.VllmEngineStub(ch)
                assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)).healthy
                assert (await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)).kv_engine_id == "p-1"
                tokens = pb.TokenizedInput(input_ids=encode(prompt))
                req = pb.GenerateRequest(request_id="pre-1", tokenized=tokens,
                                         sampling_params=pb.SamplingParams(max_tokens=1),
                                         kv_transfer_params_json=json.dumps({"do_remote_decode": True}))
                msgs = [m async for m in stub.Generate(req, timeout=5)]
                assert msgs[-1].complete.kv_transfer_params_json
                bad = pb.GenerateRequest(request_id="bad", sampling_params=pb.SamplingParams(max_tokens=1))
                with pytest.raises(grpc.aio.AioRpcError) as exc:
                    _ = [m async for m in stub.Generate(bad, timeout=5)]
                assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # the engine's own status
            relay.refuse()
            await asyncio.sleep(0.2)
            assert not port_is_open(spec.grpc_port)
        finally:
            await relay.close()
    leg, failed = list(read_jsonl(legs))
    assert leg["kind"] == "prefill" and leg["status"] == 200 and leg["error"] is None
    assert leg["prompt"] == prompt and leg["request_id"] == "pre-1" and leg["engine_id"] == "p-1"
    assert leg["answered"]["remote_engine_id"] == "p-1"
    assert failed["kind"] == "local" and failed["status"] == 500 and "INVALID_ARGUMENT" in failed["error"]
