"""KV side channel over loopback TCP: the prefill's listener and the decode's pull / handshake calls.

Framing and answers come from `fake_engines.core.wire`; this module only moves bytes and keeps deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from fake_engines.core.calls import CALLER_HEADER
from fake_engines.core.wire import (
    FrameDecoder,
    HandshakeRequest,
    HandshakeResponse,
    Message,
    PullRequest,
    PullResponse,
    WireError,
    decode_message,
)

log = logging.getLogger(__name__)

# The prefill's answer for one incoming message (may park on a wedge): (frame bytes to send).
Responder = Callable[[Message], Awaitable[bytes]]

_READ_CHUNK = 64 * 1024


async def _read_message(reader: asyncio.StreamReader, decoder: FrameDecoder) -> tuple[Message, bytes] | None:
    while True:
        data = await reader.read(_READ_CHUNK)
        if not data:
            return None
        frames = decoder.feed(data)
        if frames:
            return decode_message(frames[0]), frames[0].payload


class SideChannelServer:
    """A TCP listener answering pull and handshake frames; one per rank (Mooncake) or the NIXL port."""

    def __init__(self, host: str, port: int, respond: Responder) -> None:
        self.host = host
        self._want_port = port
        self._respond = respond
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._handle, self.host, self._want_port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        decoder = FrameDecoder()
        try:
            while True:
                got = await _read_message(reader, decoder)
                if got is None:
                    return
                msg, _ = got
                if not isinstance(msg, PullRequest | HandshakeRequest):
                    return
                writer.write(await self._respond(msg))
                await writer.drain()
        except (WireError, ConnectionError) as exc:
            log.debug("side channel connection dropped: %s", exc)
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)


async def _exchange(host: str, port: int, frame: bytes, timeout_s: float) -> tuple[Message, bytes]:
    """Connect, send one frame, read one answer, all within `timeout_s`."""

    async def go() -> tuple[Message, bytes]:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(frame)
            await writer.drain()
            got = await _read_message(reader, FrameDecoder())
            if got is None:
                raise ConnectionError("side channel closed before answering")
            return got
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    return await asyncio.wait_for(go(), timeout_s)


async def pull(host: str, port: int, engine_id: str, key: str, timeout_s: float) -> PullResponse:
    """One pull; raises TimeoutError, OSError/ConnectionError or WireError."""
    msg, _ = await _exchange(host, port, PullRequest(engine_id, key).encode(), timeout_s)
    if not isinstance(msg, PullResponse):
        raise WireError(f"expected pull_result, got {type(msg).__name__}")
    return msg


async def handshake(host: str, port: int, engine_id: str, timeout_s: float) -> HandshakeResponse:
    """NIXL handshake; raises TimeoutError, OSError/ConnectionError or WireError."""
    msg, _ = await _exchange(host, port, HandshakeRequest(engine_id).encode(), timeout_s)
    if not isinstance(msg, HandshakeResponse):
        raise WireError(f"expected handshake_result, got {type(msg).__name__}")
    return msg


async def query_bootstrap(url: str, timeout_s: float, caller: str) -> object:
    """GET the bootstrap `/query` url, saying who asks (`caller`, `core.calls.engine_caller`: the prefill
    records the lookup as this decode's, not the router's); the decoded JSON is validated by the caller
    (core.bootstrap)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {CALLER_HEADER: caller}
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url, headers=headers) as resp:
        resp.raise_for_status()
        return await resp.json(content_type=None)
