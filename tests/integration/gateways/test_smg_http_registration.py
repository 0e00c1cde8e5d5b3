"""The smg adapter's HTTP registration against a small server shaped like smg's worker API and a Mooncake
bootstrap server: once smg is live, each worker is posted with its KV transfer facts (the engine id read
from `/query`), spelled per release; a refusal or an unreadable `/query` is said, not hidden."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.routers import RouterAdapterError
from harness.routers.gateways.adapters import SmgFlagsRouter, SmgOperatorRouter, SmgRouter
from harness.scenario import RouterSettings
from harness.topology import Topology, allocate

FLAGS = frozenset({"--host", "--port", "--prometheus-host", "--prometheus-port", "--pd-disaggregation",
                   "--prefill", "--decode", "--log-level"})


@dataclass
class Served:
    topo: Topology
    posted: list[dict[str, Any]] = field(default_factory=list)
    status: int = 202
    query_answers: bool = True
    engine_id: str = "eng-p-1"
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> worker, as smg lists them
    deleted: list[str] = field(default_factory=list)
    # DELETE only starts smg's removal job: the URL stays taken for this many POSTs after it.
    busy_after_delete: int = 0


async def _serve(app: web.Application, port: int, runners: list[web.AppRunner]) -> None:
    runner = web.AppRunner(app)
    await runner.setup()
    runners.append(runner)
    await web.TCPSite(runner, "127.0.0.1", port).start()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    s = Served(allocate("1p1d", "mooncake", "http"))

    async def liveness(r: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def post_worker(r: web.Request) -> web.Response:
        body = await r.json()
        s.posted.append(body)
        if s.busy_after_delete > 0:
            s.busy_after_delete -= 1
            return web.json_response({"error": "worker already exists"}, status=409)
        if s.status in (200, 201, 202):
            wid = f"w{len(s.posted)}"
            s.workers[wid] = {"id": wid, "url": body["url"], "worker_type": body["worker_type"]}
        return web.json_response({"status": "accepted"}, status=s.status)

    async def list_workers(r: web.Request) -> web.Response:
        return web.json_response({"workers": list(s.workers.values())})

    async def delete_worker(r: web.Request) -> web.Response:
        wid = r.match_info["wid"]
        if s.workers.pop(wid, None) is None:
            return web.json_response({"error": "no such worker"}, status=404)
        s.deleted.append(wid)
        return web.json_response({"status": "accepted"}, status=202)

    async def query(r: web.Request) -> web.Response:
        if not s.query_answers:
            return web.Response(status=503)
        return web.json_response({"0": {"engine_id": s.engine_id, "worker_addr": {"0": {"0": "tcp://h:1"}}}})

    gw = web.Application()
    gw.router.add_get("/liveness", liveness)
    gw.router.add_post("/workers", post_worker)
    gw.router.add_get("/workers", list_workers)
    gw.router.add_delete("/workers/{wid}", delete_worker)
    boot = web.Application()
    boot.router.add_get("/query", query)
    runners: list[web.AppRunner] = []
    try:
        await _serve(gw, s.topo.router_port, runners)
        await _serve(boot, s.topo.prefills[0].bootstrap_port, runners)
        yield s
    finally:
        for r in runners:
            await r.cleanup()


async def _launch_and_wait(a: SmgRouter, s: Served) -> None:
    a.launch(s.topo, RouterSettings(), ["prefill-0", "decode-0"], "/dev/null")
    async with aiohttp.ClientSession() as session:
        await a.wait_ready(session, s.topo, 5.0)


async def test_1_13_posts_spec_fields_with_the_queried_engine_id(served: Served) -> None:
    a = SmgRouter("smg", version="1.13.0", flags=FLAGS)
    await _launch_and_wait(a, served)
    p, d = served.topo.prefills[0], served.topo.decodes[0]
    assert served.posted == [
        {"url": p.url("http"), "worker_type": "prefill", "bootstrap_port": p.bootstrap_port,
         "kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "kv_engine_id": "eng-p-1"},
        {"url": d.url("http"), "worker_type": "decode", "kv_connector": "MooncakeConnector",
         "kv_role": "kv_consumer"},
    ]
    assert a.registrations == served.posted


async def test_1_10_posts_labels(served: Served) -> None:
    a = SmgRouter("smg", version="1.10.1", flags=FLAGS)
    await _launch_and_wait(a, served)
    labels = [b.get("labels") for b in served.posted]
    assert labels == [
        {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "kv_engine_id": "eng-p-1"},
        {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"},
    ]
    assert all("kv_connector" not in b for b in served.posted)


async def test_a_refused_registration_fails_the_launch(served: Served) -> None:
    served.status = 400
    a = SmgRouter("smg", version="1.13.0", flags=FLAGS)
    with pytest.raises(RouterAdapterError, match="refused worker prefill-0: HTTP 400"):
        await _launch_and_wait(a, served)


async def test_unreadable_query_registers_without_engine_id(served: Served) -> None:
    served.query_answers = False
    a = SmgRouter("smg", version="1.13.0", flags=FLAGS)
    await _launch_and_wait(a, served)
    assert "kv_engine_id" not in served.posted[0]
    assert served.posted[0]["kv_connector"] == "MooncakeConnector"


async def test_add_worker_carries_the_facts(served: Served) -> None:
    a = SmgRouter("smg", version="1.12.0", flags=FLAGS)
    async with aiohttp.ClientSession() as session:
        status, _ = await a.add_worker(session, served.topo, "prefill-0")
    assert status == 202
    assert served.posted[0]["kv_engine_id"] == "eng-p-1"


async def test_flags_variant_posts_nothing_at_launch(served: Served) -> None:
    a = SmgFlagsRouter("smg", version="1.13.0", flags=FLAGS)
    await _launch_and_wait(a, served)
    assert served.posted == []


async def _until(cond: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_operator_registers_a_restarted_prefill_again_with_its_new_engine_id(served: Served) -> None:
    a = SmgOperatorRouter("smg", version="1.13.0", flags=FLAGS)
    notes: list[Any] = []
    async with aiohttp.ClientSession() as session:
        a.launch(served.topo, RouterSettings(), ["prefill-0", "decode-0"], "/dev/null")
        await a.wait_ready(session, served.topo, 5.0)
        beside = a.companion(session, served.topo, notes.append)
        assert beside is not None and a.operator is not None
        assert a.operator.watched == {"prefill-0": "eng-p-1"}  # the decode has no id to keep current
        task = asyncio.create_task(beside)
        try:
            await asyncio.sleep(0.8)
            assert served.deleted == []  # same id: nothing to do
            served.engine_id, served.busy_after_delete = "eng-p-2", 2
            await _until(lambda: len(notes) == 2)
        finally:
            task.cancel()
    assert served.deleted == ["w1"]
    # Refused twice while smg still removed the old one, then accepted with the new id.
    assert [b.get("kv_engine_id") for b in served.posted] == [
        "eng-p-1", None, "eng-p-2", "eng-p-2", "eng-p-2"]
    saw, note = notes
    assert saw.message == "operator saw prefill-0's engine id change: registering it again"
    assert note.message == "operator registered prefill-0 again with its new engine id"
    assert note.fields["old_engine_id"] == "eng-p-1" and note.fields["new_engine_id"] == "eng-p-2"
    assert note.fields["ok"] is True and "DELETE: HTTP 202" in note.fields["detail"]
    assert a.registered_ids["prefill-0"] == "eng-p-2" and a.name == "smg-operator-1.13.0"


async def test_operator_leaves_a_removed_worker_out_and_has_nothing_to_do_without_minted_ids(
        served: Served) -> None:
    a = SmgOperatorRouter("smg", version="1.13.0", flags=FLAGS)
    async with aiohttp.ClientSession() as session:
        a.launch(served.topo, RouterSettings(), ["prefill-0", "decode-0"], "/dev/null")
        await a.wait_ready(session, served.topo, 5.0)
        beside = a.companion(session, served.topo, lambda _: None)
        assert beside is not None and a.operator is not None
        beside.close()
        status, _ = await a.remove_worker(session, served.topo, "prefill-0")
        assert status == 202 and a.operator.watched == {}
        assert await a.operator.step() == []
    nixl = allocate("1p1d", "nixl", "http")
    async with aiohttp.ClientSession() as session:
        assert a.companion(session, nixl, lambda _: None) is None  # NIXL: the prefill's answer carries it
        grpc = allocate("1p1d", "mooncake", "grpc")
        assert a.companion(session, grpc, lambda _: None) is None  # gRPC: smg reads the id itself
