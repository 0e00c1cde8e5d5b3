"""The embedded Toxiproxy's control API: the toxiproxy-python client unchanged, raw HTTP shapes, CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from harness.toxiproxy import (
    DEFAULT_PORT,
    EmbeddedToxiproxy,
    configure_client,
    toxiproxy_server,
    toxiproxy_url,
)
from harness.toxiproxy.testing import echo_handler, embedded_toxiproxy, serve_tcp
from pdchaos.ports import free_port, free_ports

TIMEOUT_S = 5.0


@pytest.fixture
def echo_port() -> Iterator[int]:
    with serve_tcp(echo_handler(TIMEOUT_S), TIMEOUT_S) as port:
        yield port


@pytest.fixture
def embedded() -> Iterator[EmbeddedToxiproxy]:
    with embedded_toxiproxy() as server:
        yield server


def echoes(listen: str) -> bool:
    host, port = listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"hello")
        return sock.recv(5) == b"hello"


def refused(listen: str) -> bool:
    host, port = listen.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=TIMEOUT_S).close()
    except ConnectionRefusedError:
        return True
    return False


# --- the toxiproxy-python client, unchanged ------------------------------------------------------


def test_client_proxy_lifecycle(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    client = Toxiproxy()
    assert client.running() is True
    assert json.loads(client.version())["version"].startswith("2.")
    upstream = f"127.0.0.1:{echo_port}"
    proxy = client.create(upstream=upstream, name="echo")
    assert proxy.name == "echo" and proxy.upstream == upstream and proxy.enabled is True
    assert proxy.listen.startswith("127.0.0.1:") and not proxy.listen.endswith(":0")
    assert echoes(proxy.listen)
    assert list(client.proxies()) == ["echo"]
    assert client.get_proxy("echo").listen == proxy.listen
    assert client.get_proxy("missing") is None
    with pytest.raises(ProxyExists):
        client.create(upstream=upstream, name="echo")
    fixed = free_port()
    other = client.create(upstream=upstream, name="fixed", listen=f"127.0.0.1:{fixed}", enabled=False)
    assert other.listen == f"127.0.0.1:{fixed}" and other.enabled is False
    assert refused(other.listen)
    other.enable()
    assert client.get_proxy("fixed").enabled is True and echoes(other.listen)
    other.disable()
    assert refused(other.listen)
    assert client.destroy(proxy) is True
    assert client.destroy("not a proxy") is False
    with pytest.raises(NotFound):
        proxy.destroy()
    assert refused(proxy.listen)
    client.destroy_all()
    assert client.proxies() == {}


def test_client_toxics(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    proxy = Toxiproxy().create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 10, "jitter": 2})
    proxy.add_toxic(type="bandwidth", name="thin", stream="upstream", toxicity=0.5, attributes={"rate": 9})
    toxics = proxy.toxics()
    assert list(toxics) == ["thin", "latency_downstream"]  # upstream chain first, as Toxiproxy lists
    latency = proxy.get_toxic("latency_downstream")
    assert (latency.type, latency.stream, latency.toxicity) == ("latency", "downstream", 1.0)
    assert latency.attributes == {"latency": 10, "jitter": 2}
    thin = toxics["thin"]
    assert (thin.stream, thin.toxicity, thin.attributes) == ("upstream", 0.5, {"rate": 9})
    assert proxy.get_toxic("nope") is None
    with pytest.raises(ProxyExists):
        proxy.add_toxic(type="latency")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="teleport")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", name="neg", attributes={"latency": -1})
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", name="side", stream="sideways")
    assert proxy.destroy_toxic("thin") is True
    with pytest.raises(NotFound):
        proxy.destroy_toxic("thin")
    assert list(proxy.toxics()) == ["latency_downstream"]
    proxy.destroy()
    with pytest.raises(NotFound):
        proxy.toxics()


def test_client_down_context_and_reset(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    client = Toxiproxy()
    proxy = client.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    with proxy.down():
        assert refused(proxy.listen)
        assert client.get_proxy("echo").enabled is False
    assert echoes(proxy.listen)
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    proxy.disable()
    assert client.reset() is True
    assert client.get_proxy("echo").enabled is True
    assert proxy.toxics() == {}
    assert echoes(proxy.listen)


def test_client_populate(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    client = Toxiproxy()
    port_a, port_b, port_c = free_ports(3)
    upstream = f"127.0.0.1:{echo_port}"
    wanted = [
        {"name": "a", "upstream": upstream, "listen": f"127.0.0.1:{port_a}"},
        {"name": "b", "upstream": upstream, "listen": f"127.0.0.1:{port_b}"},
    ]
    created = client.populate(wanted)
    assert sorted(p.name for p in created) == ["a", "b"]
    assert echoes(f"127.0.0.1:{port_a}") and echoes(f"127.0.0.1:{port_b}")
    client.get_proxy("a").add_toxic(type="latency")
    assert client.populate(wanted) == []  # unchanged: kept as they are
    assert list(client.get_proxy("a").toxics()) == ["latency_downstream"]
    moved = [{"name": "a", "upstream": upstream, "listen": f"127.0.0.1:{port_c}"}]
    assert [p.listen for p in client.populate(moved)] == [f"127.0.0.1:{port_c}"]
    assert refused(f"127.0.0.1:{port_a}") and echoes(f"127.0.0.1:{port_c}")
    assert client.get_proxy("a").toxics() == {}


def test_client_errors_from_server_status_codes(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    body = {"name": "dup", "upstream": f"127.0.0.1:{echo_port}"}
    APIConsumer.post("/proxies", json=body)
    with pytest.raises(ProxyExists):
        APIConsumer.post("/proxies", json=body)
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/none")
    with pytest.raises(InvalidToxic):  # the client names every 400 so
        APIConsumer.post("/proxies", json={"name": "x", "upstream": "10.0.0.1:80"})


# --- raw HTTP: the shapes and status codes Toxiproxy answers --------------------------------------


def test_http_proxy_shapes_and_codes(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    url = embedded.url
    upstream = f"127.0.0.1:{echo_port}"
    reply = requests.post(f"{url}/proxies", json={"name": "p", "upstream": upstream}, timeout=TIMEOUT_S)
    assert reply.status_code == 201
    proxy = reply.json()
    assert set(proxy) == {"name", "listen", "upstream", "enabled", "toxics"}
    assert proxy["toxics"] == [] and proxy["enabled"] is True
    listing = requests.get(f"{url}/proxies", timeout=TIMEOUT_S).json()
    assert listing == {"p": proxy}
    assert requests.get(f"{url}/proxies/p", timeout=TIMEOUT_S).json() == proxy
    reply = requests.post(f"{url}/proxies", json={"name": "p", "upstream": upstream}, timeout=TIMEOUT_S)
    assert (reply.status_code, reply.json()) == (409, {"error": "proxy already exists", "status": 409})
    reply = requests.get(f"{url}/proxies/zz", timeout=TIMEOUT_S)
    assert (reply.status_code, reply.json()) == (404, {"error": "proxy not found", "status": 404})
    reply = requests.post(f"{url}/proxies", json={"name": "q"}, timeout=TIMEOUT_S)
    assert reply.json() == {"error": "missing required field: upstream", "status": 400}
    reply = requests.post(f"{url}/proxies", data=b"{not json", timeout=TIMEOUT_S)
    assert reply.status_code == 400 and reply.json()["error"].startswith("bad request body")
    reply = requests.post(f"{url}/proxies", json={"name": "far", "upstream": "8.8.8.8:53"}, timeout=TIMEOUT_S)
    assert reply.status_code == 400 and "loopback" in reply.json()["error"]
    reply = requests.post(
        f"{url}/proxies",
        json={"name": "wide", "upstream": upstream, "listen": "10.0.0.1:0"},
        timeout=TIMEOUT_S,
    )
    assert reply.status_code == 400

    # Update: PATCH or POST, partial bodies; a new listen address moves the proxy.
    new_port = free_port()
    reply = requests.patch(f"{url}/proxies/p", json={"listen": f"127.0.0.1:{new_port}"}, timeout=TIMEOUT_S)
    assert reply.status_code == 200 and reply.json()["listen"] == f"127.0.0.1:{new_port}"
    assert refused(proxy["listen"]) and echoes(f"127.0.0.1:{new_port}")
    reply = requests.post(f"{url}/proxies/p", json={"enabled": False}, timeout=TIMEOUT_S)
    assert reply.json()["enabled"] is False and refused(f"127.0.0.1:{new_port}")
    assert requests.post(f"{url}/proxies/p", data=b"", timeout=TIMEOUT_S).status_code == 400
    assert requests.patch(f"{url}/proxies/zz", json={}, timeout=TIMEOUT_S).status_code == 404

    assert requests.post(f"{url}/reset", timeout=TIMEOUT_S).status_code == 204
    assert echoes(f"127.0.0.1:{new_port}")
    reply = requests.delete(f"{url}/proxies/p", timeout=TIMEOUT_S)
    assert (reply.status_code, reply.content) == (204, b"")
    assert requests.delete(f"{url}/proxies/p", timeout=TIMEOUT_S).status_code == 404


def test_http_toxic_shapes_and_codes(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    url = embedded.url
    requests.post(
        f"{url}/proxies", json={"name": "p", "upstream": f"127.0.0.1:{echo_port}"}, timeout=TIMEOUT_S
    )
    toxics = f"{url}/proxies/p/toxics"
    reply = requests.post(
        toxics, json={"type": "slicer", "attributes": {"average_size": 50}}, timeout=TIMEOUT_S
    )
    # 200 like Toxiproxy (its Go client requires it), with every attribute of the type shown.
    assert reply.status_code == 200
    assert reply.json() == {
        "name": "slicer_downstream",
        "type": "slicer",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"average_size": 50, "size_variation": 0, "delay": 0},
    }
    assert requests.get(toxics, timeout=TIMEOUT_S).json() == [reply.json()]
    assert requests.get(f"{toxics}/slicer_downstream", timeout=TIMEOUT_S).json() == reply.json()
    reply = requests.post(
        f"{toxics}/slicer_downstream",
        json={"toxicity": 0.5, "attributes": {"delay": 7}},
        timeout=TIMEOUT_S,
    )
    assert reply.status_code == 200
    assert reply.json()["toxicity"] == 0.5
    assert reply.json()["attributes"] == {"average_size": 50, "size_variation": 0, "delay": 7}
    reply = requests.patch(
        f"{toxics}/slicer_downstream", json={"attributes": {"size_variation": 60}}, timeout=TIMEOUT_S
    )
    assert reply.status_code == 400  # must stay below average_size
    assert requests.get(f"{url}/proxies/p", timeout=TIMEOUT_S).json()["toxics"][0]["attributes"]["delay"] == 7
    reply = requests.post(
        toxics, json={"type": "slicer", "attributes": {"average_size": 5}}, timeout=TIMEOUT_S
    )
    assert (reply.status_code, reply.json()) == (409, {"error": "toxic already exists", "status": 409})
    reply = requests.post(toxics, json={"type": "bogus"}, timeout=TIMEOUT_S)
    assert (reply.status_code, reply.json()) == (400, {"error": "invalid toxic type", "status": 400})
    assert requests.get(f"{toxics}/none", timeout=TIMEOUT_S).json() == {
        "error": "toxic not found",
        "status": 404,
    }
    assert requests.patch(f"{toxics}/none", json={}, timeout=TIMEOUT_S).status_code == 404
    assert (
        requests.post(f"{url}/proxies/zz/toxics", json={"type": "latency"}, timeout=TIMEOUT_S).status_code
        == 404
    )
    reply = requests.delete(f"{toxics}/slicer_downstream", timeout=TIMEOUT_S)
    assert (reply.status_code, reply.content) == (204, b"")
    assert requests.get(toxics, timeout=TIMEOUT_S).json() == []


def test_http_populate_and_misc(embedded: EmbeddedToxiproxy, echo_port: int) -> None:
    url = embedded.url
    upstream = f"127.0.0.1:{echo_port}"
    reply = requests.post(
        f"{url}/populate", json=[{"name": "a", "upstream": upstream}, {"name": "b"}], timeout=TIMEOUT_S
    )
    assert reply.status_code == 400
    assert reply.json() == {
        "error": "missing required field: upstream at proxy 2",
        "status": 400,
        "proxies": [],
    }
    assert requests.get(f"{url}/proxies", timeout=TIMEOUT_S).json() == {}  # nothing half-applied
    reply = requests.post(
        f"{url}/populate",
        json=[{"name": "a", "upstream": upstream}, {"name": "b", "upstream": upstream, "enabled": False}],
        timeout=TIMEOUT_S,
    )
    assert reply.status_code == 201
    assert [(p["name"], p["enabled"]) for p in reply.json()["proxies"]] == [("a", True), ("b", False)]
    assert requests.post(f"{url}/populate", json={"a": 1}, timeout=TIMEOUT_S).status_code == 400

    version = requests.get(f"{url}/version", timeout=TIMEOUT_S)
    assert version.status_code == 200 and version.headers["Content-Type"].startswith("application/json")
    assert set(version.json()) == {"version"}
    reply = requests.get(f"{url}/nowhere", timeout=TIMEOUT_S)
    assert reply.status_code == 404 and reply.json()["status"] == 404
    reply = requests.put(f"{url}/proxies", json={}, timeout=TIMEOUT_S)
    assert reply.status_code == 405 and reply.json()["status"] == 405


# --- asyncio use, and the API never waiting on the data path --------------------------------------


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def test_async_with_in_a_running_loop() -> None:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = echo.sockets[0].getsockname()[1]
    try:
        async with (
            EmbeddedToxiproxy() as tp,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http,
        ):
            async with http.post(
                f"{tp.url}/proxies", json={"name": "e", "upstream": f"127.0.0.1:{port}"}
            ) as r:
                assert r.status == 201
                host, listen_port = (await r.json())["listen"].rsplit(":", 1)
            async with http.post(
                f"{tp.url}/proxies/e/toxics", json={"type": "latency", "attributes": {"latency": 120}}
            ) as r:
                assert r.status == 200
            reader, writer = await asyncio.open_connection(host, int(listen_port))
            start = time.monotonic()
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT_S) == b"ping"
            assert 0.108 <= time.monotonic() - start <= 0.2

            # A wedged connection (timeout 0) and a saturated one must not slow the control API.
            async with http.post(
                f"{tp.url}/proxies/e/toxics", json={"type": "timeout", "stream": "upstream"}
            ):
                pass
            writer.write(b"x" * 4_000_000)  # goes nowhere: swallowed, nothing comes back
            for _ in range(20):
                async with http.get(f"{tp.url}/proxies", timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                    assert r.status == 200
            writer.close()
        assert not await _connects(host, int(listen_port))  # closing the server closed its proxies
    finally:
        echo.close()
        await echo.wait_closed()


async def _connects(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), TIMEOUT_S)
    except OSError:
        return False
    writer.close()
    return True


# --- embedding and the CLI -----------------------------------------------------------------------


def test_embedded_refuses_non_loopback_and_busy_ports() -> None:
    with pytest.raises(ValueError):
        EmbeddedToxiproxy(host="10.1.2.3")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = EmbeddedToxiproxy(port=busy.getsockname()[1])
        with pytest.raises(OSError):
            server.start_in_thread()
    server.stop()  # nothing running: a no-op


def test_context_manager_thread_mode_and_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    with EmbeddedToxiproxy() as tp:
        assert requests.get(f"{tp.url}/version", timeout=TIMEOUT_S).status_code == 200
        url = tp.url
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/version", timeout=TIMEOUT_S)
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    assert toxiproxy_url() is None
    monkeypatch.setenv("TOXIPROXY_URL", "http://127.0.0.1:18474")
    assert toxiproxy_url() == "http://127.0.0.1:18474"
    configure_client("127.0.0.1")
    assert (APIConsumer.host, APIConsumer.port) == ("127.0.0.1", DEFAULT_PORT)
    configure_client(toxiproxy_url() or "")
    assert (APIConsumer.host, APIConsumer.port) == ("127.0.0.1", 18474)


def _read_ready_line(proc: subprocess.Popen[str], deadline_s: float) -> dict[str, object]:
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline() if proc.stdout else ""))
    reader.start()
    reader.join(deadline_s)
    assert lines and lines[0].startswith("PDCHAOS_TOXIPROXY_READY "), lines
    return json.loads(lines[0].split(" ", 1)[1])


def test_cli_serves_populates_and_stops_on_sigterm(tmp_path: Path, echo_port: int) -> None:
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"name": "cfg", "upstream": f"127.0.0.1:{echo_port}"}]))
    with subprocess.Popen(
        [sys.executable, "-m", "harness.toxiproxy.cli", "--port", "0", "--seed", "3", "--config",
         str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        try:
            ready = _read_ready_line(proc, 15)
            proxies = requests.get(f"{ready['url']}/proxies", timeout=TIMEOUT_S).json()
            assert list(proxies) == ["cfg"] and echoes(proxies["cfg"]["listen"])
            proc.terminate()
            assert proc.wait(TIMEOUT_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(TIMEOUT_S)


@pytest.mark.parametrize("host", ["10.9.8.7", "0.0.0.0", "::", "localhost", "::1"])
def test_cli_refuses_any_host_but_a_loopback_ipv4_address(capsys: pytest.CaptureFixture[str],
                                                          host: str) -> None:
    """Issue 16: `--host 0.0.0.0` used to bind 127.0.0.1 silently; like the router and the engines, the
    server now refuses any address it will not bind. A loopback address other than 127.0.0.1 is a fake
    cluster pod's (harness/kube/fake_cluster)."""
    from harness.toxiproxy.cli import main

    assert main(["--host", host, "--port", "0"]) == 2
    assert "binds a loopback IPv4 address only" in capsys.readouterr().err


