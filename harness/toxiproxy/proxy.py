"""One proxy's listener and its live links (asyncio shell around a ProxySpec)."""

from __future__ import annotations

import asyncio
import contextlib

from harness.toxiproxy.errors import ApiError
from harness.toxiproxy.link import Link
from harness.toxiproxy.registry import ProxySpec, format_addr, parse_listen, parse_upstream


class ProxyRuntime:
    def __init__(self, spec: ProxySpec, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self.links: set[Link] = set()
        self.connections = 0  # accepted so far; numbers each link for its toxicity draws
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> bool:
        return self._server is not None

    async def _bind(self, listen: str) -> asyncio.Server:
        host, port = parse_listen(listen)
        try:
            return await asyncio.start_server(self._accept, host, port)
        except OSError as exc:
            # The address is taken (or not ours to take): the caller's request conflicts with the machine's
            # state, not a server failure.
            raise ApiError(409, f"listen {listen}: {exc.strerror or exc}") from None

    def _listening(self, server: asyncio.Server) -> None:
        self._server = server
        bound = server.sockets[0].getsockname()
        self.spec.listen = format_addr(bound[0], bound[1])

    async def start(self) -> None:
        """Listen on spec.listen; a port of 0 becomes the bound port, which spec.listen then shows."""
        if self._server is None:
            self._listening(await self._bind(self.spec.listen))

    async def move(self, listen: str) -> None:
        """Listen on another address. The new one is bound first: if it cannot be (409), the proxy keeps
        its old listener and connections; else they go, as Toxiproxy restarts a proxy that moves."""
        server = await self._bind(listen)
        self.stop()
        self._listening(server)

    def stop(self) -> None:
        """Down: stop listening (new connections are refused) and drop every open connection."""
        if self._server is not None:
            # Not awaiting wait_closed(): from 3.12 it waits for client connections, which we drop below.
            self._server.close()
            self._server = None
        self.drop_links()

    def drop_links(self) -> None:
        for link in list(self.links):
            link.end("drop")

    def toxics_changed(self) -> None:
        for link in list(self.links):
            link.sync()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        link = Link(
            (self.seed, self.spec.name, number),
            reader,
            writer,
            parse_upstream(self.spec.upstream),
            lambda: self.spec.toxics,
        )
        self.links.add(link)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await link.run()
        finally:
            self.links.discard(link)
            if task is not None:
                self._tasks.discard(task)

    async def close(self, timeout_s: float = 2.0) -> None:
        """Stop and wait (bounded) for the link tasks to unwind."""
        self.stop()
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        if tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout_s)
