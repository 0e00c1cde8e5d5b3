"""The streamed (SSE) answer to a client, every write under a deadline.

Once the transport's buffer is full, a write waits for the client to read. A client that keeps its
connection open and stops reading would park the handler for good, and with it the release of the workers
its request holds (their load counts, a draining worker's removal). After `timeout_s` without progress on
one write the connection is dropped, as a client that went away would have dropped it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from aiohttp import web

# A write that makes no progress for this long: the client stopped reading (a token takes milliseconds).
CLIENT_WRITE_TIMEOUT_S = 60.0


class ClientStream:
    def __init__(self, request: web.Request, timeout_s: float = CLIENT_WRITE_TIMEOUT_S) -> None:
        self.request = request
        self.timeout_s = timeout_s
        self.response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )

    async def prepare(self) -> None:
        await self._bounded(self.response.prepare(self.request))

    async def write(self, data: bytes) -> None:
        await self._bounded(self.response.write(data))

    async def write_eof(self) -> web.StreamResponse:
        await self._bounded(self.response.write_eof())
        return self.response

    async def _bounded(self, step: Awaitable[object]) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await step
        except TimeoutError:
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            raise ConnectionResetError(
                f"the client read nothing for {self.timeout_s:g} s: its connection was dropped"
            ) from None
