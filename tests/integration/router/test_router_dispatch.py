"""End-to-end PD dispatch through the reference router against loopback stub engines.

Each test asserts what the stubs actually received on each leg (DESIGN §2 kv_transfer_params), not what the
router says it sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdchaos.sse import DONE, parse_sse, stream_text
from pdchaos.waiting import wait_true
from reference_router.config import RouterConfig, WorkerArg
from reference_router.stub_engines import GrpcStubEngine, HttpStubEngine, InProcessRouter, StubState

FAST = {"interval_s": 0.1, "probe_timeout_s": 0.5, "success_threshold": 1, "failure_threshold": 1}


class PD:
    """One prefill and one (or more) decode stubs behind an in-process router."""

    def __init__(self, router: InProcessRouter, prefills: list[Any], decodes: list[Any]) -> None:
        self.router = router
        self.prefills = prefills
        self.decodes = decodes

    @property
    def p(self) -> StubState:
        state: StubState = self.prefills[0].state
        return state

    @property
    def d(self) -> StubState:
        state: StubState = self.decodes[0].state
        return state

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any, str]:
        async with self.router.session.post(self.router.base + path, json=body) as resp:
            text = await resp.text()
            try:
                payload: Any = json.loads(text)
            except json.JSONDecodeError:
                payload = None
            return resp.status, payload, text


async def start_stub(transport: str, state: StubState, bootstrap: bool = False) -> Any:
    if transport == "grpc":
        return await GrpcStubEngine(state).start()
    return await HttpStubEngine(state, bootstrap=bootstrap).start()


async def stop_all(stubs: list[Any]) -> None:
    for s in stubs:
        await s.stop()


@pytest.fixture
async def make_pd() -> AsyncIterator[Any]:
    made: list[tuple[InProcessRouter, list[Any]]] = []

    async def _make(transport: str, connector: str, n_decode: int = 1, wait: bool = True, **cfg: Any) -> PD:
        stubs: list[Any] = []
        try:
            p = await start_stub(transport, StubState("p0", "prefill", connector), connector == "mooncake")
            stubs.append(p)
            decodes = []
            for i in range(n_decode):
                decodes.append(await start_stub(transport, StubState(f"d{i}", "decode", connector)))
                stubs.extend(decodes[-1:])
            boot = p.bootstrap_port if transport == "http" else (17998 if connector == "mooncake" else None)
            settings = {**FAST, **cfg}
            rcfg = RouterConfig(
                pd=True, prefill=(WorkerArg(p.url, boot),), decode=tuple(d.url for d in decodes),
                connector=connector, request_timeout_s=settings.pop("request_timeout_s", 5.0), **settings,
            )
            router = InProcessRouter(rcfg)
            await router.__aenter__()
        except BaseException:
            await stop_all(stubs)
            raise
        made.append((router, stubs))
        if wait:
            await router.wait_ready()
        return PD(router, [p], decodes)

    try:
        yield _make
    finally:
        for router, stubs in made:
            await router.__aexit__(None, None, None)
            await stop_all(stubs)


def received_kv(state: StubState, transport: str) -> list[dict[str, Any] | None]:
    if transport == "grpc":
        return [r["kv_transfer_params"] for r in state.received]
    return [r["body"].get("kv_transfer_params") for r in state.received]


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
async def test_pd_flow_kv_params_on_each_leg(
    make_pd: Any, transport: str, connector: str, stream: bool, endpoint: str
) -> None:
    pd = await make_pd(transport, connector)
    chat = endpoint.endswith("chat/completions")
    body: dict[str, Any] = {"max_tokens": 7, "stream": stream, "min_tokens": 2}
    if stream:  # stream_options without stream is a client mistake (vLLM's 400)
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "[pdchaos:t:1] hello"}]
    else:
        body["prompt"] = "[pdchaos:t:1] hello"
    status, payload, raw = await pd.post(endpoint, body)
    assert status == 200, raw

    # The client sees the decode's answer.
    if stream:
        text, _, _ = stream_text(raw, chat)
        assert parse_sse(raw).payloads[-1] == DONE
    else:
        choice = payload["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
    assert text == pd.d.answer_text()

    # Prefill leg: sanitised, tagged for remote decode.
    assert len(pd.p.received) == 1 and len(pd.d.received) == 1
    p_kv = received_kv(pd.p, transport)[0]
    d_kv = received_kv(pd.d, transport)[0]
    assert p_kv is not None and d_kv is not None
    if transport == "http":
        p_body = pd.p.received[0]["body"]
        assert p_body["stream"] is False and p_body["max_tokens"] == 1 and p_body["n"] == 1
        assert "min_tokens" not in p_body and "stream_options" not in p_body
        d_body = pd.d.received[0]["body"]
        assert d_body["max_tokens"] == 7 and d_body["stream"] is stream
    else:
        assert pd.p.received[0]["max_tokens"] == 1 and pd.p.received[0]["stream"] is False
        assert pd.d.received[0]["max_tokens"] == 7 and pd.d.received[0]["stream"] is stream
        # Both legs carry the same token ids (one tokenization), and they decode to the prompt.
        assert pd.p.received[0]["input_ids"] == pd.d.received[0]["input_ids"]
        assert "[pdchaos:t:1] hello" in pd.p.received[0]["text"]

    if connector == "mooncake":
        tid = p_kv["transfer_id"]
        assert tid.startswith("xfer-") and len(tid) > len("xfer-") + 16
        assert p_kv == {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
        boot = pd.prefills[0].bootstrap_port if transport == "http" else 17998
        assert d_kv == {
            "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": tid,
            "remote_engine_id": pd.p.engine_id, "remote_bootstrap_addr": f"http://127.0.0.1:{boot}",
        }
    else:
        assert p_kv == {"do_remote_decode": True, "do_remote_prefill": False}
        # NIXL: the decode gets exactly what the prefill answered, verbatim.
        expected = {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": pd.p.engine_id,
            "remote_request_id": d_kv["remote_request_id"], "remote_block_ids": [1, 2],
            "remote_host": "127.0.0.1", "remote_port": pd.p.nixl_port, "tp_size": 1,
        }
        assert d_kv == expected
        if transport == "grpc":
            assert d_kv["remote_request_id"] == pd.p.received[0]["request_id"]

    events = pd.router.server.events.of_type("dispatch")
    assert [e["outcome"] for e in events] == ["ok"]
    assert events[0]["connector"] == connector


async def test_each_request_mints_a_fresh_transfer_id(make_pd: Any) -> None:
    pd = await make_pd("http", "mooncake")
    for i in range(3):
        status, _, raw = await pd.post("/v1/completions", {"prompt": f"p{i}", "max_tokens": 2})
        assert status == 200, raw
    tids = [(kv or {}).get("transfer_id") for kv in received_kv(pd.p, "http")]
    assert len(set(tids)) == 3 and None not in tids
    assert [(kv or {}).get("transfer_id") for kv in received_kv(pd.d, "http")] == tids


@pytest.mark.parametrize("leg", ["prefill", "decode"])
async def test_no_ready_worker_for_a_leg_is_a_prompt_503(make_pd: Any, leg: str) -> None:
    pd = await make_pd("http", "mooncake")
    stub = pd.prefills[0] if leg == "prefill" else pd.decodes[0]
    await stub.stop()  # connection refused: the next probe fails and the worker leaves Ready
    router = pd.router.server
    role_workers = [w for w in router.registry.all() if w.role.value == leg]
    await wait_true(lambda: role_workers[0].status.value != "ready", 3.0, f"{leg} not ready")
    t0 = time.monotonic()
    status, payload, raw = await pd.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert time.monotonic() - t0 < 2.0
    assert status == 503, raw
    assert payload["error"]["code"] == "no_available_workers"
    assert leg in payload["error"]["message"]
    async with pd.router.session.get(pd.router.base + "/readiness") as resp:
        assert resp.status == 503
        assert (await resp.json())["legs"][leg] is False
    # The other leg was never sent anything: the 503 is decided before any leg runs.
    other = pd.d if leg == "prefill" else pd.p
    assert other.received == []


async def test_prefill_failure_is_answered_without_touching_the_decode(make_pd: Any) -> None:
    pd = await make_pd("http", "nixl", request_timeout_s=5.0)
    pd.p.generate_status = 500
    t0 = time.monotonic()
    status, payload, raw = await pd.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert time.monotonic() - t0 < 1.0
    assert status == 502, raw
    assert "prefill" in payload["error"]["message"]
    assert pd.d.received == []
    assert [e["outcome"] for e in pd.router.server.events.of_type("dispatch")] == ["prefill_failed"]


async def test_prefill_hang_is_cut_by_the_request_timeout(make_pd: Any) -> None:
    pd = await make_pd("grpc", "mooncake", request_timeout_s=0.4)
    pd.p.hang_generate = True
    t0 = time.monotonic()
    status, payload, raw = await pd.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
    elapsed = time.monotonic() - t0
    assert status == 504, raw
    assert payload["error"]["code"] == "upstream_timeout"
    assert 0.3 < elapsed < 3.0
    assert pd.d.received == []


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_wedged_decode_does_not_stall_requests_to_the_healthy_one(make_pd: Any, transport: str) -> None:
    pd = await make_pd(transport, "mooncake", n_decode=2, request_timeout_s=2.0)
    wedged = pd.decodes[0].state
    wedged.hang_generate = True

    async def one(i: int) -> tuple[int, float]:
        t0 = time.monotonic()
        status, _, _ = await pd.post("/v1/completions", {"prompt": f"p{i}", "max_tokens": 2})
        return status, time.monotonic() - t0

    results = await asyncio.gather(*(one(i) for i in range(8)))
    ok = [dt for status, dt in results if status == 200]
    cut = [dt for status, dt in results if status == 504]
    # Round robin: half go to the wedged decode and time out; the others answer at once despite them.
    assert len(ok) == 4 and len(cut) == 4
    assert max(ok) < 1.5
    assert min(cut) >= 1.9


async def test_mooncake_without_engine_id_skips_the_mint_and_says_so(make_pd: Any) -> None:
    pd = await make_pd("grpc", "mooncake", wait=False)
    pd.p.engine_id = ""  # the engine reports no id: a complete read without one
    await pd.router.wait_ready()
    status, _, raw = await pd.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 200, raw
    assert received_kv(pd.p, "grpc") == [None]
    assert received_kv(pd.d, "grpc") == [None]
    skipped = pd.router.server.events.of_type("mint_skipped")
    assert [e["reason"] for e in skipped] == ["no_engine_id"]
    assert pd.router.server.metrics.value("pdchaos_router_mint_skipped_total", reason="no_engine_id") == 1


async def test_decode_failure_mid_request_is_a_clean_error(make_pd: Any) -> None:
    pd = await make_pd("grpc", "nixl")
    pd.d.generate_status = 500
    for stream in (False, True):
        body = {"prompt": "x", "max_tokens": 2, "stream": stream}
        status, payload, raw = await pd.post("/v1/completions", body)
        assert status == 502, raw
        assert "decode" in payload["error"]["message"]
    assert len(pd.p.received) == 2


async def test_regular_mode_sends_one_leg_without_handoff_params() -> None:
    a = await HttpStubEngine(StubState("a", "decode", "none")).start()
    b = await GrpcStubEngine(StubState("b", "decode", "none")).start()
    cfg = RouterConfig(pd=False, regular=(a.url, b.url), interval_s=0.1, probe_timeout_s=0.5,
                       success_threshold=1, request_timeout_s=5.0)
    try:
        async with InProcessRouter(cfg) as router:
            await router.wait_ready()
            texts = []
            for i in range(4):
                async with router.session.post(router.base + "/v1/completions",
                                               json={"prompt": f"p{i}", "max_tokens": 3}) as resp:
                    assert resp.status == 200, await resp.text()
                    texts.append((await resp.json())["choices"][0]["text"])
    finally:
        await a.stop()
        await b.stop()
    # Round robin over both workers, whatever their transport; no KV params anywhere.
    assert sorted(texts) == sorted([a.state.answer_text(), b.state.answer_text()] * 2)
    assert [r["body"].get("kv_transfer_params") for r in a.state.received] == [None, None]
    assert [r["kv_transfer_params"] for r in b.state.received] == [None, None]
