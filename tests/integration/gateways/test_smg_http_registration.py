"""The smg adapter's HTTP registration against a small server shaped like smg's worker API and a Mooncake
bootstrap server: once smg is live, each worker is posted with its KV transfer facts (the engine id read
from `/query`), spelled per release; a refusal or an unreadable `/query` is said, not hidden."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.routers import RouterAdapterError
from harness.routers.gateways.adapters import SmgFlagsRouter, SmgRouter
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
        s.posted.append(await r.json())
        return web.json_response({"status": "accepted"}, status=s.status)

    async def query(r: web.Request) -> web.Response:
        if not s.query_answers:
            return web.Response(status=503)
        return web.json_response({"0": {"engine_id": "eng-p-1", "worker_addr": {"0": {"0": "tcp://h:1"}}}})

    gw = web.Application()
    gw.router.add_get("/liveness", liveness)
    gw.router.add_post("/workers", post_worker)
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
