"""Reading a router's events: a poll that fails says nothing of them (harness.routers.base.events)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from harness.routers.reference import ReferenceRouter
from harness.topology import allocate


async def _serve(status: int, body: object, port: int) -> web.AppRunner:
    async def events(_: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/events", events)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_a_poll_nobody_answers_reads_nothing_new_and_keeps_the_cursor() -> None:
    topo = allocate("1p1d", "mooncake", "http")  # nothing listens on its router port
    async with aiohttp.ClientSession() as session:
        assert await ReferenceRouter().events(session, topo, 7) == ([], 7)


async def test_a_router_without_events_or_with_a_foreign_body_has_none() -> None:
    topo = allocate("1p1d", "mooncake", "http")
    for status, body in ((404, {"error": "no such route"}), (200, {"items": []})):
        runner = await _serve(status, body, topo.router_port)
        try:
            async with aiohttp.ClientSession() as session:
                assert await ReferenceRouter().events(session, topo, 0) is None
        finally:
            await runner.cleanup()


async def test_events_are_read_from_the_cursor_on() -> None:
    topo = allocate("1p1d", "mooncake", "http")
    runner = await _serve(200, {"events": [{"type": "probe"}], "next": 3}, topo.router_port)
    try:
        async with aiohttp.ClientSession() as session:
            assert await ReferenceRouter().events(session, topo, 2) == ([{"type": "probe"}], 3)
    finally:
        await runner.cleanup()