def test_cli_names_a_config_file_that_is_not_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from harness.toxiproxy.cli import main

    bad = tmp_path / "proxies.json"
    bad.write_bytes(b"\x80 not json")
    assert main(["--port", "0", "--config", str(bad)]) == 2
    assert f"--config {bad}: not a JSON list of proxies" in capsys.readouterr().err


def test_http_upstream_change_and_delete_drop_open_connections(
    embedded: EmbeddedToxiproxy, echo_port: int
) -> None:
    url = embedded.url
    reply = requests.post(
        f"{url}/proxies", json={"name": "p", "upstream": f"127.0.0.1:{echo_port}"}, timeout=TIMEOUT_S
    )
    host, port = reply.json()["listen"].rsplit(":", 1)

    def open_echoing() -> socket.socket:
        sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        sock.sendall(b"hi")
        assert sock.recv(2) == b"hi"
        return sock

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        dead = f"127.0.0.1:{holder.getsockname()[1]}"
        with open_echoing() as sock:
            reply = requests.patch(f"{url}/proxies/p", json={"upstream": dead}, timeout=TIMEOUT_S)
            assert reply.json()["upstream"] == dead
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(10) == b""  # the restart dropped it
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
            assert sock.recv(10) == b""  # new connections go to the new (dead) upstream
    requests.patch(f"{url}/proxies/p", json={"upstream": f"127.0.0.1:{echo_port}"}, timeout=TIMEOUT_S)
    with open_echoing() as sock:
        assert requests.delete(f"{url}/proxies/p", timeout=TIMEOUT_S).status_code == 204
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(10) == b""
    assert refused(f"{host}:{port}")


