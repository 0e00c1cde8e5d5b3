"""HTTP (OpenAI-compatible) surface of the fake engine, served in process on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from fake_engines.core import tokenizer
from fake_engines.core.chat import render_chat
from fake_engines.core.generator import expected_chat_completion, expected_completion
from fake_engines.runtime import EngineHandle
from fake_engines.testing import loopback_config, running_engine
from pdchaos.sse import DONE, SseBody, parse_sse


@pytest.fixture
async def engine() -> AsyncIterator[EngineHandle]:
    async with running_engine(loopback_config("both", seed=None)) as handle:
        yield handle


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


def finished_stream(raw: str) -> SseBody:
    """The parsed body of a stream that ended properly: every payload JSON, `[DONE]` last."""
    body = parse_sse(raw)
    assert not body.bad, body.bad
    assert body.payloads and body.payloads[-1] == DONE, body.payloads
    return body


async def test_health_models_version_metrics(engine: EngineHandle, session: aiohttp.ClientSession) -> None:
    base = engine.url()
    async with session.get(base + "/health") as r:
        assert r.status == 200
    async with session.get(base + "/v1/models") as r:
        body = await r.json()
        assert body["object"] == "list"
        assert [m["id"] for m in body["data"]] == ["pdchaos-fake"]
    async with session.get(base + "/version") as r:
        assert "version" in await r.json()
    async with session.post(base + "/v1/completions", json={"prompt": "count me", "max_tokens": 3}) as r:
        assert r.status == 200
    async with session.get(base + "/metrics") as r:
        text = await r.text()
        assert 'vllm:request_success_total{model_name="pdchaos-fake"} 1' in text
        assert 'vllm:generation_tokens_total{model_name="pdchaos-fake"} 3' in text
        assert 'pdchaos_handoff_total{outcome="computed"} 1' in text


async def test_completion_shape_and_expected_text(
    engine: EngineHandle, session: aiohttp.ClientSession
) -> None:
    prompt = "[pdchaos:t:1] The quick brown fox"
    async with session.post(
        engine.url() + "/v1/completions", json={"model": "pdchaos-fake", "prompt": prompt, "max_tokens": 7}
    ) as r:
        assert r.status == 200
        body = await r.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert isinstance(body["created"], int)
    assert body["model"] == "pdchaos-fake"
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "length"
    assert choice["text"] == expected_completion(prompt, 7)
    n_prompt = len(tokenizer.encode(prompt))
    assert body["usage"] == {
        "prompt_tokens": n_prompt,
        "completion_tokens": 7,
        "total_tokens": n_prompt + 7,
        "prompt_tokens_details": None,
    }
    assert body["kv_transfer_params"] is None
    (rec,) = engine.engine.records
    assert rec["kind"] == "local" and rec["outcome"] == "computed" and rec["tag"] == "[pdchaos:t:1]"


async def test_seed_changes_output_and_token_id_prompt(
    engine: EngineHandle, session: aiohttp.ClientSession
) -> None:
    prompt = "seeded prompt"
    ids = tokenizer.encode(prompt)
    async with session.post(
        engine.url() + "/v1/completions", json={"prompt": ids, "max_tokens": 4, "seed": 7}
    ) as r:
        text = (await r.json())["choices"][0]["text"]
    assert text == expected_completion(prompt, 4, seed=7)
    assert text != expected_completion(prompt, 4, seed=None)


async def test_chat_completion(engine: EngineHandle, session: aiohttp.ClientSession) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "[pdchaos:c:9] hi"}]
    async with session.post(
        engine.url() + "/v1/chat/completions", json={"messages": messages, "max_tokens": 5}
    ) as r:
        body = await r.json()
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant"
    assert msg["content"] == expected_chat_completion(messages, 5)
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(render_chat(messages)))
    assert engine.engine.records[-1]["tag"] == "[pdchaos:c:9]"


async def test_completion_streaming_sse(engine: EngineHandle, session: aiohttp.ClientSession) -> None:
    prompt = "stream me"
    async with session.post(
        engine.url() + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        chunks = finished_stream(await r.text()).chunks
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    text_chunks = chunks[:-1]
    assert len(text_chunks) == 6
    assert all(c["object"] == "text_completion" and c["id"] == text_chunks[0]["id"] for c in text_chunks)
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == expected_completion(prompt, 6)
    assert [c["choices"][0]["finish_reason"] for c in text_chunks] == [None] * 5 + ["length"]
    assert all("kv_transfer_params" not in c for c in chunks)


async def test_chat_streaming_sse(engine: EngineHandle, session: aiohttp.ClientSession) -> None:
    messages = [{"role": "user", "content": "stream chat"}]
    async with session.post(
        engine.url() + "/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "stream": True}
    ) as r:
        chunks = finished_stream(await r.text()).chunks
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == expected_chat_completion(messages, 3)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("path", "raw", "needle"),
    [
        ("/v1/completions", b"{not json", "malformed JSON"),
        ("/v1/completions", b"[1, 2]", "JSON object"),
        ("/v1/completions", json.dumps({"max_tokens": 3}).encode(), "prompt"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "many"}).encode(), "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}).encode(), "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": [10**9]}).encode(), "out of range"),
        (
            "/v1/completions",
            json.dumps({"prompt": "x", "kv_transfer_params": [1]}).encode(),
            "kv_transfer_params",
        ),
        ("/v1/completions", json.dumps({"prompt": "x", "stream": "yes"}).encode(), "stream"),
        ("/v1/completions", json.dumps({"prompt": "x", "n": 2}).encode(), "n=1"),
        ("/v1/chat/completions", json.dumps({"messages": []}).encode(), "messages"),
        ("/v1/chat/completions", json.dumps({"messages": [{"content": "no role"}]}).encode(), "role"),
    ],
)
async def test_bad_input_is_400(
    engine: EngineHandle, session: aiohttp.ClientSession, path: str, raw: bytes, needle: str
) -> None:
    async with session.post(engine.url() + path, data=raw, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        body = await r.json()
    assert body["error"]["code"] == 400
    assert body["error"]["type"] == "BadRequestError"
    assert needle in body["error"]["message"]
    assert engine.engine.records == []


async def test_fail_requests_fault_non_streaming_and_streaming(
    engine: EngineHandle, session: aiohttp.ClientSession
) -> None:
    changed = engine.engine.faults.apply_spec({"fault": "fail_requests", "count": 2, "status": 503})
    assert changed["fail_requests"]["new"] == {"count": 2, "status": 503}
    async with session.post(engine.url() + "/v1/completions", json={"prompt": "a", "max_tokens": 2}) as r:
        assert r.status == 503
        assert (await r.json())["error"]["code"] == 503
    # Mid-stream errors keep status 200: an error chunk, then [DONE].
    async with session.post(
        engine.url() + "/v1/completions", json={"prompt": "a", "max_tokens": 2, "stream": True}
    ) as r:
        assert r.status == 200
        events = finished_stream(await r.text())
    assert events.chunks[0]["error"]["code"] == 503
    assert len(events.payloads) == 2
    async with session.post(engine.url() + "/v1/completions", json={"prompt": "a", "max_tokens": 2}) as r:
        assert r.status == 200
    assert engine.engine.faults.state.as_dict() == {}


async def test_request_id_from_header(engine: EngineHandle, session: aiohttp.ClientSession) -> None:
    async with session.post(
        engine.url() + "/v1/completions",
        json={"prompt": "id me", "max_tokens": 1},
        headers={"X-Request-Id": "req-42"},
    ) as r:
        assert (await r.json())["id"] == "req-42"
    assert engine.engine.records[-1]["request_id"] == "req-42"
