"""The recording relay in front of an engine's serving port (real vLLM's provenance): a fake engine stands
behind it here. A router that closes a stream once it has the answer leaves a leg that did not fail."""

from __future__ import annotations

import contextlib
from pathlib import Path

import aiohttp

from fake_engines.testing import loopback_config, running_engine
from harness.topology import EngineSpec
from harness.worlds.real.relay import RecordingRelay
from pdchaos.jsonl import read_jsonl
from pdchaos.ports import free_ports
from pdchaos.waiting import poll_until


async def test_a_stream_the_router_closes_after_its_first_chunk_is_not_a_failed_leg(tmp_path: Path) -> None:
    serving = free_ports(1)[0]
    spec = EngineSpec("decode-0", "decode", 0, serving, 0, 0, 0, 0)
    relay = RecordingRelay("decode-0", spec, tmp_path / "legs.jsonl")
    cfg = loopback_config("decode", "none", http_port=relay.backend_port, itl_ms=20.0)
    async with running_engine(cfg):
        await relay.open()
        await relay.serve()
        try:
            url = f"http://127.0.0.1:{serving}/v1/completions"
            body = {"model": "pdchaos-fake", "prompt": "[pdchaos:t:1] stream it", "max_tokens": 40,
                    "stream": True}
            async with aiohttp.ClientSession() as http:
                async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    assert resp.status == 200
                    await resp.content.readany()  # the first chunk, then the router hangs up
                    resp.close()
                async with http.post(url, json={**body, "max_tokens": 2},
                                     timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    await resp.read()  # read to the end
        finally:
            await relay.close()
    cut, whole = list(read_jsonl(tmp_path / "legs.jsonl"))
    assert cut["reader_left"] is True and cut["error"] is None and cut["status"] == 200
    assert whole["reader_left"] is False and whole["error"] is None


async def test_a_leg_the_router_gave_up_on_is_recorded_as_the_engine_answered(tmp_path: Path) -> None:
    serving = free_ports(1)[0]
    spec = EngineSpec("prefill-0", "prefill", 0, serving, 0, 0, 0, 0)
    relay = RecordingRelay("prefill-0", spec, tmp_path / "legs.jsonl")
    cfg = loopback_config("prefill", "nixl", http_port=relay.backend_port, ttft_ms=600.0)
    async with running_engine(cfg):
        await relay.open()
        await relay.serve()
        try:
            url = f"http://127.0.0.1:{serving}/v1/completions"
            body = {"model": "pdchaos-fake", "prompt": "[pdchaos:t:2] prefill", "max_tokens": 1,
                    "kv_transfer_params": {"do_remote_decode": True}}
            async with aiohttp.ClientSession() as http:
                with contextlib.suppress(TimeoutError):
                    async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=0.2)) as resp:
                        await resp.read()
            await poll_until(lambda: (tmp_path / "legs.jsonl").exists()
                             and bool(list(read_jsonl(tmp_path / "legs.jsonl"))), 5.0)
        finally:
            await relay.close()
    (leg,) = list(read_jsonl(tmp_path / "legs.jsonl"))
    assert leg["kind"] == "prefill" and leg["status"] == 200
    assert leg["reader_left"] is True and leg["error"] is None
    assert leg["answered"]["remote_engine_id"]  # what the engine computed is kept
