"""Loopback TCP peers for exercising proxies: an echo and a byte-counting sink, each on a free port.

Shared by the Toxiproxy tests and bench/proxy_throughput.py; threaded so synchronous clients can use them.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from harness.toxiproxy.server import EmbeddedToxiproxy, configure_client


def echo_handler(timeout_s: float, *, nodelay: bool = False) -> type[socketserver.BaseRequestHandler]:
    """A handler that sends back every byte it reads until the peer closes."""

    class _Echo(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(timeout_s)
            # A peer reset by a toxic is an expected outcome, not a server fault.
            with suppress(OSError):
                if nodelay:
                    self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while data := self.request.recv(65536):
                    self.request.sendall(data)

    return _Echo


def sink_handler(timeout_s: float) -> type[socketserver.BaseRequestHandler]:
    """A handler that reads to end of stream, then answers how many bytes it got."""

    class _Sink(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(timeout_s)
            total = 0
            while data := self.request.recv(1 << 20):
                total += len(data)
            self.request.sendall(str(total).encode())

    return _Sink


@contextmanager
def serve_tcp(handler: type[socketserver.BaseRequestHandler], join_timeout_s: float = 5.0) -> Iterator[int]:
    """Serve `handler` on 127.0.0.1 in a thread; yields the port and shuts down on exit."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(join_timeout_s)


@contextmanager
def embedded_toxiproxy(seed: int = 0) -> Iterator[EmbeddedToxiproxy]:
    """An embedded Toxiproxy in a thread, with the toxiproxy-python client pointed at it."""
    server = EmbeddedToxiproxy(seed=seed)
    configure_client(server.start_in_thread())
    try:
        yield server
    finally:
        server.stop()
