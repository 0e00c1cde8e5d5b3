"""The router's HTTP surface: worker API (auth, PATCH, DELETE/draining), bad input, metrics, events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdchaos.waiting import wait_true
from reference_router.config import RouterConfig, WorkerArg
from reference_router.core import Status
from reference_router.stub_engines import GrpcStubEngine, HttpStubEngine, InProcessRouter, StubState

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
async def env() -> AsyncIterator[dict[str, Any]]:
    p = await HttpStubEngine(StubState("p", "prefill", "mooncake"), bootstrap=True).start()
    d = await HttpStubEngine(StubState("d", "decode", "mooncake")).start()
    g = await GrpcStubEngine(StubState("g", "prefill", "mooncake")).start()
    cfg = RouterConfig(
        pd=True, prefill=(WorkerArg(p.url, p.bootstrap_port),), decode=(d.url,), connector="mooncake",
        interval_s=0.1, probe_timeout_s=0.5, success_threshold=1, failure_threshold=1, api_key=KEY,
        model="pdchaos-fake", request_timeout_s=5.0, max_body_bytes=64 * 1024,
    )
    try:
        async with InProcessRouter(cfg) as router:
            await router.wait_ready()
            yield {"router": router, "p": p, "d": d, "g": g}
    finally:
        for s in (p, d, g):
            await s.stop()


async def call(router: InProcessRouter, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, Any]:
    kwargs: dict[str, Any] = {"headers": headers or {}}
    if raw is not None:
        kwargs["data"] = raw
        kwargs["headers"] = {**kwargs["headers"], "Content-Type": "application/json"}
    elif body is not None:
        kwargs["json"] = body
    async with router.session.request(method, router.base + path, **kwargs) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except json.JSONDecodeError:
            return resp.status, text


@pytest.mark.parametrize("method,path", [("GET", "/workers"), ("POST", "/workers"), ("GET", "/workers/w1"),
                                         ("PATCH", "/workers/w1"), ("DELETE", "/workers/w1")])
@pytest.mark.parametrize("header", [None, "Bearer wrong", KEY])
async def test_worker_api_needs_the_key(
    env: dict[str, Any], method: str, path: str, header: str | None
) -> None:
    router = env["router"]
    status, payload = await call(router, method, path, body={"labels": {}},
                                 headers={"Authorization": header} if header else {})
    assert status == 401
    assert payload["error"]["code"] == "unauthorized"
    assert router.server.registry.get("w1").status is Status.READY  # nothing was changed


async def test_worker_lifecycle_and_patch_keeps_kv_config(env: dict[str, Any]) -> None:
    router, g = env["router"], env["g"]
    spec = {"url": g.url, "role": "prefill", "bootstrap_port": 18555, "labels": {"zone": "a"}}
    status, w = await call(router, "POST", "/workers", spec, AUTH)
    assert status == 201, w
    assert w["status"] == "pending" and w["transport"] == "grpc" and w["bootstrap_port"] == 18555
    wid = w["id"]
    await wait_true(lambda: router.server.registry.get(wid).engine_id == g.state.engine_id, 3.0, "id read")
    status, shown = await call(router, "GET", f"/workers/{wid}", headers=AUTH)
    assert shown["kv_engine_id"] == g.state.engine_id and shown["status"] == "ready"

    status, patched = await call(router, "PATCH", f"/workers/{wid}", {"labels": {"zone": "b"}, "priority": 7},
                                 AUTH)
    assert status == 200, patched
    assert patched["labels"] == {"zone": "b"} and patched["priority"] == 7
    for key in ("connector", "role", "bootstrap_port", "kv_engine_id", "url", "transport"):
        assert patched[key] == shown[key], key
    # A PATCH may not touch the KV config at all.
    status, err = await call(router, "PATCH", f"/workers/{wid}", {"bootstrap_port": 1}, AUTH)
    assert status == 400 and err["error"]["code"] == "invalid_update"

    # The API shows the id in force after a refresh, not the one read at registration.
    g.state.healthy = False
    await wait_true(lambda: router.server.registry.get(wid).status is not Status.READY, 3.0, "down")
    g.state.restart("refreshed-id")
    g.state.healthy = True
    await wait_true(lambda: router.server.registry.get(wid).engine_id == "refreshed-id", 3.0, "refresh")
    status, listing = await call(router, "GET", "/workers", headers=AUTH)
    mine = [x for x in listing["workers"] if x["id"] == wid]
    assert mine[0]["kv_engine_id"] == "refreshed-id" and mine[0]["labels"] == {"zone": "b"}

    status, gone = await call(router, "DELETE", f"/workers/{wid}", headers=AUTH)
    assert status == 200 and gone["status"] == "draining"
    status, _ = await call(router, "GET", f"/workers/{wid}", headers=AUTH)
    assert status == 404


async def test_delete_drains_in_flight_requests_first(env: dict[str, Any]) -> None:
    router, d = env["router"], env["d"]
    d.state.hang_generate = True
    pending = asyncio.ensure_future(call(router, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}))
    await wait_true(lambda: len(d.state.received) == 1, 3.0, "request at the decode")
    decode = next(w for w in router.server.registry.all() if w.role.value == "decode")
    status, shown = await call(router, "DELETE", f"/workers/{decode.id}", headers=AUTH)
    assert status == 200 and shown["status"] == "draining"
    # Still registered while its request runs; never probed or chosen again.
    assert router.server.registry.get(decode.id) is decode
    status, payload = await call(router, "POST", "/v1/completions", {"prompt": "y", "max_tokens": 2})
    assert status == 503 and payload["error"]["code"] == "no_available_workers"
    assert not pending.done()
    d.state.hang_generate = False  # the in-flight request finishes normally, then the worker goes
    status, payload = await pending
    assert status == 200, payload
    await wait_true(lambda: router.server.registry.get(decode.id) is None, 3.0, "removal after drain")
    removed = [e for e in router.server.events.of_type("status_change") if e["worker"] == decode.id]
    assert [e["to"] for e in removed][-2:] == ["draining", "removed"]


@pytest.mark.parametrize("body,code", [
    ({"role": "prefill"}, "invalid_worker"),
    ({"url": "ftp://127.0.0.1:1", "role": "prefill"}, "invalid_worker"),
    ({"url": "http://127.0.0.1:1", "role": "chef"}, "invalid_worker"),
    ({"url": "http://127.0.0.1:1", "role": "prefill", "bootstrap_port": 70000}, "invalid_worker"),
    ({"url": "http://127.0.0.1:1", "role": "regular"}, "invalid_worker"),
    ({"url": "http://127.0.0.1:1", "role": "decode", "surprise": 1}, "invalid_worker"),
    ([1, 2], "invalid_worker"),
])
async def test_invalid_worker_spec_is_a_400(env: dict[str, Any], body: Any, code: str) -> None:
    router = env["router"]
    n = len(router.server.registry)
    status, payload = await call(router, "POST", "/workers", body, AUTH)
    assert status == 400, payload
    assert payload["error"]["code"] == code
    assert len(router.server.registry) == n


async def test_duplicate_worker_is_a_409(env: dict[str, Any]) -> None:
    router, p = env["router"], env["p"]
    status, payload = await call(router, "POST", "/workers", {"url": p.url, "role": "prefill"}, AUTH)
    assert status == 409 and payload["error"]["code"] == "duplicate_worker"


@pytest.mark.parametrize("raw,status_code,code", [
    (b"{not json", 400, "invalid_json"),
    (b"", 400, "invalid_json"),
    (b"[1,2]", 400, "invalid_request"),
    (b'{"prompt": 5}', 400, "invalid_request"),
    (b'{"prompt": "x", "max_tokens": -1}', 400, "invalid_request"),
    (b'{"prompt": "x", "stream": "yes"}', 400, "invalid_request"),
    (b'{"prompt": "x", "model": "no-such-model"}', 404, "model_not_found"),
    (b'{"prompt": "' + b"a" * (80 * 1024) + b'"}', 413, "request_too_large"),
])
async def test_bad_input_is_a_4xx_and_the_router_keeps_serving(
    env: dict[str, Any], raw: bytes, status_code: int, code: str
) -> None:
    router = env["router"]
    status, payload = await call(router, "POST", "/v1/completions", raw=raw)
    assert status == status_code, payload
    assert payload["error"]["code"] == code
    assert env["p"].state.received == [] and env["d"].state.received == []
    status, payload = await call(router, "POST", "/v1/completions", {"prompt": "ok", "max_tokens": 2})
    assert status == 200, payload


async def test_chat_without_messages_and_unknown_route(env: dict[str, Any]) -> None:
    router = env["router"]
    status, payload = await call(router, "POST", "/v1/chat/completions", {"messages": []})
    assert status == 400 and payload["error"]["code"] == "invalid_request"
    status, payload = await call(router, "GET", "/v2/nothing")
    assert status == 404 and payload["error"]["code"] == "not_found"


async def test_models_health_metrics_and_events(env: dict[str, Any]) -> None:
    router = env["router"]
    status, models = await call(router, "GET", "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "pdchaos-fake"
    assert (await call(router, "GET", "/health"))[0] == 200
    status, ready = await call(router, "GET", "/readiness")
    assert status == 200 and ready["legs"] == {"prefill": True, "decode": True}
    await call(router, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    await call(router, "POST", "/v1/completions", raw=b"{")

    status, text = await call(router, "GET", "/metrics")
    assert status == 200
    lines = text.splitlines()
    assert 'pdchaos_router_requests_total{endpoint="/v1/completions",status="200"} 1' in lines
    assert 'pdchaos_router_requests_total{endpoint="/v1/completions",status="400"} 1' in lines
    assert 'pdchaos_router_dispatches_total{connector="mooncake",outcome="ok"} 1' in lines
    assert 'pdchaos_router_workers{role="decode",status="ready"} 1' in lines
    assert "# TYPE pdchaos_router_probes_total counter" in lines
    assert any(ln.startswith('pdchaos_router_probes_total{outcome="ok"}') for ln in lines)
    assert any(ln.startswith('pdchaos_router_metadata_reads_total{outcome="id"}') for ln in lines)

    status, first = await call(router, "GET", "/events?since=0")
    assert status == 200 and first["next"] == len(first["events"]) > 0
    types = {e["type"] for e in first["events"]}
    assert {"status_change", "probe", "metadata_read", "engine_id", "dispatch"} <= types
    status, rest = await call(router, "GET", f"/events?since={first['next']}")
    assert all(e not in first["events"] for e in rest["events"])
    assert rest["next"] >= first["next"]
    status, _ = await call(router, "GET", "/events?since=abc")
    assert status == 400


async def test_events_file_mirrors_the_stream(tmp_path: Any) -> None:
    from pdchaos.jsonl import read_jsonl

    p = await HttpStubEngine(StubState("p", "prefill", "nixl")).start()
    d = await HttpStubEngine(StubState("d", "decode", "nixl")).start()
    path = tmp_path / "events.jsonl"
    cfg = RouterConfig(pd=True, prefill=(WorkerArg(p.url),), decode=(d.url,), connector="nixl",
                       interval_s=0.1, probe_timeout_s=0.5, success_threshold=1, events_file=str(path))
    try:
        async with InProcessRouter(cfg) as router:
            await router.wait_ready()
            await call(router, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
            in_memory, _ = router.server.events.since(0)
    finally:
        await p.stop()
        await d.stop()
    on_disk = list(read_jsonl(path))
    assert on_disk == json.loads(json.dumps(in_memory))
    dispatch = [e for e in on_disk if e["type"] == "dispatch"]
    assert dispatch[0]["connector"] == "nixl" and dispatch[0]["outcome"] == "ok"
