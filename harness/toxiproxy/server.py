"""EmbeddedToxiproxy: the Toxiproxy-compatible server, in a running loop or on its own thread."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from urllib.parse import urlsplit

from aiohttp import web

from harness.toxiproxy.api import build_app
from harness.toxiproxy.registry import LOOPBACK, is_loopback
from harness.toxiproxy.service import ToxiproxyService

DEFAULT_PORT = 8474


def toxiproxy_url() -> str | None:
    """TOXIPROXY_URL when set (a real Toxiproxy to use instead of the embedded one), else None."""
    return os.environ.get("TOXIPROXY_URL") or None


@contextmanager
def toxiproxy_server(seed: int = 0) -> Iterator[str]:
    """The Toxiproxy to use, as a URL: TOXIPROXY_URL's real one when set, else an embedded one on a thread.

    The toxiproxy-python client is pointed at it too. The embedded one stops when the block ends.
    """
    external = toxiproxy_url()
    if external is not None:
        configure_client(external)
        yield external
        return
    server = EmbeddedToxiproxy(seed=seed)
    url = server.start_in_thread()
    try:
        configure_client(url)
        yield url
    finally:
        server.stop()


def configure_client(url: str) -> None:
    """Point the toxiproxy-python client at url. Its host/port are class-wide: one server per process."""
    from toxiproxy.api import APIConsumer

    parts = urlsplit(url if "://" in url else f"http://{url}")
    APIConsumer.host = parts.hostname or LOOPBACK
    APIConsumer.port = parts.port or DEFAULT_PORT


class EmbeddedToxiproxy:
    """A Toxiproxy-compatible HTTP API plus proxies, bound to loopback.

    In a running loop: `async with EmbeddedToxiproxy() as tp: ... tp.url`.
    For synchronous callers (the toxiproxy-python client is requests-based): `url = tp.start_in_thread()`
    then `tp.stop()`, or `with EmbeddedToxiproxy() as tp:`.
    """

    def __init__(self, host: str = LOOPBACK, port: int = 0, seed: int = 0) -> None:
        # The API binds a loopback address only (127.0.0.1, or a fake cluster pod's 127.X.Y.Z), like the
        # router and the engines: another address is refused, not quietly replaced (a user asking for
        # 0.0.0.0 must learn the server is not reachable from afar).
        if host == "localhost" or not is_loopback(host) or ":" in host:
            raise ValueError(f"the embedded Toxiproxy binds a loopback IPv4 address only, not {host!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port {port} out of range")
        self.host = host
        self.port = port
        self.seed = seed
        self.service = ToxiproxyService(seed)
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- in a running loop ---------------------------------------------------------------------
    async def start(self) -> str:
        # A bounded shutdown: an API call in flight gets 2 s to finish when the server stops.
        runner = web.AppRunner(
            build_app(self.service), access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.url

    async def close(self) -> None:
        await self.service.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> EmbeddedToxiproxy:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- on a background thread ----------------------------------------------------------------
    def start_in_thread(self, timeout_s: float = 10.0) -> str:
        """Serve from a daemon thread with its own loop; returns the API URL once it accepts requests."""
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready, failure), name="pdchaos-toxiproxy", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError("embedded toxiproxy did not start in time")
        if failure:
            self._thread.join(timeout_s)
            self._thread = None
            raise failure[0]
        return self.url

    def _thread_main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve_until_stopped(ready, failure))
        finally:
            loop.close()

    async def _serve_until_stopped(self, ready: threading.Event, failure: list[BaseException]) -> None:
        self._stop_requested = asyncio.Event()
        try:
            await self.start()
        except BaseException as exc:
            failure.append(exc)
            ready.set()
            return
        ready.set()
        try:
            await self._stop_requested.wait()
        finally:
            await self.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the background thread's server (drops every proxied connection) and join it."""
        thread, loop, stop = self._thread, self._loop, self._stop_requested
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError("embedded toxiproxy thread did not stop in time")
        self._thread = None

    def __enter__(self) -> EmbeddedToxiproxy:
        self.start_in_thread()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
