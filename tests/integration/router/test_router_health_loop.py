"""The router's health loop against loopback stub engines: probe slots, engine-id re-reads, restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdchaos.waiting import wait_true
from reference_router.config import RouterConfig, WorkerArg
from reference_router.core import Status
from reference_router.stub_engines import GrpcStubEngine, HttpStubEngine, InProcessRouter, StubState

INTERVAL = 0.2
PROBE_TIMEOUT = 0.25


@pytest.fixture
async def stubs() -> AsyncIterator[list[Any]]:
    started: list[Any] = []
    try:
        yield started
    finally:
        for s in started:
            await s.stop()


async def grpc_stub(stubs: list[Any], name: str, role: str = "prefill", connector: str = "mooncake") -> Any:
    stub = await GrpcStubEngine(StubState(name, role, connector)).start()
    stubs.append(stub)
    return stub


async def mooncake_pair(stubs: list[Any], transport: str) -> tuple[Any, Any, int]:
    """A Mooncake prefill and decode over `transport` ("http" or "grpc"), and the prefill's bootstrap port."""
    if transport == "http":
        p = await HttpStubEngine(StubState("p", "prefill", "mooncake"), bootstrap=True).start()
        d = await HttpStubEngine(StubState("d", "decode", "mooncake")).start()
        stubs.extend([p, d])
        return p, d, p.bootstrap_port
    p = await grpc_stub(stubs, "p")
    d = await grpc_stub(stubs, "d", role="decode")
    return p, d, 18001


def router_cfg(**kw: Any) -> RouterConfig:
    base: dict[str, Any] = {
        "pd": True, "connector": "mooncake", "interval_s": INTERVAL, "probe_timeout_s": PROBE_TIMEOUT,
        "success_threshold": 1, "failure_threshold": 1, "identity_check_interval_s": 60.0,
        "request_timeout_s": 5.0,
    }
    base.update(kw)
    return RouterConfig(**base)


async def add_worker(router: InProcessRouter, body: dict[str, Any]) -> dict[str, Any]:
    async with router.session.post(router.base + "/workers", json=body) as resp:
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())


async def hung_server_info_scenario(stubs: list[Any], bugs: frozenset[str]) -> dict[str, Any]:
    """Three gRPC prefills, one slot. The hung one ("a") has a seeded id and a GetServerInfo that never
    answers, so its first probe after it turns Ready starts a re-read that hangs. Watch for 2 s."""
    a = await grpc_stub(stubs, "a")
    b = await grpc_stub(stubs, "b")
    c = await grpc_stub(stubs, "c")
    a.state.hang_server_info = True
    async with InProcessRouter(router_cfg(max_probes_in_flight=1, bugs=bugs)) as router:
        wa = await add_worker(router, {"url": a.url, "role": "prefill", "bootstrap_port": 18001,
                                       "engine_id": "seeded-id"})
        await add_worker(router, {"url": b.url, "role": "prefill", "bootstrap_port": 18002})
        await add_worker(router, {"url": c.url, "role": "prefill", "bootstrap_port": 18003})
        reg = router.server.registry
        worker_a = reg.get(wa["id"])
        assert worker_a is not None
        await wait_true(lambda: a.state.server_info_calls >= 1, 3.0, "the hung re-read to start")
        start = {s.state.name: s.state.probes for s in (a, b, c)}
        await asyncio.sleep(2.0)
        end = {s.state.name: s.state.probes for s in (a, b, c)}
        async with router.session.get(f"{router.base}/workers/{wa['id']}") as resp:
            shown = await resp.json()
        return {
            "probes_during": {k: end[k] - start[k] for k in end},
            "server_info_calls": a.state.server_info_calls,
            "a_status": worker_a.status,
            "a_shown": shown,
            "timeouts": [e for e in router.server.events.of_type("metadata_read")
                         if e["worker"] == wa["id"] and e["outcome"] == "timeout"],
        }


async def test_hung_metadata_read_never_holds_the_slot(stubs: list[Any]) -> None:
    r = await hung_server_info_scenario(stubs, frozenset())
    during = r["probes_during"]
    # 2 s at a 0.2 s interval: about 10 probes each if on schedule. The other workers keep their schedule
    # although the hung one costs up to 2 x probe timeout of the single slot per cycle.
    assert during["b"] >= 4 and during["c"] >= 4, during
    # The hung worker is probed again next interval, and its re-read retried (and timed out) again.
    assert during["a"] >= 2, during
    assert r["server_info_calls"] >= 2
    assert len(r["timeouts"]) >= 2
    # It keeps its old id, unconfirmed, and stays schedulable.
    assert r["a_shown"]["kv_engine_id"] == "seeded-id"
    assert r["a_shown"]["engine_id_confirmed"] is False
    assert r["a_status"] is Status.READY


