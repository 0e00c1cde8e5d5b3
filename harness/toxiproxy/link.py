"""One proxied TCP connection: two pumps moving bytes through their DirectionChains (asyncio shell).

Waiting on a peer's bytes has no deadline here on purpose: a proxy must carry idle connections as long
as their ends keep them. Every other wait (upstream connect) is bounded, and the owner can end a link
at any time (proxy disabled or deleted) without waiting on the data path.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Literal

from harness.toxiproxy.chain import DirectionChain
from harness.toxiproxy.toxics import DOWNSTREAM, UPSTREAM, ToxicSpec
from pdchaos.waiting import wait_set

READ_SIZE = 64 * 1024
HIGH_WATER = 256 * 1024
CONNECT_TIMEOUT_S = 5.0

EndKind = Literal["close", "reset", "drop"]


def _set_linger_zero(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Pump:
    """Bytes from `reader` through `chain` to `writer`, one direction."""

    def __init__(
        self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, chain: DirectionChain
    ) -> None:
        self.link = link
        self.reader = reader
        self.writer = writer
        self.chain = chain
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.eof_sent = False
        self._drain: asyncio.Task[None] | None = None

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.chain.eof_fed:
                while self.chain.queued_bytes >= HIGH_WATER:  # backpressure: stop reading the sender
                    self.room.clear()
                    await self.room.wait()
                data = await self.reader.read(READ_SIZE)
                if not data:
                    # EOF ends reading whether or not the chain still takes it: a chain that already handed
                    # out a close or reset ignores the EOF, and reading on would spin on b"" for good.
                    self.chain.feed_eof(loop.time())
                    self.wake.set()
                    return
                self.chain.feed(data, loop.time())
                self.wake.set()
        except ConnectionResetError:
            self.link.end("reset")
        except OSError:
            self.link.end("close")

    async def write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        transport = self.writer.transport
        while True:
            self.wake.clear()
            writable = transport.get_write_buffer_size() < HIGH_WATER
            for out in self.chain.poll(loop.time(), data_ok=writable):
                if out.kind == "data" and transport.is_closing():
                    self.link.end("close")  # the receiving end is gone: nothing more can arrive
                    return
                if out.kind == "data":
                    transport.write(out.data)
                elif out.kind == "eof":
                    self._send_eof()
                else:
                    self.link.end(out.kind)
                    return
            if self.chain.queued_bytes < HIGH_WATER:
                self.room.set()
            if transport.get_write_buffer_size() >= HIGH_WATER and self._drain is None:
                self._drain = asyncio.create_task(self._wait_drained())
            if self.eof_sent:
                return
            deadline = self.chain.next_deadline(data_ok=transport.get_write_buffer_size() < HIGH_WATER)
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            await wait_set(self.wake, timeout)

    def _send_eof(self) -> None:
        self.eof_sent = True
        if self.writer.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                self.writer.write_eof()
        self.link.direction_finished()

    async def _wait_drained(self) -> None:
        try:
            await self.writer.drain()
        except (OSError, RuntimeError):
            self.link.end("close")
        finally:
            self._drain = None
            self.wake.set()

    def cancel(self) -> None:
        if self._drain is not None:
            self._drain.cancel()


class Link:
    def __init__(
        self,
        key: tuple[object, ...],
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream: tuple[str, int],
        toxics: Callable[[], Sequence[ToxicSpec]],
    ) -> None:
        """key seeds this connection's toxicity draws; toxics() returns the proxy's toxics right now."""
        self.key = key
        self.client_reader = client_reader
        self.client_writer = client_writer
        self.upstream = upstream
        self.toxics = toxics
        self.chains = {UPSTREAM: DirectionChain(*key, UPSTREAM), DOWNSTREAM: DirectionChain(*key, DOWNSTREAM)}
        self.pumps: list[_Pump] = []
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.ended: EndKind | None = None
        self._done = asyncio.Event()
        self._finished_directions = 0
        self.sync()

    def sync(self) -> None:
        """Apply the proxy's current toxics to this live connection now."""
        now = asyncio.get_running_loop().time()
        toxics = self.toxics()
        for stream, chain in self.chains.items():
            chain.sync([t for t in toxics if t.stream == stream], now)
        for pump in self.pumps:
            pump.wake.set()

    async def run(self) -> None:
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                self.end("close")
                return
            self.upstream_writer = up_writer
            if self.ended is not None:  # ended while connecting
                self._close_writers(self.ended)
                return
            self.pumps = [
                _Pump(self, self.client_reader, up_writer, self.chains[UPSTREAM]),
                _Pump(self, up_reader, self.client_writer, self.chains[DOWNSTREAM]),
            ]
            tasks = [asyncio.create_task(fn()) for p in self.pumps for fn in (p.read_loop, p.write_loop)]
            try:
                await self._done.wait()
            finally:
                for task in tasks:
                    task.cancel()
                for pump in self.pumps:
                    pump.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._close_writers(self.ended or "drop")

    def direction_finished(self) -> None:
        self._finished_directions += 1
        if self._finished_directions == 2:
            self.end("close")

    def end(self, kind: EndKind) -> None:
        """End the connection: close (FIN after flushing), reset (RST both ends) or drop (abort now)."""
        if self.ended is None:
            self.ended = kind
            self._close_writers(kind)
        self._done.set()

    def _close_writers(self, kind: EndKind) -> None:
        for writer in (self.client_writer, self.upstream_writer):
            if writer is None or (writer.transport.is_closing() and kind == "close"):
                continue
            if kind == "reset":
                _set_linger_zero(writer)
                writer.transport.abort()
            elif kind == "drop":
                writer.transport.abort()
            else:
                writer.close()
