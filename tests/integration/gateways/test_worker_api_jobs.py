"""Worker API actions against a router that answers 202 and runs the change later as a job (smg 1.13.0's
`PATCH /workers/{id}`: `{"status": "accepted", "message": "Worker update queued for background processing"}`):
the harness follows the job to its effect before it verifies, and a job that never ends is evidence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.routers.gateways.adapters import SmgRouter
from harness.scenario import AddWorker, PatchWorker, RemoveWorker
from harness.session.events import FaultVerified
from harness.topology import Topology, allocate
from harness.worlds.real.engine_actions import EngineActions, shows_update


class JobGateway:
    """A worker API whose every change lands `delay_s` after its 202 (None: never)."""

    def __init__(self, topo: Topology, delay_s: float | None) -> None:
        self.delay_s = delay_s
        p, d = topo.prefills[0], topo.decodes[0]
        self.workers = {
            "w-p": {"id": "w-p", "url": p.url(topo.transport), "worker_type": "prefill", "status": "ready",
                    "priority": 50},
            "w-d": {"id": "w-d", "url": d.url(topo.transport), "worker_type": "decode", "status": "ready"},
        }
        self.spare = {"id": "w-x", "url": "grpc://127.0.0.1:1", "worker_type": "decode", "status": "ready"}
        self._jobs: set[asyncio.Task[None]] = set()

    def later(self, change: Any) -> web.Response:
        async def run() -> None:
            assert self.delay_s is not None
            await asyncio.sleep(self.delay_s)
            change()

        if self.delay_s is not None:
            task = asyncio.create_task(run())
            self._jobs.add(task)
        return web.json_response({"status": "accepted", "message": "queued for background processing"},
                                 status=202)

    async def list(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": list(self.workers.values())})

    async def patch(self, request: web.Request) -> web.Response:
        body = await request.json()
        return self.later(lambda: self.workers[request.match_info["wid"]].update(body))

    async def post(self, request: web.Request) -> web.Response:
        body = await request.json()
        return self.later(lambda: self.workers.setdefault("w-x", {**self.spare, "url": body["url"]}))

    async def delete(self, request: web.Request) -> web.Response:
        return self.later(lambda: self.workers.pop(request.match_info["wid"]))


async def _actions(delay_s: float | None) -> AsyncIterator[tuple[EngineActions, list[Any]]]:
    topo = allocate("1p2d", "mooncake", "grpc")
    gw = JobGateway(topo, delay_s)
    app = web.Application()
    app.router.add_get("/workers", gw.list)
    app.router.add_patch("/workers/{wid}", gw.patch)
    app.router.add_post("/workers", gw.post)
    app.router.add_delete("/workers/{wid}", gw.delete)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", topo.router_port).start()

    class NoFleet:
        def __init__(self) -> None:
            self.topo = topo

    seen: list[Any] = []
    try:
        async with aiohttp.ClientSession() as session:
            actions = EngineActions(NoFleet(), SmgRouter("smg"), session, topo)  # type: ignore[arg-type]
            yield actions, seen
    finally:
        await runner.cleanup()


@pytest.fixture
async def quick() -> AsyncIterator[tuple[EngineActions, list[Any]]]:
    async for x in _actions(0.3):
        yield x


@pytest.fixture
async def never() -> AsyncIterator[tuple[EngineActions, list[Any]]]:
    async for x in _actions(None):
        yield x


def _verified(seen: list[Any]) -> FaultVerified:
    return next(ev for ev in seen if isinstance(ev, FaultVerified))


async def test_an_accepted_update_is_verified_once_its_job_took_effect(
    quick: tuple[EngineActions, list[Any]],
) -> None:
    actions, seen = quick
    await actions.apply("p", PatchWorker("prefill-0", {"priority": 3}), seen.append)
    v = _verified(seen)
    assert v.ok and v.evidence["status"] == 202 and v.evidence["job"] == "done"
    assert 0.25 <= v.evidence["job_s"] < 5.0 and v.evidence["after"]["priority"] == 3
    seen.clear()
    await actions.apply("r", RemoveWorker("decode-0"), seen.append)
    assert _verified(seen).ok and _verified(seen).evidence["job"] == "done"


async def test_a_job_that_never_ends_leaves_the_fault_unverified_saying_so(
    never: tuple[EngineActions, list[Any]],
) -> None:
    actions, seen = never
    await actions.apply("p", PatchWorker("prefill-0", {"priority": 3}), seen.append)
    v = _verified(seen)
    assert not v.ok and v.evidence["job"] == "not done within 5 s" and v.evidence["applied"] is False
    seen.clear()
    await actions.apply("a", AddWorker("decode-1"), seen.append)
    assert not _verified(seen).ok


def test_a_label_update_shows_once_the_labels_hold_it_among_the_engines_own() -> None:
    listed = {"priority": 7, "labels": {"model_type": "pdchaos_fake", "tier": "gold"}}
    assert shows_update(listed, {"labels": {"tier": "gold"}, "priority": 7})
    assert not shows_update(listed, {"labels": {"tier": "silver"}})
    assert not shows_update(listed, {"labels": {"tier": "gold"}, "priority": 3})
    assert not shows_update({"priority": 7}, {"labels": {"tier": "gold"}})
