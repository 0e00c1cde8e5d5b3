"""Each toxic's effect, measured over loopback through the embedded server, driven by toxiproxy-python."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import time
from collections.abc import Iterator

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.proxy import Proxy

from harness.toxiproxy import EmbeddedToxiproxy
from harness.toxiproxy.testing import echo_handler, embedded_toxiproxy, serve_tcp

IO_TIMEOUT_S = 3.0


@pytest.fixture
def echo_port() -> Iterator[int]:
    with serve_tcp(echo_handler(IO_TIMEOUT_S * 2), IO_TIMEOUT_S) as port:
        yield port


@pytest.fixture
def embedded() -> Iterator[EmbeddedToxiproxy]:
    with embedded_toxiproxy() as server:
        yield server


@pytest.fixture
def proxy(embedded: EmbeddedToxiproxy, echo_port: int) -> Proxy:
    return Toxiproxy().create(upstream=f"127.0.0.1:{echo_port}", name="echo")


def connect(proxy: Proxy) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def recv_to_eof(sock: socket.socket) -> bytes:
    buf = b""
    while chunk := sock.recv(65536):
        buf += chunk
    return buf


def round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def best_rtt(proxy: Proxy, n: int = 5) -> float:
    # The fastest of a few: a busy machine only ever adds delay, so the minimum is the cleanest sample.
    with connect(proxy) as sock:
        return min(round_trip(sock) for _ in range(n))


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_latency_adds_its_delay_within_10_percent(proxy: Proxy, stream: str) -> None:
    base = best_rtt(proxy)
    proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 150})
    added = best_rtt(proxy) - base
    assert 0.135 <= added <= 0.165, added


def test_toxics_change_an_open_connection_at_once(proxy: Proxy, embedded: EmbeddedToxiproxy) -> None:
    with connect(proxy) as sock:
        assert round_trip(sock) < 0.1
        proxy.add_toxic(type="latency", name="lag", stream="upstream", attributes={"latency": 150})
        assert 0.135 <= min(round_trip(sock), round_trip(sock)) <= 0.2
        # Toxiproxy's update: POST (or PATCH) the toxic with the attributes that change.
        reply = requests.patch(
            f"{embedded.url}/proxies/echo/toxics/lag", json={"attributes": {"latency": 250}}, timeout=5
        )
        assert reply.status_code == 200 and reply.json()["attributes"]["latency"] == 250
        assert 0.225 <= min(round_trip(sock), round_trip(sock)) <= 0.3
        proxy.destroy_toxic("lag")
        assert round_trip(sock) < 0.1


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_bandwidth_within_10_percent(proxy: Proxy, stream: str) -> None:
    proxy.add_toxic(type="bandwidth", stream=stream, attributes={"rate": 100})  # KB/s
    payload = bytes(range(256)) * 196  # 50,176 bytes: about 0.5 s at 100 KB/s

    def transfer_s() -> float:
        with connect(proxy) as sock:
            start = time.monotonic()
            sock.sendall(payload)
            assert recv_exactly(sock, len(payload)) == payload
            return time.monotonic() - start

    # The faster of two: shaping can never beat the rate, a busy machine can only slow a run down.
    rate_kb_s = len(payload) / min(transfer_s(), transfer_s()) / 1000
    assert 90 <= rate_kb_s <= 110, rate_kb_s


def test_timeout_zero_holds_the_connection_silently(proxy: Proxy) -> None:
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    with connect(proxy) as sock:
        sock.sendall(b"swallowed")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)  # neither data nor a close: the connection just hangs
        sock.settimeout(IO_TIMEOUT_S)
        proxy.destroy_toxic("timeout_downstream")
        round_trip(sock, b"alive")  # it was held open all along: the echo comes back


def test_timeout_closes_after_its_timeout(proxy: Proxy) -> None:
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 200})
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"never arrives")
        assert recv_to_eof(sock) == b""
        elapsed = time.monotonic() - start
    assert 0.17 <= elapsed <= 0.3, elapsed


def test_reset_peer_resets_the_connection(proxy: Proxy) -> None:
    proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 100})
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"x")
        with pytest.raises(ConnectionResetError):
            recv_to_eof(sock)
        elapsed = time.monotonic() - start
    assert 0.09 <= elapsed <= 0.25, elapsed


def test_limit_data_closes_after_n_bytes(proxy: Proxy) -> None:
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    payload = bytes(range(250)) * 20
    with connect(proxy) as sock:
        sock.sendall(payload)
        received = recv_to_eof(sock)
    assert received == payload[:1000]


def test_down_refuses_connections_and_drops_open_ones(proxy: Proxy) -> None:
    host, port = proxy.listen.rsplit(":", 1)
    with connect(proxy) as open_sock:
        round_trip(open_sock)
        with proxy.down():
            assert Toxiproxy().get_proxy("echo").enabled is False
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S)
            with contextlib.suppress(ConnectionResetError):  # dropped: a FIN or a reset, never data
                assert open_sock.recv(10) == b""
        assert Toxiproxy().get_proxy("echo").listen == proxy.listen  # back on the same port
    with connect(proxy) as sock:
        round_trip(sock)


def test_slicer_splits_data_into_small_delayed_pieces(proxy: Proxy) -> None:
    proxy.add_toxic(
        type="slicer", attributes={"average_size": 100, "size_variation": 20, "delay": 10_000}
    )  # delay in microseconds, as in Toxiproxy
    payload = bytes(range(200)) * 5
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        reads: list[bytes] = []
        while sum(map(len, reads)) < len(payload):
            reads.append(sock.recv(4096))
            assert reads[-1]
        elapsed = time.monotonic() - start
    assert b"".join(reads) == payload
    assert len(reads) >= 4, [len(r) for r in reads]
    assert statistics.median(len(r) for r in reads) <= 120
    assert elapsed >= 0.07  # about nine 10 ms gaps between ten pieces


def test_slow_close_delays_the_close(proxy: Proxy) -> None:
    def close_delay() -> float:
        with connect(proxy) as sock:
            sock.sendall(b"bye")
            assert recv_exactly(sock, 3) == b"bye"
            start = time.monotonic()
            sock.shutdown(socket.SHUT_WR)  # the echo server then closes its side
            assert recv_to_eof(sock) == b""
            return time.monotonic() - start

    assert close_delay() < 0.15
    proxy.add_toxic(type="slow_close", attributes={"delay": 200})
    assert 0.18 <= close_delay() <= 0.3


def test_upstream_down_closes_the_client(embedded: EmbeddedToxiproxy) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        dead_port = holder.getsockname()[1]  # bound, never listening: connections are refused
        proxy = Toxiproxy().create(upstream=f"127.0.0.1:{dead_port}", name="dead")
        with connect(proxy) as sock:
            assert recv_to_eof(sock) == b""


def _latency_pattern(seed: int, echo_port: int, connections: int = 10) -> list[bool]:
    with embedded_toxiproxy(seed):
        proxy = Toxiproxy().create(upstream=f"127.0.0.1:{echo_port}", name="flaky")
        proxy.add_toxic(type="latency", toxicity=0.5, attributes={"latency": 100})
        pattern = []
        for _ in range(connections):
            with connect(proxy) as sock:
                # 100 ms of latency or none: the faster of two round trips tells them apart on a busy box.
                pattern.append(min(round_trip(sock), round_trip(sock)) > 0.07)
        return pattern


def test_toxicity_draws_replay_with_the_seed(echo_port: int) -> None:
    first = _latency_pattern(7, echo_port)
    assert 0 < sum(first) < len(first)  # some connections got the toxic, some did not
    assert _latency_pattern(7, echo_port) == first
    assert _latency_pattern(8, echo_port) != first


def test_latency_jitter_spreads_within_its_bounds(proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", attributes={"latency": 100, "jitter": 50})
    with connect(proxy) as sock:
        samples = [round_trip(sock) for _ in range(8)]
    assert min(samples) >= 0.05  # jitter never takes more than its amount off
    assert statistics.median(samples) <= 0.17
    assert max(samples) - min(samples) >= 0.02  # seeded, but not constant


async def test_backpressure_bounds_what_the_proxy_holds() -> None:
    """A slow toxic pushes back on the sender instead of buffering everything it sends."""
    from harness.toxiproxy.link import HIGH_WATER, READ_SIZE

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    try:
        async with EmbeddedToxiproxy() as tp:
            spec = await tp.service.create(
                {"name": "s", "upstream": f"127.0.0.1:{server.sockets[0].getsockname()[1]}"}
            )
            tp.service.add_toxic("s", {"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 50}})
            host, port = spec.listen.rsplit(":", 1)
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"\0" * 32_000_000)  # more than the kernel buffers of both sockets hold
            await asyncio.sleep(0.4)
            links = list(tp.service.runtimes["s"].links)
            assert len(links) == 1
            assert 0 < links[0].chains["upstream"].queued_bytes <= HIGH_WATER + READ_SIZE
            assert writer.transport.get_write_buffer_size() > 16_000_000  # the rest waits at the sender
            writer.transport.abort()
    finally:
        server.close()
        await server.wait_closed()
