"""A streamed answer to a client that stops reading ends in a dropped connection, not a parked handler."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
from aiohttp import web

from reference_router.client_stream import ClientStream

CHUNK = b"data: " + b"x" * 65_536 + b"\n\n"


async def _serve(outcome: asyncio.Future[str], total: int | None) -> tuple[web.AppRunner, int]:
    async def handler(request: web.Request) -> web.StreamResponse:
        stream = ClientStream(request, timeout_s=0.5)
        await stream.prepare()
        sent = 0
        try:
            while total is None or sent < total:
                await stream.write(CHUNK)
                sent += len(CHUNK)
            resp = await stream.write_eof()
        except ConnectionResetError as e:
            outcome.set_result(f"reset after {sent} bytes: {e}")
            raise
        outcome.set_result(f"sent {sent}")
        return resp

    app = web.Application()
    app.router.add_get("/stream", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


async def test_a_client_that_stops_reading_is_dropped_within_the_write_timeout() -> None:
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    runner, port = await _serve(outcome, None)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        said = await asyncio.wait_for(outcome, 30)
    finally:
        client.close()
        await runner.cleanup()
    assert said.startswith("reset after") and "read nothing for 0.5 s" in said


async def test_a_client_that_reads_gets_the_whole_stream() -> None:
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    total = 40 * len(CHUNK)  # megabytes: past every buffer, so writes do wait on the reader
    runner, port = await _serve(outcome, total)
    try:
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
                    http.get(f"http://127.0.0.1:{port}/stream") as resp):
            got = 0
            async for chunk in resp.content.iter_chunked(8192):
                got += len(chunk)
                await asyncio.sleep(0.001)  # a slow reader still reads
        assert got == total
        assert await asyncio.wait_for(outcome, 5) == f"sent {total}"
    finally:
        await runner.cleanup()
