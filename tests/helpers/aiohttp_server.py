"""An aiohttp application served on loopback for the length of a test (a stub engine, router or gateway)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from pdchaos.ports import free_port


@contextlib.asynccontextmanager
async def serving(app: web.Application, port: int | None = None) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 (`port`, else a free one); yields its base URL; stopped on leaving."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = port if port is not None else free_port()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
