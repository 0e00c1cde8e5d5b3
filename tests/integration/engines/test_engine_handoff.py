"""KV handoff between in-process fake engines over real loopback TCP: Mooncake and NIXL, every outcome."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from fake_engines.core.calls import is_call_record
from fake_engines.core.generator import expected_completion, prompt_digest
from fake_engines.core.tokenizer import decode as tokenizer_decode
from fake_engines.core.tokenizer import encode
from fake_engines.runtime import EngineHandle
from fake_engines.testing import loopback_config, running_engine
from pdchaos.jsonl import read_jsonl
from pdchaos.ports import port_is_open
from pdchaos.proto import vllm_engine_pb2 as pb
from pdchaos.proto import vllm_engine_pb2_grpc as pbg
from pdchaos.sse import DONE, error_message, parse_sse

TRANSFER_TIMEOUT_S = 1.0


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url + "/v1/completions", json=body) as r:
        return r.status, await r.json()


async def mooncake_prefill(session: aiohttp.ClientSession, p: EngineHandle, prompt: str, tid: str) -> Any:
    status, body = await post(
        session,
        p.url(),
        {
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid},
        },
    )
    assert status == 200, body
    return body


async def mooncake_decode(
    session: aiohttp.ClientSession,
    d: EngineHandle,
    p: EngineHandle,
    prompt: str,
    tid: str,
    engine_id: str,
    max_tokens: int = 5,
) -> tuple[int, Any, float]:
    t0 = time.monotonic()
    status, body = await post(
        session,
        d.url(),
        {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "kv_transfer_params": {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "transfer_id": tid,
                "remote_engine_id": engine_id,
                "remote_bootstrap_addr": f"http://127.0.0.1:{p.bootstrap_port}",
            },
        },
    )
    return status, body, time.monotonic() - t0


@pytest.fixture
async def mooncake_pair(tmp_path: Path) -> AsyncIterator[tuple[EngineHandle, EngineHandle]]:
    pcfg = loopback_config("prefill", "mooncake", name="p0", records=str(tmp_path / "p.jsonl"))
    dcfg = loopback_config(
        "decode",
        "mooncake",
        name="d0",
        transfer_timeout_s=TRANSFER_TIMEOUT_S,
        records=str(tmp_path / "d.jsonl"),
    )
    async with running_engine(pcfg) as p, running_engine(dcfg) as d:
        yield p, d


async def test_mooncake_pull_digest_matches(
    mooncake_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    p, d = mooncake_pair
    prompt = "[pdchaos:m:1] a prompt to hand off"
    pre = await mooncake_prefill(session, p, prompt, "xfer-1")
    assert pre["kv_transfer_params"] is None  # as vLLM's: the router mints the decode's parameters
    status, body, _ = await mooncake_decode(session, d, p, prompt, "xfer-1", p.engine_id)
    assert status == 200
    assert body["choices"][0]["text"] == expected_completion(prompt, 5)
    assert body["kv_transfer_params"] is None
    (prec,) = [r for r in read_jsonl(tmp_path / "p.jsonl") if not is_call_record(r)]
    (drec,) = [r for r in read_jsonl(tmp_path / "d.jsonl") if not is_call_record(r)]
    digest = prompt_digest(encode(prompt))
    assert prec["kind"] == "prefill" and prec["outcome"] == "computed" and prec["transfer_id"] == "xfer-1"
    assert prec["engine_id"] == p.engine_id and prec["prompt_digest"] == digest
    assert drec["kind"] == "decode" and drec["outcome"] == "pulled"
    assert drec["remote_engine_id"] == p.engine_id and drec["transfer_id"] == "xfer-1"
    assert drec["kv_digest"] == drec["prompt_digest"] == digest
    assert drec["tag"] == "[pdchaos:m:1]"
    assert "xfer-1" not in p.engine.store  # pulled KV is released


async def test_restart_keeps_ports_new_id_stale_cache_times_out(
    mooncake_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = mooncake_pair
    old_id, old_side = p.engine_id, p.side_channel_port
    ports = (p.http_port, p.grpc_port, p.bootstrap_port)
    await mooncake_prefill(session, p, "warm the cache", "xfer-a")
    status, _, _ = await mooncake_decode(session, d, p, "warm the cache", "xfer-a", old_id)
    assert status == 200
    assert d.engine.bootstrap_cache.get(old_id) == ("127.0.0.1", old_side)

    changed = await p.restart()
    assert changed["engine_id"] == {"old": old_id, "new": p.engine_id}
    assert changed["generation"] == {"old": 1, "new": 2}
    assert (p.http_port, p.grpc_port, p.bootstrap_port) == ports
    assert p.side_channel_port != old_side and not port_is_open(old_side)
    assert p.engine_id != old_id

    # A router still minting the dead id: the decode uses its cached (dead) address and waits it out.
    prompt = "[pdchaos:m:2] after restart"
    await mooncake_prefill(session, p, prompt, "xfer-b")
    status, body, took = await mooncake_decode(session, d, p, prompt, "xfer-b", old_id)
    assert status == 500
    assert "timed out" in body["error"]["message"]
    assert took >= TRANSFER_TIMEOUT_S * 0.9
    rec = d.engine.records[-1]
    assert rec["outcome"] == "timed_out" and rec["remote_engine_id"] == old_id and rec["kv_digest"] is None

    # With the new id the decode asks the bootstrap server again and the pull succeeds.
    status, body, _ = await mooncake_decode(session, d, p, prompt, "xfer-b", p.engine_id)
    assert status == 200 and body["choices"][0]["text"] == expected_completion(prompt, 5)
    rec = d.engine.records[-1]
    assert rec["outcome"] == "pulled" and rec["kv_digest"] == rec["prompt_digest"]
    assert p.engine.records[-1]["generation"] == 2


async def test_unknown_engine_id_fails_fast(
    mooncake_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = mooncake_pair
    await mooncake_prefill(session, p, "x", "xfer-u")
    status, body, took = await mooncake_decode(session, d, p, "x", "xfer-u", "no-such-engine")
    assert status == 500 and "not found" in body["error"]["message"]
    assert took < TRANSFER_TIMEOUT_S
    assert d.engine.records[-1]["outcome"] == "failed"
    assert "no-such-engine" not in d.engine.bootstrap_cache


async def test_unknown_transfer_id_waits_out_the_transfer_timeout(
    mooncake_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    # vLLM's Mooncake decode parks a request whose KV the prefill does not hold until its transfer timeout.
    p, d = mooncake_pair
    status, body, took = await mooncake_decode(session, d, p, "never prefilled", "xfer-none", p.engine_id)
    assert status == 500 and "timed out" in body["error"]["message"]
    assert took >= TRANSFER_TIMEOUT_S * 0.9
    assert d.engine.records[-1]["outcome"] == "timed_out"


async def test_bootstrap_down_fails_fast(session: aiohttp.ClientSession) -> None:
    dcfg = loopback_config("decode", "mooncake", transfer_timeout_s=TRANSFER_TIMEOUT_S)
    async with running_engine(dcfg) as d:
        pcfg = loopback_config("prefill", "mooncake")
        async with running_engine(pcfg) as p:
            pass  # closed: its bootstrap port now refuses
        status, body, took = await mooncake_decode(session, d, p, "x", "xfer-d", "gone")
    assert status == 500 and "bootstrap query failed" in body["error"]["message"]
    assert took < TRANSFER_TIMEOUT_S


async def test_recompute_policy_and_incomplete_params(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    pcfg = loopback_config("prefill", "mooncake")
    dcfg = loopback_config(
        "decode", "mooncake", transfer_timeout_s=TRANSFER_TIMEOUT_S, load_failure_policy="recompute"
    )
    async with running_engine(pcfg) as p, running_engine(dcfg) as d:
        prompt = "[pdchaos:m:3] recompute me"
        status, body, took = await mooncake_decode(session, d, p, prompt, "xfer-r", "wrong-id")
        assert status == 200 and body["choices"][0]["text"] == expected_completion(prompt, 5)
        rec = d.engine.records[-1]
        assert rec["outcome"] == "recomputed" and "not found" in rec["error"]
        assert took < TRANSFER_TIMEOUT_S
        # A router that could not mint (no engine id) sends no remote_engine_id: the decode recomputes.
        status, body = await post(
            session,
            d.url(),
            {
                "prompt": prompt,
                "max_tokens": 3,
                "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "t"},
            },
        )
        assert status == 200 and body["choices"][0]["text"] == expected_completion(prompt, 3)
        assert d.engine.records[-1]["outcome"] == "recomputed"


async def test_wrong_kv_shows_in_digest_and_output(
    mooncake_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = mooncake_pair
    await mooncake_prefill(session, p, "[pdchaos:m:4] prompt A", "xfer-w")
    prompt_b = "[pdchaos:m:5] prompt B"
    status, body, _ = await mooncake_decode(session, d, p, prompt_b, "xfer-w", p.engine_id)
    assert status == 200
    assert body["choices"][0]["text"] != expected_completion(prompt_b, 5)
    rec = d.engine.records[-1]
    assert rec["outcome"] == "pulled" and rec["kv_digest"] != rec["prompt_digest"]
    assert rec["kv_digest"] == prompt_digest(encode("[pdchaos:m:4] prompt A"))


async def test_wedged_side_channel_times_out(
    mooncake_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = mooncake_pair
    await mooncake_prefill(session, p, "warm", "xfer-c")
    assert (await mooncake_decode(session, d, p, "warm", "xfer-c", p.engine_id))[0] == 200
    await mooncake_prefill(session, p, "wedged", "xfer-x")
    p.engine.faults.apply_spec({"fault": "wedge", "surface": "side_channel"})
    status, _body, took = await mooncake_decode(session, d, p, "wedged", "xfer-x", p.engine_id)
    assert status == 500 and took >= TRANSFER_TIMEOUT_S * 0.9
    assert d.engine.records[-1]["outcome"] == "timed_out"


async def test_streaming_decode_failure_is_error_chunk(
    mooncake_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = mooncake_pair
    body = {
        "prompt": "s",
        "max_tokens": 2,
        "stream": True,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "transfer_id": "t",
            "remote_engine_id": "nope",
            "remote_bootstrap_addr": f"http://127.0.0.1:{p.bootstrap_port}",
        },
    }
    async with session.post(d.url() + "/v1/completions", json=body) as r:
        assert r.status == 200
        events = parse_sse(await r.text())
    assert events.payloads[-1] == DONE
    assert error_message(events.chunks[0]) is not None and len(events.payloads) == 2


async def test_dp_ranks_in_bootstrap_query(session: aiohttp.ClientSession) -> None:
    async with (
        running_engine(loopback_config("prefill", "mooncake", dp_size=2)) as p,
        running_engine(loopback_config("decode", "mooncake", transfer_timeout_s=TRANSFER_TIMEOUT_S)) as d,
    ):
        async with session.get(f"http://127.0.0.1:{p.bootstrap_port}/query") as r:
            answer = await r.json()
        assert sorted(answer) == ["0", "1"]
        assert answer["1"]["engine_id"] == f"{p.engine_id}_dp1"
        await mooncake_prefill(session, p, "dp prompt", "xfer-dp")
        status, _, _ = await mooncake_decode(session, d, p, "dp prompt", "xfer-dp", f"{p.engine_id}_dp1")
        assert status == 200 and d.engine.records[-1]["outcome"] == "pulled"


# -- NIXL ---------------------------------------------------------------------------------------------------


async def nixl_prefill(session: aiohttp.ClientSession, p: EngineHandle, prompt: str) -> dict[str, Any]:
    status, body = await post(
        session,
        p.url(),
        {
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        },
    )
    assert status == 200
    return dict(body["kv_transfer_params"])


@pytest.fixture
async def nixl_pair() -> AsyncIterator[tuple[EngineHandle, EngineHandle]]:
    async with (
        running_engine(loopback_config("prefill", "nixl")) as p,
        running_engine(
            loopback_config("decode", "nixl", transfer_timeout_s=TRANSFER_TIMEOUT_S, handshake_timeout_s=0.5)
        ) as d,
    ):
        yield p, d


async def test_nixl_handoff_and_restart(
    nixl_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = nixl_pair
    prompt = "[pdchaos:n:1] nixl prompt"
    params = await nixl_prefill(session, p, prompt)
    assert params["remote_engine_id"] == p.engine_id
    assert params["remote_port"] == p.nixl_port
    assert params["do_remote_prefill"] is True and params["tp_size"] == 1
    status, body = await post(
        session, d.url(), {"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params}
    )
    assert status == 200 and body["choices"][0]["text"] == expected_completion(prompt, 4)
    rec = d.engine.records[-1]
    assert rec["outcome"] == "pulled" and rec["remote_request_id"] == params["remote_request_id"]
    assert rec["kv_digest"] == rec["prompt_digest"]
    assert p.engine_id in d.engine.nixl_cache

    nixl_port = p.nixl_port
    old_id = p.engine_id
    await p.restart()
    assert p.nixl_port == nixl_port and p.engine_id != old_id
    # Stale params (old id) reach the same port: the handshake sees another id and fails fast. The old id
    # is cached from before, so the decode skips the handshake and the pull is refused by id instead.
    t0 = time.monotonic()
    status, body = await post(
        session, d.url(), {"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params}
    )
    assert status == 500 and "mismatch" in body["error"]["message"]
    assert time.monotonic() - t0 < TRANSFER_TIMEOUT_S
    # Fresh params: new id, handshake, pull.
    params2 = await nixl_prefill(session, p, prompt)
    status, body = await post(
        session, d.url(), {"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params2}
    )
    assert status == 200 and d.engine.records[-1]["outcome"] == "pulled"


async def test_nixl_engine_id_mismatch_fails_fast(
    nixl_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = nixl_pair
    params = await nixl_prefill(session, p, "mismatch")
    params["remote_engine_id"] = "someone-else"
    t0 = time.monotonic()
    status, body = await post(
        session, d.url(), {"prompt": "mismatch", "max_tokens": 2, "kv_transfer_params": params}
    )
    assert status == 500 and "mismatch" in body["error"]["message"]
    assert time.monotonic() - t0 < 0.5
    assert d.engine.records[-1]["outcome"] == "failed"
    assert "someone-else" not in d.engine.nixl_cache  # failed handshakes are not cached


async def test_nixl_handshake_timeout_and_refused(
    nixl_pair: tuple[EngineHandle, EngineHandle], session: aiohttp.ClientSession
) -> None:
    p, d = nixl_pair
    params = await nixl_prefill(session, p, "hs")
    p.engine.faults.apply_spec({"fault": "wedge", "surface": "side_channel"})
    t0 = time.monotonic()
    status, body = await post(
        session, d.url(), {"prompt": "hs", "max_tokens": 2, "kv_transfer_params": params}
    )
    took = time.monotonic() - t0
    assert status == 500 and "handshake" in body["error"]["message"]
    assert 0.4 <= took < TRANSFER_TIMEOUT_S
    p.engine.faults.clear_all()
    await p.close()
    status, body = await post(
        session, d.url(), {"prompt": "hs", "max_tokens": 2, "kv_transfer_params": params}
    )
    assert status == 500 and d.engine.records[-1]["outcome"] == "failed"


async def test_nixl_recompute_policy(session: aiohttp.ClientSession) -> None:
    async with (
        running_engine(loopback_config("prefill", "nixl")) as p,
        running_engine(loopback_config("decode", "nixl", load_failure_policy="recompute")) as d,
    ):
        params = await nixl_prefill(session, p, "rc")
        params["remote_engine_id"] = "other"
        status, body = await post(
            session, d.url(), {"prompt": "rc", "max_tokens": 3, "kv_transfer_params": params}
        )
        assert status == 200 and body["choices"][0]["text"] == expected_completion("rc", 3)
        assert d.engine.records[-1]["outcome"] == "recomputed"


async def test_grpc_prefill_and_decode_legs() -> None:
    """The gRPC path a gateway uses: tokenized prefill leg, then a decode leg with kv_transfer_params_json."""
    async with (
        running_engine(loopback_config("prefill", "mooncake")) as p,
        running_engine(loopback_config("decode", "mooncake", transfer_timeout_s=TRANSFER_TIMEOUT_S)) as d,
    ):
        prompt = "[pdchaos:grpc:1] over grpc"
        ids = encode(prompt)
        tid = "xfer-grpc"
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{p.grpc_port}") as pch,
            grpc.aio.insecure_channel(f"127.0.0.1:{d.grpc_port}") as dch,
        ):
            pre = pb.GenerateRequest(
                request_id="pre",
                tokenized=pb.TokenizedInput(original_text=prompt, input_ids=ids),
                sampling_params=pb.SamplingParams(max_tokens=1, ignore_eos=True),
                stream=False,
                kv_transfer_params_json=json.dumps({"do_remote_decode": True, "transfer_id": tid}),
            )
            msgs = [m async for m in pbg.VllmEngineStub(pch).Generate(pre, timeout=5)]
            assert msgs[-1].complete.kv_transfer_params_json == ""  # Mooncake: the router mints
            dec = pb.GenerateRequest(
                request_id="dec",
                tokenized=pb.TokenizedInput(original_text=prompt, input_ids=ids),
                sampling_params=pb.SamplingParams(max_tokens=6),
                stream=True,
                kv_transfer_params_json=json.dumps(
                    {
                        "do_remote_prefill": True,
                        "transfer_id": tid,
                        "remote_engine_id": p.engine_id,
                        "remote_bootstrap_addr": f"http://127.0.0.1:{p.bootstrap_port}",
                    }
                ),
            )
            msgs = [m async for m in pbg.VllmEngineStub(dch).Generate(dec, timeout=5)]
            out = [t for m in msgs[:-1] for t in m.chunk.token_ids]  # DELTA: text from the chunks
            assert out == encode(expected_completion(prompt, 6))
            assert d.engine.records[-1]["outcome"] == "pulled"
            # A decode leg whose KV load fails is an INTERNAL error on gRPC (policy fail).
            bad = pb.GenerateRequest(
                request_id="bad",
                text=prompt,
                sampling_params=pb.SamplingParams(max_tokens=2),
                kv_transfer_params_json=json.dumps(
                    {
                        "do_remote_prefill": True,
                        "transfer_id": "nope",
                        "remote_engine_id": p.engine_id,
                        "remote_bootstrap_addr": f"http://127.0.0.1:{p.bootstrap_port}",
                    }
                ),
            )
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                _ = [m async for m in pbg.VllmEngineStub(dch).Generate(bad, timeout=5)]
            assert exc.value.code() == grpc.StatusCode.INTERNAL
            # The deprecated typed params (no engine id) leave the decode nothing to pull: it recomputes.
            typed = pb.GenerateRequest(
                request_id="typed",
                text=prompt,
                sampling_params=pb.SamplingParams(max_tokens=2),
                kv_transfer_params=pb.KvTransferParams(remote_host="127.0.0.1", remote_port=p.bootstrap_port),
            )
            msgs = [m async for m in pbg.VllmEngineStub(dch).Generate(typed, timeout=5)]
            assert tokenizer_decode(list(msgs[-1].complete.output_ids)) == expected_completion(prompt, 2)
            assert d.engine.records[-1]["outcome"] == "recomputed"
