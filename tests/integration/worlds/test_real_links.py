"""The real world's network links against the embedded Toxiproxy: proxies on links, faults applied, verified
and healed, each reported as events (which faults a heal ends is the session ledger's business).

A small aiohttp server stands in for an engine's serving port and a TCP echo server for its side channel;
the proxies and toxics are the real embedded Toxiproxy, driven by the toxiproxy-python client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from toxiproxy import Toxiproxy

from harness.scenario import At, EngineSettings, Restart, Scenario, Step
from harness.scenario.links import (
    HealLink,
    LinkBandwidth,
    LinkFlap,
    LinkLatency,
    LinkRef,
    LinkReset,
    Partition,
    links_in,
)
from harness.session.events import ActionDone, Event, FaultApplied, FaultVerified, WorldNote
from harness.topology import Topology, build_topology
from harness.worlds.real.links import NetworkError, NetworkLinks
from harness.worlds.real.probes import tcp_probe as probe
from pdchaos.ports import free_ports

TIMEOUT = aiohttp.ClientTimeout(total=3.0)


@dataclass
class Stand:
    topo: Topology
    side_port: int
    events: list[Event] = field(default_factory=list)

    def emit(self, ev: Event) -> None:
        self.events.append(ev)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class _Fleet:
    """What NetworkLinks.install asks of the engine fleet: the engine's state (its side-channel port)."""

    def __init__(self, side_port: int | None) -> None:
        self.side_port = side_port

    async def state(self, name: str) -> dict[str, Any] | None:
        return {"side_channel_port": self.side_port}


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def stand(tmp_path: Path) -> AsyncIterator[Stand]:
    ports = free_ports(11)
    topo = build_topology("1p1d", "mooncake", "http", ports)
    app = web.Application()

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", topo.engine("prefill-0").http_port).start()
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        yield Stand(topo, echo.sockets[0].getsockname()[1])
    finally:
        echo.close()
        await echo.wait_closed()
        await runner.cleanup()


def _scenario(*steps: Step) -> Scenario:
    return Scenario(name="n", description="", bugs=("x",), timeline=steps)


class Links:
    """NetworkLinks for a scenario's timeline, opened and closed as a block."""

    def __init__(self, s: Scenario, stand: Stand) -> None:
        self.net = NetworkLinks(links_in(s.timeline, stand.topo.connector), stand.topo)
        self.stand = stand

    async def __aenter__(self) -> NetworkLinks:
        self.stand.events.extend(await self.net.open())
        return self.net

    async def __aexit__(self, *exc: object) -> None:
        await self.net.close()


async def _get(port: int) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT) as r:
        return r.status


async def test_no_network_action_is_inert(stand: Stand) -> None:
    s = _scenario(Step("r", Restart("prefill-0"), At(1)))
    async with Links(s, stand) as net:
        assert not net.enabled and net.url is None
        assert net.router_topology is stand.topo
        settings = EngineSettings()
        assert net.engine_settings(settings) is settings
        await net.install(_Fleet(None), stand.emit)
        assert net.installed == {} and stand.events == []


