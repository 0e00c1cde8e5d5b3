"""The circuit breaker end to end: the in-process router against loopback stub engines, with the open period
scaled to a fraction of a second. What the stubs received shows which worker was taken out and when."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdchaos.waiting import wait_true
from reference_router.config import RouterConfig, WorkerArg
from reference_router.stub_engines import GrpcStubEngine, HttpStubEngine, InProcessRouter, StubState

OPEN_S = 0.8
# Probes pass throughout (the stubs' health stays 200): only requests move the breaker.
SETTINGS: dict[str, Any] = {"interval_s": 0.1, "probe_timeout_s": 0.5, "success_threshold": 1,
                            "failure_threshold": 1, "request_timeout_s": 5.0}
BODY = {"prompt": "[pdchaos:t:1] hello", "max_tokens": 4}


class Cluster:
    def __init__(self, router: InProcessRouter, decodes: list[Any]) -> None:
        self.router = router
        self.d0, self.d1 = (d.state for d in decodes)
        by_url = {w.spec.url: w.id for w in router.server.registry.all()}
        self.ids = {d.state.name: by_url[d.url] for d in decodes}

    async def complete(self) -> int:
        async with self.router.session.post(self.router.base + "/v1/completions", json=BODY) as resp:
            await resp.read()
            return resp.status

    async def worker(self, stub: StubState) -> dict[str, Any]:
        async with self.router.session.get(self.router.base + "/workers") as resp:
            workers = (await resp.json())["workers"]
        return next(w for w in workers if w["id"] == self.ids[stub.name])

    async def events(self, type_: str) -> list[dict[str, Any]]:
        async with self.router.session.get(self.router.base + "/events") as resp:
            return [e for e in (await resp.json())["events"] if e["type"] == type_]

    async def metrics(self) -> str:
        async with self.router.session.get(self.router.base + "/metrics") as resp:
            return await resp.text()


@pytest.fixture
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    transport: str = request.param
    stubs: list[Any] = []
    router: InProcessRouter | None = None

    async def start(state: StubState) -> Any:
        stub = await (GrpcStubEngine(state) if transport == "grpc" else HttpStubEngine(state)).start()
        stubs.append(stub)
        return stub

    try:
        p = await start(StubState("p0", "prefill", "nixl"))
        d0 = await start(StubState("d0", "decode", "nixl"))
        d1 = await start(StubState("d1", "decode", "nixl"))
        cfg = RouterConfig(pd=True, prefill=(WorkerArg(p.url),), decode=(d0.url, d1.url), connector="nixl",
                           cb_failure_threshold=2, cb_open_s=OPEN_S, **SETTINGS)
        router = InProcessRouter(cfg)
        await router.__aenter__()
        await router.wait_ready()
        yield Cluster(router, [d0, d1])
    finally:
        if router is not None:
            await router.__aexit__(None, None, None)
        for s in stubs:
            await s.stop()


@pytest.mark.parametrize("cluster", ["http", "grpc"], indirect=True)
async def test_a_failing_decode_is_taken_out_after_n_failures_and_back_after_the_open_period(
    cluster: Cluster,
) -> None:
    c = cluster
    c.d0.generate_status = 500
    # Round robin alternates the decodes: d0 fails twice (its threshold), d1 serves.
    assert [await c.complete() for _ in range(4)] == [502, 200, 502, 200]
    opened_at = time.monotonic()
    assert len(c.d0.received) == 2
    assert (await c.worker(c.d0))["breaker"] == "open"
    assert (await c.worker(c.d0))["status"] == "ready"  # its probes pass: only the breaker keeps it out

    # While open every request goes to d1 and succeeds.
    statuses = [await c.complete() for _ in range(6)]
    assert time.monotonic() - opened_at < OPEN_S, "too slow to observe the open period"
    assert statuses == [200] * 6 and len(c.d0.received) == 2 and len(c.d1.received) == 8

    # The worker recovers; after the open period one trial reaches it and closes the breaker.
    c.d0.generate_status = 200
    await wait_true(lambda: time.monotonic() - opened_at >= OPEN_S, 5.0, "open period over")
    assert [await c.complete() for _ in range(4)] == [200] * 4
    assert len(c.d0.received) >= 3
    assert (await c.worker(c.d0))["breaker"] == "closed"
    assert [(e["from"], e["to"], e["reason"]) for e in await c.events("breaker")] == [
        ("closed", "open", "consecutive_failures"),
        ("open", "half_open", "open_elapsed"),
        ("half_open", "closed", "trial_succeeded"),
    ]
    assert {e["worker"] for e in await c.events("breaker")} == {c.ids["d0"]}
    text = await c.metrics()
    for to in ("open", "half_open", "closed"):
        assert f'pdchaos_router_breaker_transitions_total{{to="{to}"}} 1' in text


@pytest.mark.parametrize("cluster", ["http", "grpc"], indirect=True)
async def test_a_decode_whose_kv_load_fails_is_never_taken_out(cluster: Cluster) -> None:
    c = cluster
    c.d0.generate_status = 500
    c.d0.generate_error = "KV load failed: KV transfer timed out"
    statuses = [await c.complete() for _ in range(8)]
    assert statuses == [502, 200] * 4
    assert len(c.d0.received) == 4  # still picked every other time
    assert (await c.worker(c.d0))["breaker"] == "closed"
    assert await c.events("breaker") == []
