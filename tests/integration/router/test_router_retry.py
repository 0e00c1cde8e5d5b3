"""A prefill leg that never reached its worker runs again on another Ready prefill (core.retry).

End-to-end tests run the in-process router against loopback stub engines with a long probe interval, so only a
request (not a scheduled probe) can find a stopped prefill; they assert what the stubs actually received.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from pdchaos.ports import free_port
from pdchaos.proto import vllm_engine_pb2
from pdchaos.waiting import wait_true
from reference_router.config import RouterConfig, WorkerArg
from reference_router.core import (
    NO_RETRY_DEADLINE,
    NO_RETRY_DELIVERED,
    NO_RETRY_NO_OTHER_WORKER,
    Delivery,
    HealthConfig,
    Role,
    Status,
    Worker,
    avoid_suspects,
    begin_probe,
    decide_retry,
    finish_probe,
    make_worker_spec,
    mark_suspect,
    probe_due,
)
from reference_router.errors import UpstreamError
from reference_router.stub_engines import GrpcStubEngine, HttpStubEngine, InProcessRouter, StubState
from reference_router.upstream_grpc import GrpcWorker
from reference_router.upstream_http import post_json

# Probes only at start-up: a stopped prefill stays Ready until a request finds it.
SLOW_PROBES = {"interval_s": 30.0, "probe_timeout_s": 0.5, "success_threshold": 1, "failure_threshold": 1,
               "identity_check_interval_s": 30.0}
GRPC_BOOT = 17998


# ---------------------------------------------------------------- pure decision


def _worker(wid: str, status: Status = Status.READY) -> Worker:
    w = Worker.new(wid, make_worker_spec(f"http://127.0.0.1:{8000 + int(wid[1:])}", Role.PREFILL))
    w.runtime.status = status
    return w


@pytest.mark.parametrize(
    ("delivery", "tried", "ready", "now", "retry", "reason", "candidates"),
    [
        (Delivery.NOT_SENT, ["w1"], ["w1", "w2"], 1.0, True, "not_sent", ["w2"]),
        (Delivery.NOT_SENT, ["w1"], ["w1", "w2", "w3"], 1.0, True, "not_sent", ["w2", "w3"]),
        # One retry per other Ready worker: once every one was tried, the failure is final.
        (Delivery.NOT_SENT, ["w1", "w2"], ["w1", "w2", "w3"], 1.0, True, "not_sent", ["w3"]),
        (Delivery.NOT_SENT, ["w1", "w2"], ["w1", "w2"], 1.0, False, NO_RETRY_NO_OTHER_WORKER, []),
        (Delivery.NOT_SENT, ["w1"], ["w1"], 1.0, False, NO_RETRY_NO_OTHER_WORKER, []),
        (Delivery.NOT_SENT, ["w1"], [], 1.0, False, NO_RETRY_NO_OTHER_WORKER, []),
        # The request's deadline bounds retries.
        (Delivery.NOT_SENT, ["w1"], ["w1", "w2"], 5.0, False, NO_RETRY_DEADLINE, []),
        (Delivery.NOT_SENT, ["w1"], ["w1", "w2"], 7.0, False, NO_RETRY_DEADLINE, []),
        # Whatever may have reached the engine is never run twice, however many workers are Ready.
        (Delivery.MAYBE_SENT, ["w1"], ["w1", "w2"], 1.0, False, NO_RETRY_DELIVERED, []),
        (Delivery.ANSWERED, ["w1"], ["w1", "w2"], 1.0, False, NO_RETRY_DELIVERED, []),
    ],
)
def test_decide_retry_table(
    delivery: Delivery, tried: list[str], ready: list[str], now: float, retry: bool, reason: str,
    candidates: list[str],
) -> None:
    decision = decide_retry(delivery, tried, [_worker(w) for w in ready], now, deadline=5.0)
    assert (decision.retry, decision.reason) == (retry, reason)
    assert [w.id for w in decision.candidates] == candidates


def test_decide_retry_skips_workers_no_longer_ready() -> None:
    ready = [_worker("w1"), _worker("w2", Status.NOT_READY), _worker("w3", Status.DRAINING)]
    decision = decide_retry(Delivery.NOT_SENT, ["w1"], ready, 0.0, 1.0)
    assert not decision.retry and decision.reason == NO_RETRY_NO_OTHER_WORKER


def test_suspect_worker_is_probed_at_once_and_avoided_until_probed() -> None:
    cfg = HealthConfig(interval_s=10.0, probe_timeout_s=1.0, failure_threshold=1, success_threshold=1)
    a, b = _worker("w1"), _worker("w2")
    a.runtime.last_probe_at = 0.0
    assert not probe_due(a, 1.0, cfg)
    assert mark_suspect(a, 1.0) and not mark_suspect(a, 1.5)  # marked once
    assert probe_due(a, 1.0, cfg)
    assert avoid_suspects([a, b]) == [b]
    assert avoid_suspects([a]) == [a]  # better a suspect than nothing: the leg's own retry covers it
    token = begin_probe(a, 1.1)
    result = finish_probe(a, token, False, 1.2, cfg)
    assert result is not None and result.status_after is Status.NOT_READY
    assert a.runtime.suspect_since is None and not probe_due(a, 1.3, cfg)


def test_probe_started_before_the_failure_keeps_the_suspicion() -> None:
    cfg = HealthConfig(interval_s=10.0, probe_timeout_s=1.0, failure_threshold=1, success_threshold=1)
    a = _worker("w1")
    token = begin_probe(a, 1.0)
    mark_suspect(a, 1.5)  # the leg failed while that probe was on its way
    assert not probe_due(a, 1.5, cfg)  # one probe at a time
    finish_probe(a, token, False, 1.6, cfg)
    assert a.runtime.suspect_since == 1.5 and probe_due(a, 1.7, cfg)


def test_draining_worker_is_never_marked_suspect() -> None:
    a = _worker("w1", Status.DRAINING)
    assert not mark_suspect(a, 1.0) and a.runtime.suspect_since is None


# ---------------------------------------------------------------- failure classification


async def test_refused_http_leg_is_not_sent_and_an_answered_error_is() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(UpstreamError) as refused:
            await post_json(session, f"http://127.0.0.1:{free_port()}/v1/completions", {}, 2.0)
        assert refused.value.delivery is Delivery.NOT_SENT and refused.value.status == 502
        stub = await HttpStubEngine(StubState("p", "prefill", "nixl", generate_status=500)).start()
        try:
            with pytest.raises(UpstreamError) as answered:
                await post_json(session, f"{stub.url}/v1/completions", {"prompt": "x"}, 2.0)
        finally:
            await stub.stop()
        assert answered.value.delivery is Delivery.ANSWERED


async def test_refused_grpc_leg_is_not_sent_and_an_aborted_one_was_answered() -> None:
    request = vllm_engine_pb2.GenerateRequest(request_id="r")
    closed = GrpcWorker(f"127.0.0.1:{free_port()}")
    try:
        with pytest.raises(UpstreamError) as refused:
            await closed.generate_complete(request, 2.0)
    finally:
        await closed.close()
    assert refused.value.delivery is Delivery.NOT_SENT
    stub = await GrpcStubEngine(StubState("p", "prefill", "nixl", generate_status=500)).start()
    client = GrpcWorker(f"127.0.0.1:{stub.port}")
    try:
        with pytest.raises(UpstreamError) as aborted:
            await client.generate_complete(request, 2.0)
    finally:
        await client.close()
        await stub.stop()
    assert aborted.value.delivery is Delivery.ANSWERED  # the engine answered: not a transport fault
    assert isinstance(aborted.value.__cause__, grpc.aio.AioRpcError)


# ---------------------------------------------------------------- end to end


class TwoPrefills:
    def __init__(self, router: InProcessRouter, prefills: list[Any], decodes: list[Any]) -> None:
        self.router = router
        self.prefills = prefills
        self.decodes = decodes
        self.decode = decodes[0]

    def worker(self, stub: Any) -> Worker:
        url = stub.url
        return next(w for w in self.router.server.registry.all() if w.spec.url == url)

    async def post(self, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.router.session.post(self.router.base + "/v1/completions", json=body) as resp:
            text = await resp.text()
            return resp.status, json.loads(text)


@pytest.fixture
async def make_router() -> AsyncIterator[Any]:
    made: list[tuple[InProcessRouter, list[Any]]] = []

    async def _make(transport: str, connector: str, n_prefill: int = 2, n_decode: int = 1) -> TwoPrefills:
        stubs: list[Any] = []
        try:
            prefills = []
            for i in range(n_prefill):
                state = StubState(f"p{i}", "prefill", connector)
                stub = GrpcStubEngine(state) if transport == "grpc" else HttpStubEngine(
                    state, bootstrap=connector == "mooncake")
                prefills.append(await stub.start())
                stubs.append(prefills[-1])
            decodes = []
            for i in range(n_decode):
                state = StubState(f"d{i}", "decode", connector)
                decodes.append(
                    await (GrpcStubEngine(state) if transport == "grpc" else HttpStubEngine(state)).start())
                stubs.append(decodes[-1])
            args = tuple(
                WorkerArg(p.url, p.bootstrap_port if transport == "http" else GRPC_BOOT) for p in prefills
            )
            cfg = RouterConfig(pd=True, prefill=args, decode=tuple(d.url for d in decodes),
                               connector=connector, request_timeout_s=5.0, **SLOW_PROBES)
            router = InProcessRouter(cfg)
            await router.__aenter__()
            made.append((router, stubs))
        except BaseException:
            for s in stubs:
                await s.stop()
            raise
        await router.wait_ready()
        return TwoPrefills(router, prefills, decodes)

    try:
        yield _make
    finally:
        for router, stubs in made:
            await router.__aexit__(None, None, None)
            for s in stubs:
                await s.stop()


def _kv(state: StubState, transport: str) -> list[dict[str, Any] | None]:
    if transport == "grpc":
        return [r["kv_transfer_params"] for r in state.received]
    return [r["body"].get("kv_transfer_params") for r in state.received]


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
async def test_refused_prefill_leg_is_retried_on_the_other_prefill(
    make_router: Any, transport: str, connector: str
) -> None:
    env = await make_router(transport, connector)
    live, dead = env.prefills
    live_w, dead_w = env.worker(live), env.worker(dead)
    await dead.stop()  # connection refused; the router's probes will not notice for 30 s
    assert dead_w.status is Status.READY

    # Round robin: one of two requests goes to the dead prefill first.
    for i in range(2):
        status, payload = await env.post({"prompt": f"q{i}", "max_tokens": 3})
        assert status == 200, payload
        assert payload["choices"][0]["text"] == env.decode.state.answer_text()

    assert dead.state.received == [] and len(live.state.received) == 2
    events = env.router.server.events.of_type("dispatch")
    assert [e["outcome"] for e in events] == ["ok", "ok"]
    retried = [e for e in events if "retried_from" in e]
    assert len(retried) == 1
    assert retried[0]["retried_from"] == [dead_w.id] and retried[0]["prefill"] == live_w.id
    assert retried[0]["prefill_url"] == live.url
    metrics = env.router.server.metrics
    assert metrics.value("pdchaos_router_leg_retries_total", leg="prefill", outcome="retried") == 1

    # The retried leg carried the handoff of the prefill that ran it, and the decode got that one's params.
    decode_kv = _kv(env.decode.state, transport)
    prefill_kv = _kv(live.state, transport)
    assert len(decode_kv) == 2 and all(kv is not None for kv in decode_kv)
    for p_kv, d_kv in zip(prefill_kv, decode_kv, strict=True):
        assert p_kv is not None and d_kv is not None
        assert d_kv["remote_engine_id"] == live.state.engine_id
        if connector == "mooncake":
            assert d_kv["transfer_id"] == p_kv["transfer_id"]
            boot = live.bootstrap_port if transport == "http" else GRPC_BOOT
            assert d_kv["remote_bootstrap_addr"] == f"http://127.0.0.1:{boot}"
        else:
            assert d_kv["remote_port"] == live.state.nixl_port

    # The dead prefill was marked suspect and probed at once (not 30 s later): it leaves Ready.
    assert any(e["worker"] == dead_w.id for e in env.router.server.events.of_type("worker_suspect"))
    await wait_true(lambda: dead_w.status is not Status.READY, 3.0, "dead prefill leaves Ready")


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_refused_leg_with_no_other_prefill_fails_promptly(make_router: Any, transport: str) -> None:
    env = await make_router(transport, "nixl", n_prefill=1)
    only = env.prefills[0]
    only_w = env.worker(only)
    await only.stop()
    t0 = time.monotonic()
    status, payload = await env.post({"prompt": "x", "max_tokens": 2})
    assert time.monotonic() - t0 < 2.0
    assert status == 502 and payload["error"]["code"] == "upstream_error", payload
    (event,) = env.router.server.events.of_type("dispatch")
    assert event["outcome"] == "prefill_failed" and "retried_from" not in event
    metrics = env.router.server.metrics
    assert metrics.value("pdchaos_router_leg_retries_total", leg="prefill",
                         outcome=NO_RETRY_NO_OTHER_WORKER) == 1
    assert metrics.value("pdchaos_router_leg_retries_total", leg="prefill", outcome="retried") == 0
    # The failed leg made the router probe it at once: the next request is a prompt 503, not another 502.
    await wait_true(lambda: only_w.status is not Status.READY, 3.0, "prefill leaves Ready")
    status, payload = await env.post({"prompt": "x", "max_tokens": 2})
    assert status == 503 and payload["error"]["code"] == "no_available_workers", payload


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_error_after_the_request_was_sent_is_not_retried(make_router: Any, transport: str) -> None:
    env = await make_router(transport, "mooncake")
    good, bad = env.prefills
    bad.state.generate_status = 500
    statuses = [(await env.post({"prompt": f"q{i}", "max_tokens": 2}))[0] for i in range(2)]
    assert sorted(statuses) == [200, 502]
    # The failing prefill saw its request once; the other prefill never ran it a second time.
    assert len(bad.state.received) == 1 and len(good.state.received) == 1
    assert len(env.decode.state.received) == 1
    events = env.router.server.events.of_type("dispatch")
    assert sorted(e["outcome"] for e in events) == ["ok", "prefill_failed"]
    assert not any("retried_from" in e for e in events)
    assert env.router.server.events.of_type("worker_suspect") == []
    metrics = env.router.server.metrics
    assert metrics.value("pdchaos_router_leg_retries_total", leg="prefill", outcome="retried") == 0
    assert env.worker(bad).runtime.suspect_since is None


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_decode_leg_is_never_retried(make_router: Any, transport: str) -> None:
    # The decode may already be pulling KV when its leg fails; even a refused decode leg is answered as is.
    env = await make_router(transport, "nixl", n_prefill=1, n_decode=2)
    live, dead = env.decodes
    await dead.stop()
    statuses = sorted([(await env.post({"prompt": f"q{i}", "max_tokens": 2}))[0] for i in range(2)])
    assert statuses == [200, 502]
    assert len(live.state.received) == 1 and len(env.prefills[0].state.received) == 2
    events = env.router.server.events.of_type("dispatch")
    assert sorted(e["outcome"] for e in events) == ["decode_failed", "ok"]
    assert not any("retried_from" in e for e in events)


async def test_an_answer_that_is_not_text_is_an_answered_error() -> None:
    """An engine answering bytes that are no UTF-8 text: the same answered error as bad JSON, never an
    exception out of the leg."""
    from aiohttp import web
    from helpers.aiohttp_server import serving

    async def garbage(_request: web.Request) -> web.Response:
        return web.Response(status=500, body=b"\x80\x81garbage")

    app = web.Application()
    app.router.add_post("/v1/completions", garbage)
    async with serving(app) as url, aiohttp.ClientSession() as session:
        with pytest.raises(UpstreamError) as answered:
            await post_json(session, f"{url}/v1/completions", {"prompt": "x"}, 2.0)
    assert answered.value.delivery is Delivery.ANSWERED and answered.value.worker_status == 500