async def test_partition_down_refuses_then_heal_restores(stand: Stand) -> None:
    s = _scenario(Step("cut", Partition("prefill-0"), At(1)), Step("mend", HealLink("prefill-0"), At(2)))
    async with Links(s, stand) as net:
        await net.install(_Fleet(None), stand.emit)
        listen = net.listen[LinkRef("prefill-0", "serve")]
        view = net.router_topology
        assert view.url_of("prefill-0") == f"http://127.0.0.1:{listen}"
        assert view.name_of_url(stand.topo.url_of("prefill-0")) == "prefill-0"
        names = set(await asyncio.to_thread(lambda: set(Toxiproxy().proxies())))
        assert net.installed[LinkRef("prefill-0", "serve")] in names
        assert await _get(listen) == 200
        await net.apply("cut", Partition("prefill-0"), stand.emit)
        assert await probe(listen) == "refused"
        await net.apply("mend", HealLink("prefill-0"), stand.emit)
        assert await _get(listen) == 200
    notes = [n.message for n in stand.of(WorldNote)]
    assert notes[0] == "toxiproxy" and notes[1].startswith("proxy ")
    applied = stand.of(FaultApplied)
    assert [(a.fault, a.kind, a.target, a.params["link"], a.link) for a in applied] == [
        ("cut", "link_down", "prefill-0", "serve", "serve")]
    verified = stand.of(FaultVerified)
    assert verified[0].ok is True and verified[0].evidence["probe"] == "refused"
    done = stand.of(ActionDone)
    assert [(d.fault, d.error, d.verified) for d in done] == [("cut", None, True), ("mend", None, True)]
    assert done[1].evidence["prefill-0.serve"]["toxics"] == []
    assert net.installed == {}


async def test_timeout_partition_is_silent_and_listed(stand: Stand) -> None:
    s = _scenario(Step("wedge", Partition("prefill-0", mode="timeout"), At(1)))
    async with Links(s, stand) as net:
        await net.install(_Fleet(None), stand.emit)
        await net.apply("wedge", Partition("prefill-0", mode="timeout"), stand.emit)
        listen = net.listen[LinkRef("prefill-0", "serve")]
        assert await probe(listen, 0.3) == "silent"
        with pytest.raises(TimeoutError):
            async with aiohttp.ClientSession() as sess:
                await sess.get(f"http://127.0.0.1:{listen}/health", timeout=aiohttp.ClientTimeout(total=0.4))
        ev = stand.of(FaultVerified)[0]
        assert ev.ok is True
        assert sorted(ev.evidence["toxics"]) == ["pdchaos-wedge", "pdchaos-wedge-up"]


async def test_side_channel_latency_and_reset(stand: Stand) -> None:
    s = _scenario(Step("slow", LinkLatency("prefill-0", "side_channel", latency_ms=250), At(1)),
                  Step("reset", LinkReset("prefill-0", "side_channel"), At(2)))
    async with Links(s, stand) as net:
        ref = LinkRef("prefill-0", "side_channel")
        settings = net.engine_settings(EngineSettings())
        assert settings.for_engine("prefill-0")["advertise_side_channel_port"] == net.listen[ref]
        assert "advertise_side_channel_port" not in settings.for_engine("decode-0")
        assert net.router_topology is stand.topo  # the router meets no proxied link
        await net.install(_Fleet(stand.side_port), stand.emit)
        await net.apply("slow", LinkLatency("prefill-0", "side_channel", latency_ms=250), stand.emit)
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", net.listen[ref])
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 3.0) == b"ping"
        assert time.monotonic() - t0 >= 0.2  # the answer waited for the toxic
        writer.close()
        await net.apply("mend", HealLink("prefill-0", "side_channel"), stand.emit)
        await net.apply("reset", LinkReset("prefill-0", "side_channel"), stand.emit)
        assert await probe(net.listen[ref]) in ("reset", "closed")
    kinds = [(a.fault, a.kind) for a in stand.of(FaultApplied)]
    assert kinds == [("slow", "link_latency"), ("reset", "link_reset")]
    assert all(v.ok for v in stand.of(FaultVerified))
    assert all(d.verified and d.error is None for d in stand.of(ActionDone))


async def test_side_channel_bandwidth_cap(stand: Stand) -> None:
    cap = LinkBandwidth("prefill-0", "side_channel", rate_kb_s=10)
    async with Links(_scenario(Step("cap", cap, At(1))), stand) as net:
        await net.install(_Fleet(stand.side_port), stand.emit)
        await net.apply("cap", cap, stand.emit)
        ev = stand.of(FaultVerified)[0]
        assert ev.ok is True and ev.evidence["toxics"] == ["pdchaos-cap"]
        reader, writer = await asyncio.open_connection("127.0.0.1", net.listen[LinkRef("prefill-0",
                                                                                         "side_channel")])
        t0 = time.monotonic()
        writer.write(b"x" * 4000)
        got = await asyncio.wait_for(reader.readexactly(4000), 5.0)
        assert got == b"x" * 4000
        assert time.monotonic() - t0 >= 0.25  # 4000 bytes back at 10 KB/s: at least ~0.4 s
        writer.close()
    params = stand.of(FaultApplied)[0].params
    assert params["toxics"][0]["attributes"] == {"rate": 10} and params["link"] == "side_channel"