async def test_injected_metadata_no_deadline_shows_the_stuck_slot(stubs: list[Any]) -> None:
    r = await hung_server_info_scenario(stubs, frozenset({"metadata_no_deadline"}))
    during = r["probes_during"]
    # The re-read never returns: the hung worker is never probed again, and with its slot lost nobody is.
    assert during == {"a": 0, "b": 0, "c": 0}, during
    assert r["server_info_calls"] == 1
    assert r["timeouts"] == []


async def test_probe_failures_walk_the_status_machine(stubs: list[Any]) -> None:
    a = await grpc_stub(stubs, "a")
    d = await grpc_stub(stubs, "d", role="decode")
    cfg = router_cfg(prefill=(WorkerArg(a.url, 18001),), decode=(d.url,), failure_threshold=2,
                     success_threshold=2)
    async with InProcessRouter(cfg) as router:
        await router.wait_ready()
        worker = router.server.registry.all()[0]
        a.state.healthy = False
        await wait_true(lambda: worker.status is Status.NOT_READY, 3.0, "not ready")
        await wait_true(lambda: worker.status is Status.FAILED, 3.0, "failed")
        a.state.healthy = True
        # Failed is not terminal: the same address rejoins.
        await wait_true(lambda: worker.status is Status.READY, 3.0, "ready again")
        changes = [(e["from"], e["to"]) for e in router.server.events.of_type("status_change")
                   if e["worker"] == worker.id]
        assert changes == [(None, "pending"), ("pending", "ready"), ("ready", "not_ready"),
                           ("not_ready", "failed"), ("failed", "ready")]


async def test_hung_health_probe_counts_as_failed_and_frees_the_slot(stubs: list[Any]) -> None:
    a = await grpc_stub(stubs, "a")
    b = await grpc_stub(stubs, "b")
    cfg = router_cfg(prefill=(WorkerArg(a.url, 18001), WorkerArg(b.url, 18002)), decode=(),
                     max_probes_in_flight=1)
    async with InProcessRouter(cfg) as router:
        wa, wb = router.server.registry.all()
        await wait_true(lambda: wa.status is Status.READY and wb.status is Status.READY, 3.0, "ready")
        a.state.hang_health = True
        await wait_true(lambda: wa.status is Status.NOT_READY, 3.0, "hung worker not ready")
        before = b.state.probes
        await asyncio.sleep(1.0)
        assert b.state.probes - before >= 2
        assert wb.status is Status.READY


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_restart_with_new_id_reaches_the_decode_after_the_reread(
    stubs: list[Any], transport: str
) -> None:
    p, d, boot = await mooncake_pair(stubs, transport)
    cfg = router_cfg(prefill=(WorkerArg(p.url, boot),), decode=(d.url,))
    async with InProcessRouter(cfg) as router:
        await router.wait_ready()
        worker = router.server.registry.all()[0]
        old = p.state.engine_id
        await wait_true(lambda: worker.engine_id == old, 3.0, "first id read")

        async def decode_id() -> str:
            async with router.session.post(router.base + "/v1/completions",
                                           json={"prompt": "x", "max_tokens": 2}) as resp:
                assert resp.status == 200, await resp.text()
            last = d.state.received[-1]
            kv = last["kv_transfer_params"] if transport == "grpc" else last["body"]["kv_transfer_params"]
            return str(kv["remote_engine_id"])

        assert await decode_id() == old
        # A restart the probes see: down for a probe, back with a new id on the same address.
        p.state.healthy = False
        await wait_true(lambda: worker.status is not Status.READY, 3.0, "restart seen")
        p.state.restart("engine-after-restart")
        p.state.healthy = True
        await wait_true(lambda: worker.status is Status.READY, 3.0, "back")
        await wait_true(lambda: worker.engine_id == "engine-after-restart", 3.0, "re-read new id")
        assert await decode_id() == "engine-after-restart"
        async with router.session.get(f"{router.base}/workers/{worker.id}") as resp:
            shown = await resp.json()
        assert shown["kv_engine_id"] == "engine-after-restart" and shown["engine_id_confirmed"] is True
        changes = [e for e in router.server.events.of_type("engine_id") if e["worker"] == worker.id]
        assert changes[-1]["old"] == old and changes[-1]["new"] == "engine-after-restart"


async def test_restart_no_probe_sees_is_caught_by_the_identity_check(stubs: list[Any]) -> None:
    p = await grpc_stub(stubs, "p")
    d = await grpc_stub(stubs, "d", role="decode")
    cfg = router_cfg(prefill=(WorkerArg(p.url, 18001),), decode=(d.url,), identity_check_interval_s=0.3)
    async with InProcessRouter(cfg) as router:
        await router.wait_ready()
        worker = router.server.registry.all()[0]
        await wait_true(lambda: worker.engine_id == p.state.engine_id, 3.0, "first id")
        reads_before = p.state.server_info_calls
        p.state.restart("silently-restarted")  # health never fails
        await wait_true(lambda: worker.engine_id == "silently-restarted", 2.0, "identity check")
        # Low rate: about one read per identity interval, not one per probe.
        await asyncio.sleep(1.0)
        reads = p.state.server_info_calls - reads_before
        probes = p.state.probes
        assert reads <= 6 < probes


