"""The recording relay in front of an engine's serving port (real vLLM's provenance): a fake engine stands
behind it here. A router that hangs up once it has what it needs leaves a leg that did not fail; every probe
and metadata read is an engine call line, by the caller it names."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from fake_engines import grpc_health
from fake_engines.core.calls import CALLER_HEADER, CALLER_METADATA, CLIENT_GONE, is_call_record
from fake_engines.core.tokenizer import encode
from fake_engines.testing import loopback_config, running_engine
from harness.topology import EngineSpec, allocate
from harness.vllm import VllmInstall
from harness.vllm.provenance import NixlLog, records_from
from harness.worlds.real.grpc_relay import GrpcRecordingRelay
from harness.worlds.real.probes import grpc_health_probe
from harness.worlds.real.processes import ProcessSupervisor
from harness.worlds.real.relay import RecordingRelay
from harness.worlds.real.vllm_engines import VllmFleet
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
                harness = ((CALLER_METADATA, "harness"),)
                assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5, metadata=harness)).healthy
                # The fleet's own probe of a gRPC engine (VllmFleet.serving_probe) marks itself the same way.
                assert await grpc_health_probe(f"127.0.0.1:{spec.grpc_port}", 5.0) == "ok:200"
                assert (await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)).kv_engine_id == "p-1"
                # The standard health service vLLM's gRPC server registers too, forwarded as it is.
                check = ch.unary_unary(f"/{grpc_health.SERVICE}/Check")
                reply = await check(grpc_health.encode_request(""), timeout=5)
                assert grpc_health.decode_response(reply) == grpc_health.SERVING
                watch = ch.unary_stream(f"/{grpc_health.SERVICE}/Watch")(grpc_health.encode_request(""))
                assert grpc_health.decode_response(await watch.read()) == grpc_health.SERVING
                watch.cancel()  # recorded once, at its first answer
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
    lines = list(read_jsonl(legs))
    calls = [line for line in lines if is_call_record(line)]
    assert [(c["call"], c["caller"], c["status"], c["detail"]) for c in calls] == [
        ("grpc_health", "router", 200, {"healthy": True}),
        ("grpc_health", "harness", 200, {"healthy": True}),
        ("grpc_health", "harness", 200, {"healthy": True}),
        ("server_info", "router", 200, {"kv_engine_id": "p-1"}),
        ("grpc_health_v1", "router", 200, {"service": "", "healthy": True}),
        ("grpc_health_v1", "router", 200, {"service": "", "healthy": True, "watch": True}),
    ]
    assert all(c["engine"] == "prefill-0" and c["engine_id"] == "p-1" and c["generation"] == 1 for c in calls)
    leg, failed = [line for line in lines if not is_call_record(line)]
    assert leg["kind"] == "prefill" and leg["status"] == 200 and leg["error"] is None
    assert leg["prompt"] == prompt and leg["request_id"] == "pre-1" and leg["engine_id"] == "p-1"
    assert leg["answered"]["remote_engine_id"] == "p-1"
    assert leg["leg"] == {"stream": False, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    assert leg["tag"] == "[pdchaos:t:3]" and leg["caller"] == "router"
    # Refused before any message: the HTTP twin of the engine's status code, and a generate call.
    assert failed["kind"] == "local" and failed["status"] == 400 and "INVALID_ARGUMENT" in failed["error"]
    recs = records_from([leg, failed], NixlLog())
    assert [r.get("record") or r["kind"] for r in recs] == ["prefill", "local", "engine_call"]
    assert recs[0]["leg"] == leg["leg"] and recs[1]["leg"] is None
    assert recs[2]["call"] == "generate" and recs[2]["status"] == 400
    assert recs[2]["detail"]["leg"] == {"stream": False, "max_tokens": 1}


async def test_relayed_probes_and_reads_are_call_lines_by_their_caller(tmp_path: Path) -> None:
    legs = tmp_path / "legs.jsonl"
    async with relayed_engine(legs, "prefill", "nixl") as url:
        base = url.removesuffix("/v1/completions")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(f"{base}/health") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/health", headers={CALLER_HEADER: "harness"}) as resp:
                assert resp.status == 200
            async with http.get(f"{base}/v1/models") as resp:
                assert resp.status == 200 and (await resp.json())["data"]
            async with http.get(f"{base}/no/such/call") as resp:
                assert resp.status == 404  # passed through, not a call
    calls = [line for line in read_jsonl(legs) if is_call_record(line)]
    assert [(c["call"], c["caller"], c["status"]) for c in calls] == [
        ("health", "router", 200), ("health", "harness", 200), ("models", "router", 200)]
    assert calls[0]["detail"] == {"healthy": True} and calls[2]["detail"] == {}
    assert all(c["engine"] == "prefill-0" and c["role"] == "prefill" and c["duration_s"] >= 0 for c in calls)
    assert calls[0]["ts"] <= calls[1]["ts"] <= calls[2]["ts"]


async def test_a_leg_has_its_shape_and_a_refused_one_becomes_a_generate_call(tmp_path: Path) -> None:
    legs = tmp_path / "legs.jsonl"
    async with relayed_engine(legs, "prefill", "nixl") as url:
        kv = {"do_remote_decode": True, "remote_block_ids": [1, 2]}
        body = {"model": "pdchaos-fake", "prompt": "[pdchaos:t:4] shaped", "max_tokens": 1,
                "kv_transfer_params": kv}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.post(url, json=body) as resp:
                assert resp.status == 200
            bad = {**body, "prompt": "[pdchaos:t:5] refused", "max_tokens": -1}
            async with http.post(url, json=bad) as resp:
                assert resp.status == 400
            async with http.post(url, data=b"not json", headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 400
    lines = list(read_jsonl(legs))
    served, refused = [line for line in lines if not is_call_record(line)]
    shape = {"stream": False, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    assert served["leg"] == shape and served["tag"] == "[pdchaos:t:4]" and served["caller"] == "router"
    assert refused["status"] == 400 and refused["leg"] == {**shape, "max_tokens": -1}
    # A body that is no JSON object told no leg: the engine's refusal is a call line of its own.
    (garbage,) = [line for line in lines if is_call_record(line)]
    assert garbage["call"] == "generate" and garbage["status"] == 400
    assert garbage["detail"]["leg"] is None and garbage["detail"]["error"]
    recs = records_from([served, refused], NixlLog())
    assert [(r.get("record"), r.get("outcome")) for r in recs] == [
        (None, "computed"), (None, "failed"), ("engine_call", None)]
    assert recs[0]["leg"] == shape and recs[1]["leg"] is None  # the refused leg's shape is on its call
    call = recs[2]
    assert call["call"] == "generate" and call["status"] == 400 and call["caller"] == "router"
    assert call["detail"]["tag"] == "[pdchaos:t:5]" and call["detail"]["leg"] == refused["leg"]
    assert call["detail"]["error"] == refused["error"] and call["ts"] < refused["ts"]


@contextlib.asynccontextmanager
async def slow_upstream(port: int, delay_s: float) -> AsyncIterator[None]:
    """An engine whose /health answers only after `delay_s` (a wedged engine, to the router's probe)."""
    async def health(_: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def test_a_probe_its_caller_gave_up_on_and_one_the_engine_never_got(tmp_path: Path) -> None:
    legs = tmp_path / "legs.jsonl"
    serving = free_ports(1)[0]
    relay = RecordingRelay("decode-0", EngineSpec("decode-0", "decode", 0, serving, 0, 0, 0, 0), legs)
    relay.engine_id, relay.generation = "d-1", 3
    await relay.open()
    await relay.serve()
    try:
        async with slow_upstream(relay.backend_port, 5.0), aiohttp.ClientSession() as http:
            with pytest.raises(TimeoutError):
                async with http.get(f"http://127.0.0.1:{serving}/health",
                                    timeout=aiohttp.ClientTimeout(total=0.3)) as resp:
                    await resp.read()
            await poll_until(lambda: legs.exists() and bool(list(read_jsonl(legs))), 3.0)
        # No engine behind the relay any more: the call fails and the relay refuses from then on.
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{serving}/health",
                                    timeout=aiohttp.ClientTimeout(total=3)) as resp:
                    await resp.read()
        assert not port_is_open(serving)
    finally:
        await relay.close()
    gone, failed = list(read_jsonl(legs))
    assert (gone["call"], gone["status"], gone["detail"]) == ("health", CLIENT_GONE, {"healthy": False})
    assert 0.25 <= gone["duration_s"] < 2.0  # when the router hung up, not when the engine answered
    assert (gone["engine_id"], gone["generation"]) == ("d-1", 3)
    assert (failed["call"], failed["status"], failed["detail"]) == ("health", 502, {"healthy": False})


async def test_the_fleet_passes_call_lines_through_and_marks_its_own_probes(tmp_path: Path) -> None:
    install = VllmInstall(home=tmp_path, python=Path(sys.executable), model_dir=tmp_path, versions={})
    async with ProcessSupervisor(tmp_path / "logs") as sup:
        fleet = VllmFleet(allocate("1p1d", "nixl", "http"), None, sup, tmp_path, token=None,
                          ready_timeout_s=1.0, install=install)
        relay = fleet.relay("prefill-0")
        relay.engine_id, relay.generation = "prefill-0-g1-x", 1
        spec = fleet.topo.engine("prefill-0")
        cfg = loopback_config("prefill", "nixl", http_port=relay.backend_port)
        async with running_engine(cfg):
            await relay.open()
            await relay.serve()
            try:
                assert await fleet.serving_probe("prefill-0", 2.0) == "ok:200"
                body = {"model": "pdchaos-fake", "prompt": "[pdchaos:t:6] p", "max_tokens": 1,
                        "kv_transfer_params": {"do_remote_decode": True}}
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                    async with http.get(f"{spec.http_url}/health") as resp:
                        assert resp.status == 200
                    async with http.post(f"{spec.http_url}/v1/completions", json=body) as resp:
                        assert resp.status == 200
            finally:
                await relay.close()
    recs = fleet.records()
    calls = [r for r in recs if is_call_record(r)]
    assert [(c["call"], c["caller"], c["engine_id"]) for c in calls] == [
        ("health", "harness", "prefill-0-g1-x"), ("health", "router", "prefill-0-g1-x")]
    (handoff,) = [r for r in recs if not is_call_record(r)]
    assert handoff["kind"] == "prefill" and handoff["outcome"] == "computed"
    assert handoff["leg"] == {"stream": False, "max_tokens": 1,
                              "kv_transfer_params": {"do_remote_decode": True}}
