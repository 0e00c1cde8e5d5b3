"""The reference router in front of the real fake engines (in process): the handoff the engines record is
correct (pulled, right engine id, digests match) and the client gets the expected completion."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any

import pytest

from fake_engines.core.generator import expected_chat_completion, expected_completion
from fake_engines.testing import loopback_config, running_engine
from pdchaos.sse import stream_text
from pdchaos.waiting import wait_true
from reference_router.config import RouterConfig, WorkerArg
from reference_router.stub_engines import InProcessRouter


async def post(router: InProcessRouter, path: str, body: dict[str, Any]) -> tuple[int, str]:
    async with router.session.post(router.base + path, json=body) as resp:
        return resp.status, await resp.text()


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
async def test_router_drives_a_correct_handoff_between_fake_engines(transport: str, connector: str) -> None:
    async with AsyncExitStack() as stack:
        p = await stack.enter_async_context(running_engine(loopback_config("prefill", connector, name="p")))
        d = await stack.enter_async_context(running_engine(loopback_config("decode", connector, name="d")))
        cfg = RouterConfig(
            pd=True, prefill=(WorkerArg(p.url(transport), p.bootstrap_port or None),),
            decode=(d.url(transport),), connector=connector if transport == "http" else None,
            interval_s=0.2, probe_timeout_s=1.0, success_threshold=1, request_timeout_s=10.0,
        )
        router = await stack.enter_async_context(InProcessRouter(cfg))
        await router.wait_ready()
        if transport == "grpc":
            # The connector and id come from GetServerInfo.
            prefill = router.server.registry.all()[0]
            await wait_true(lambda: prefill.connector is not None and prefill.connector.value == connector,
                           3.0, "connector learned")

        cases: list[tuple[str, dict[str, Any], bool]] = [
            ("/v1/completions", {"prompt": "[pdchaos:t:1] tell me", "max_tokens": 6}, False),
            ("/v1/completions",
             {"prompt": "[pdchaos:t:2] stream it", "max_tokens": 5, "stream": True}, False),
            ("/v1/chat/completions",
             {"messages": [{"role": "user", "content": "[pdchaos:t:3] hi"}], "max_tokens": 4}, True),
            ("/v1/chat/completions",
             {"messages": [{"role": "user", "content": "[pdchaos:t:4] yo"}], "max_tokens": 4, "stream": True},
             True),
        ]
        for path, body, chat in cases:
            status, raw = await post(router, path, body)
            assert status == 200, raw
            if body.get("stream"):
                text, _, _ = stream_text(raw, chat)
            else:
                choice = json.loads(raw)["choices"][0]
                text = choice["message"]["content"] if chat else choice["text"]
            if chat:
                assert text == expected_chat_completion(body["messages"], body["max_tokens"], None)
            else:
                assert text == expected_completion(body["prompt"], body["max_tokens"], None)

        decodes = [r for r in d.engine.records if r["kind"] == "decode"]
        assert [r["tag"] for r in decodes] == [f"[pdchaos:t:{i}]" for i in (1, 2, 3, 4)]
        for rec in decodes:
            assert rec["outcome"] == "pulled", rec
            assert rec["remote_engine_id"] == p.engine_id
            assert rec["kv_digest"] == rec["prompt_digest"]
        prefills = [r for r in p.engine.records if r["kind"] == "prefill"]
        assert len(prefills) == 4
        if connector == "mooncake":
            assert [r["transfer_id"] for r in decodes] == [r["transfer_id"] for r in prefills]