def test_toxiproxy_server_prefers_the_configured_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    with toxiproxy_server(seed=1) as url:
        assert Toxiproxy().running() is True
        assert (APIConsumer.host, APIConsumer.port) == ("127.0.0.1", int(url.rsplit(":", 1)[1]))
        monkeypatch.setenv("TOXIPROXY_URL", url)  # stands in for a real Toxiproxy somewhere
        with toxiproxy_server() as same:
            assert same == url
        assert requests.get(f"{url}/version", timeout=TIMEOUT_S).status_code == 200  # not stopped
    assert not Toxiproxy().running()


def test_cli_accepts_toxiproxy_server_flag_spellings() -> None:
    from harness.toxiproxy.cli import parse_args

    args = parse_args(["-host", "127.0.0.1", "-port", "0", "-seed", "9"])
    assert (args.host, args.port, args.seed) == ("127.0.0.1", 0, 9)


# --- issue 16: Toxiproxy's answers, never a 500 ----------------------------------------------------


def test_port_in_use_is_409_and_a_failed_move_keeps_the_old_listener(
    embedded: EmbeddedToxiproxy, echo_port: int
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = f"127.0.0.1:{squatter.getsockname()[1]}"
        api = embedded.url
        body = {"name": "taken", "listen": busy, "upstream": f"127.0.0.1:{echo_port}"}
        made = requests.post(f"{api}/proxies", json=body, timeout=TIMEOUT_S)
        assert made.status_code == 409 and made.json()["status"] == 409
        assert requests.get(f"{api}/proxies/taken", timeout=TIMEOUT_S).status_code == 404
        good = requests.post(f"{api}/proxies", json={"name": "echo", "upstream": f"127.0.0.1:{echo_port}"},
                             timeout=TIMEOUT_S).json()
        moved = requests.post(f"{api}/proxies/echo", json={"listen": busy}, timeout=TIMEOUT_S)
        assert moved.status_code == 409
        shown = requests.get(f"{api}/proxies/echo", timeout=TIMEOUT_S).json()
        assert shown["listen"] == good["listen"] and shown["enabled"] is True
        assert echoes(good["listen"])  # the old listener still serves
        # Disabled, then enabled while its own port is taken: 409 and still shown disabled.
        requests.post(f"{api}/proxies/echo", json={"enabled": False}, timeout=TIMEOUT_S)
        requests.post(f"{api}/proxies/echo", json={"listen": busy}, timeout=TIMEOUT_S)
        again = requests.post(f"{api}/proxies/echo", json={"enabled": True}, timeout=TIMEOUT_S)
        assert again.status_code == 409
        assert requests.get(f"{api}/proxies/echo", timeout=TIMEOUT_S).json()["enabled"] is False


@pytest.mark.parametrize("name", ["a/b", "/lead", " padded", "tab\there"])
def test_proxy_and_toxic_names_a_url_cannot_reach_are_refused(
    embedded: EmbeddedToxiproxy, echo_port: int, name: str
) -> None:
    api = embedded.url
    made = requests.post(f"{api}/proxies", json={"name": name, "upstream": f"127.0.0.1:{echo_port}"},
                         timeout=TIMEOUT_S)
    assert made.status_code == 400 and "name" in made.json()["error"]
    assert requests.get(f"{api}/proxies", timeout=TIMEOUT_S).json() == {}
    requests.post(f"{api}/proxies", json={"name": "ok", "upstream": f"127.0.0.1:{echo_port}"},
                  timeout=TIMEOUT_S)
    toxic = requests.post(f"{api}/proxies/ok/toxics", json={"name": name, "type": "latency"},
                          timeout=TIMEOUT_S)
    assert toxic.status_code == 400


def test_bandwidth_rate_0_passes_nothing_until_removed(
    embedded: EmbeddedToxiproxy, echo_port: int
) -> None:
    api = embedded.url
    proxy = requests.post(f"{api}/proxies", json={"name": "echo", "upstream": f"127.0.0.1:{echo_port}"},
                          timeout=TIMEOUT_S).json()
    requests.post(f"{api}/proxies/echo/toxics", json={"name": "stall", "type": "bandwidth",
                                                      "attributes": {"rate": 0}}, timeout=TIMEOUT_S)
    host, port = proxy["listen"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"hello")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(5)  # the echo answered, the stalled downstream passes nothing
        assert requests.delete(f"{api}/proxies/echo/toxics/stall", timeout=TIMEOUT_S).status_code == 204
        sock.settimeout(TIMEOUT_S)
        assert sock.recv(5) == b"hello"  # what was held goes on once the toxic is gone