async def test_stale_engine_id_bug_keeps_minting_the_dead_id(stubs: list[Any]) -> None:
    p = await grpc_stub(stubs, "p")
    d = await grpc_stub(stubs, "d", role="decode")
    cfg = router_cfg(prefill=(WorkerArg(p.url, 18001),), decode=(d.url,), identity_check_interval_s=0.3,
                     bugs=frozenset({"stale_engine_id"}))
    async with InProcessRouter(cfg) as router:
        await router.wait_ready()
        worker = router.server.registry.all()[0]
        old = p.state.engine_id
        await wait_true(lambda: worker.engine_id == old, 3.0, "first id")
        p.state.healthy = False
        await wait_true(lambda: worker.status is not Status.READY, 3.0, "restart seen")
        p.state.restart("new-id")
        p.state.healthy = True
        await wait_true(lambda: worker.status is Status.READY, 3.0, "back")
        await asyncio.sleep(1.0)
        assert worker.engine_id == old


@pytest.mark.parametrize("bug", [None, "partial_read_clears_id"])
async def test_partial_read_keeps_the_known_id(stubs: list[Any], bug: str | None) -> None:
    p = await grpc_stub(stubs, "p")
    d = await grpc_stub(stubs, "d", role="decode")
    bugs = frozenset({bug}) if bug else frozenset()
    cfg = router_cfg(prefill=(WorkerArg(p.url, 18001),), decode=(d.url,), bugs=bugs)
    async with InProcessRouter(cfg) as router:
        await router.wait_ready()
        worker = router.server.registry.all()[0]
        old = p.state.engine_id
        await wait_true(lambda: worker.engine_id == old, 3.0, "first id")
        p.state.fail_server_info = True  # GetServerInfo fails, GetModelInfo answers: a partial read
        p.state.healthy = False
        await wait_true(lambda: worker.status is not Status.READY, 3.0, "down")
        p.state.healthy = True
        await wait_true(lambda: worker.status is Status.READY, 3.0, "back")
        def partial_seen() -> bool:
            return any(e["worker"] == worker.id and e["outcome"] == "error" and e["read"] == "partial"
                       for e in router.server.events.of_type("metadata_read"))

        await wait_true(partial_seen, 3.0, "partial read")
        if bug:
            assert worker.engine_id is None
        else:
            assert worker.engine_id == old and worker.runtime.engine_id_confirmed is False


async def test_grpc_engine_back_after_an_outage_rejoins_promptly(stubs: list[Any]) -> None:
    p = await grpc_stub(stubs, "p")
    d = await grpc_stub(stubs, "d", role="decode")
    cfg = router_cfg(prefill=(WorkerArg(p.url, 18001),), decode=(d.url,))
    async with InProcessRouter(cfg) as router:
        await router.wait_ready()
        worker = router.server.registry.all()[0]
        await p.stop()  # connection refused from now on; the channel backs off between reconnects
        await wait_true(lambda: worker.status is Status.FAILED, 5.0, "failed")
        await asyncio.sleep(2.0)  # long enough for gRPC's default backoff to grow past several seconds
        p.state.restart("after-outage")
        await p.start()  # same port
        # Within about one probe interval (0.2 s), not after the channel's reconnect backoff.
        await wait_true(lambda: worker.status is Status.READY, 0.8, "rejoined")
        await wait_true(lambda: worker.engine_id == "after-outage", 2.0, "new id read")


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_request_right_after_promotion_waits_for_the_reread(stubs: list[Any], transport: str) -> None:
    """The worker turns Ready at the probe; the id read after it is slow. A request in that window must not
    mint the id from before the restart."""
    p, d, boot = await mooncake_pair(stubs, transport)
    cfg = router_cfg(prefill=(WorkerArg(p.url, boot),), decode=(d.url,), probe_timeout_s=1.5)
    async with InProcessRouter(cfg) as router:
        await router.wait_ready()
        worker = router.server.registry.all()[0]
        await wait_true(lambda: worker.engine_id == p.state.engine_id, 3.0, "first id")
        p.state.healthy = False
        await wait_true(lambda: worker.status is Status.NOT_READY, 3.0, "down")
        p.state.restart("fresh-id")
        p.state.server_info_delay_s = 0.5
        p.state.healthy = True
        await wait_true(lambda: worker.status is Status.READY, 3.0, "promoted", interval_s=0.002)
        assert worker.engine_id != "fresh-id"  # the read is still running
        async with router.session.post(router.base + "/v1/completions",
                                       json={"prompt": "x", "max_tokens": 2}) as resp:
            assert resp.status == 200, await resp.text()
        last = d.state.received[-1]
        kv = last["kv_transfer_params"] if transport == "grpc" else last["body"]["kv_transfer_params"]
        assert kv["remote_engine_id"] == "fresh-id"