async def test_flap_starts_down_and_toggles_on_demand(stand: Stand) -> None:
    flap = LinkFlap("prefill-0", down_s=0.2, up_s=0.1, cycles=2)
    async with Links(_scenario(Step("flap", flap, At(1))), stand) as net:
        await net.install(_Fleet(None), stand.emit)
        await net.apply("flap", flap, stand.emit)
        listen = net.listen[LinkRef("prefill-0", "serve")]
        assert stand.of(FaultVerified)[0].ok is True and await probe(listen) == "refused"
        await net.set_enabled(LinkRef("prefill-0", "serve"), True)
        assert await _get(listen) == 200
        with pytest.raises(NetworkError):
            await net.set_enabled(LinkRef("decode-0", "serve"), True)


async def test_heal_ends_a_flap_with_the_link_up(stand: Stand) -> None:
    flap = LinkFlap("prefill-0", down_s=5.0, up_s=5.0, cycles=3)
    async with Links(_scenario(Step("flap", flap, At(1))), stand) as net:
        await net.install(_Fleet(None), stand.emit)
        await net.apply("flap", flap, stand.emit)
        await net.apply("mend", HealLink("prefill-0"), stand.emit)
        assert stand.of(ActionDone)[-1].verified is True
        assert await _get(net.listen[LinkRef("prefill-0", "serve")]) == 200


async def test_a_link_without_proxy_raises(stand: Stand) -> None:
    s = _scenario(Step("cut", Partition("prefill-0"), At(1)))
    async with Links(s, stand) as net:
        await net.install(_Fleet(None), stand.emit)
        # decode-0 has no proxied link here: the world says so (the session records it unverified).
        with pytest.raises(NetworkError, match="no proxy"):
            await net.apply("other", Partition("decode-0"), stand.emit)
        with pytest.raises(NetworkError, match="no proxied link"):
            await net.apply("heal_other", HealLink("decode-0"), stand.emit)
        assert stand.of(FaultApplied) == []


async def test_install_needs_a_side_channel_port(stand: Stand) -> None:
    s = _scenario(Step("slow", LinkLatency("prefill-0", "side_channel"), At(1)))
    async with Links(s, stand) as net:
        with pytest.raises(NetworkError, match="upstream port unknown"):
            await net.install(_Fleet(None), stand.emit)


async def test_two_runs_side_by_side_share_one_server(stand: Stand) -> None:
    s = _scenario(Step("cut", Partition("prefill-0"), At(1)))
    a, b = Links(s, stand), Links(s, stand)
    async with b as nb:
        async with a as na:
            assert na.url == nb.url and na.prefix != nb.prefix
            await na.install(_Fleet(None), stand.emit)
            await nb.install(_Fleet(None), stand.emit)
            await na.apply("cut", Partition("prefill-0"), stand.emit)
            assert await probe(na.listen[LinkRef("prefill-0", "serve")]) == "refused"
            assert await _get(nb.listen[LinkRef("prefill-0", "serve")]) == 200
        # a's proxies went with its block; b's server and proxy live on.
        left = await asyncio.to_thread(lambda: set(Toxiproxy().proxies()))
        assert not any(name.startswith(na.prefix) for name in left)
        assert nb.installed[LinkRef("prefill-0", "serve")] in left
        assert await _get(nb.listen[LinkRef("prefill-0", "serve")]) == 200
