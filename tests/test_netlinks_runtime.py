"""NetworkLinks against the embedded Toxiproxy: proxies on links, faults applied, verified, healed, recorded.

A small aiohttp server stands in for an engine's serving port and a TCP echo server for its side channel;
the proxies and toxics are the real embedded Toxiproxy, driven by the toxiproxy-python client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from toxiproxy import Toxiproxy

from harness.faults import FaultInjector
from harness.history import HistoryRecorder
from harness.netfaults import NetworkError, NetworkLinks, probe
from harness.netlinks import HealLink, LinkBandwidth, LinkFlap, LinkLatency, LinkRef, LinkReset, Partition
from harness.scenario import At, EngineSettings, Restart, Scenario, Step
from harness.topology import Topology, build_topology
from pdchaos.ports import free_ports

TIMEOUT = aiohttp.ClientTimeout(total=3.0)


@dataclass
class Stand:
    topo: Topology
    history: HistoryRecorder
    side_port: int


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
    history = HistoryRecorder(tmp_path / "history.jsonl")
    try:
        yield Stand(topo, history, echo.sockets[0].getsockname()[1])
    finally:
        echo.close()
        await echo.wait_closed()
        await runner.cleanup()
        history.close()


def _scenario(*steps: Step) -> Scenario:
    return Scenario(name="n", description="", bugs=("x",), timeline=steps)


def _injector(links: NetworkLinks, topo: Topology, history: HistoryRecorder) -> FaultInjector:
    inj = FaultInjector(SimpleNamespace(topo=topo), history, None, None)  # type: ignore[arg-type]
    inj.network = links
    return inj


def _records(history: HistoryRecorder, kind: str) -> list[dict[str, Any]]:
    return [r for r in history.records if r["type"] == kind]


async def _get(port: int) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT) as r:
        return r.status


async def test_no_network_action_is_inert(stand: Stand) -> None:
    s = _scenario(Step("r", Restart("prefill-0"), At(1)))
    async with NetworkLinks.for_scenario(s, stand.topo, stand.history) as net:
        assert not net.enabled and net.url is None
        assert net.router_topology is stand.topo
        settings = EngineSettings()
        assert net.engine_settings(settings) is settings
        await net.install(_Fleet(None))
        assert net.installed == {}
        assert not net.handles(Restart("prefill-0")) and net.handles(HealLink("prefill-0"))


async def test_partition_down_refuses_then_heal_restores(stand: Stand) -> None:
    s = _scenario(Step("cut", Partition("prefill-0"), At(1)), Step("mend", HealLink("prefill-0"), At(2)))
    async with NetworkLinks.for_scenario(s, stand.topo, stand.history) as net:
        await net.install(_Fleet(None))
        listen = net.listen[LinkRef("prefill-0", "serve")]
        view = net.router_topology
        assert view.url_of("prefill-0") == f"http://127.0.0.1:{listen}"
        assert view.name_of_url(stand.topo.url_of("prefill-0")) == "prefill-0"
        names = set(await asyncio.to_thread(lambda: set(Toxiproxy().proxies())))
        assert net.installed[LinkRef("prefill-0", "serve")] in names
        assert await _get(listen) == 200
        inj = _injector(net, stand.topo, stand.history)
        await inj.apply("cut", Partition("prefill-0"))
        assert await probe(listen) == "refused"
        await inj.apply("mend", HealLink("prefill-0"))
        assert await _get(listen) == 200
        assert inj.failures == []
    applied = _records(stand.history, "fault_applied")
    assert [(r["fault"], r["kind"], r["target"], r["params"]["link"]) for r in applied] == [
        ("cut", "link_down", "prefill-0", "serve")]
    verified = _records(stand.history, "fault_verified")
    assert verified[0]["ok"] is True and verified[0]["evidence"]["probe"] == "refused"
    healed = _records(stand.history, "fault_healed")
    assert [(r["fault"], r["kind"], r.get("reason")) for r in healed] == [("cut", "link_down", None)]
    assert net.installed == {}


async def test_timeout_partition_is_silent_and_listed(stand: Stand) -> None:
    s = _scenario(Step("wedge", Partition("prefill-0", mode="timeout"), At(1)))
    async with NetworkLinks.for_scenario(s, stand.topo, stand.history) as net:
        await net.install(_Fleet(None))
        inj = _injector(net, stand.topo, stand.history)
        await inj.apply("wedge", Partition("prefill-0", mode="timeout"))
        listen = net.listen[LinkRef("prefill-0", "serve")]
        assert await probe(listen, 0.3) == "silent"
        with pytest.raises(TimeoutError):
            async with aiohttp.ClientSession() as sess:
                await sess.get(f"http://127.0.0.1:{listen}/health", timeout=aiohttp.ClientTimeout(total=0.4))
        ev = _records(stand.history, "fault_verified")[0]
        assert ev["ok"] is True
        assert sorted(ev["evidence"]["toxics"]) == ["pdchaos-wedge", "pdchaos-wedge-up"]
    # Still active when the run ended: healed at teardown, and said so.
    healed = _records(stand.history, "fault_healed")
    assert [(r["fault"], r["reason"]) for r in healed] == [("wedge", "end of run")]


async def test_side_channel_latency_and_reset(stand: Stand) -> None:
    s = _scenario(Step("slow", LinkLatency("prefill-0", "side_channel", latency_ms=250), At(1)),
                  Step("reset", LinkReset("prefill-0", "side_channel"), At(2)))
    async with NetworkLinks.for_scenario(s, stand.topo, stand.history) as net:
        ref = LinkRef("prefill-0", "side_channel")
        settings = net.engine_settings(EngineSettings())
        assert settings.for_engine("prefill-0")["advertise_side_channel_port"] == net.listen[ref]
        assert "advertise_side_channel_port" not in settings.for_engine("decode-0")
        assert net.router_topology is stand.topo  # the router meets no proxied link
        await net.install(_Fleet(stand.side_port))
        inj = _injector(net, stand.topo, stand.history)
        await inj.apply("slow", LinkLatency("prefill-0", "side_channel", latency_ms=250))
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", net.listen[ref])
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 3.0) == b"ping"
        assert time.monotonic() - t0 >= 0.2  # the answer waited for the toxic
        writer.close()
        await inj.apply("mend", HealLink("prefill-0", "side_channel"))
        await inj.apply("reset", LinkReset("prefill-0", "side_channel"))
        assert await probe(net.listen[ref]) in ("reset", "closed")
        assert inj.failures == []
    kinds = [(r["fault"], r["kind"]) for r in _records(stand.history, "fault_applied")]
    assert kinds == [("slow", "link_latency"), ("reset", "link_reset")]
    assert all(r["ok"] for r in _records(stand.history, "fault_verified"))


async def test_side_channel_bandwidth_cap(stand: Stand) -> None:
    cap = LinkBandwidth("prefill-0", "side_channel", rate_kb_s=10)
    async with NetworkLinks.for_scenario(_scenario(Step("cap", cap, At(1))), stand.topo,
                                         stand.history) as net:
        await net.install(_Fleet(stand.side_port))
        inj = _injector(net, stand.topo, stand.history)
        await inj.apply("cap", cap)
        ev = _records(stand.history, "fault_verified")[0]
        assert ev["ok"] is True and ev["evidence"]["toxics"] == ["pdchaos-cap"]
        reader, writer = await asyncio.open_connection("127.0.0.1", net.listen[LinkRef("prefill-0",
                                                                                         "side_channel")])
        t0 = time.monotonic()
        writer.write(b"x" * 4000)
        got = await asyncio.wait_for(reader.readexactly(4000), 5.0)
        assert got == b"x" * 4000
        assert time.monotonic() - t0 >= 0.25  # 4000 bytes back at 10 KB/s: at least ~0.4 s
        writer.close()
    params = _records(stand.history, "fault_applied")[0]["params"]
    assert params["toxics"][0]["attributes"] == {"rate": 10} and params["link"] == "side_channel"


async def test_flap_toggles_and_heals_itself(stand: Stand) -> None:
    flap = LinkFlap("prefill-0", down_s=0.2, up_s=0.1, cycles=2)
    async with NetworkLinks.for_scenario(_scenario(Step("flap", flap, At(1))), stand.topo,
                                         stand.history) as net:
        await net.install(_Fleet(None))
        inj = _injector(net, stand.topo, stand.history)
        await inj.apply("flap", flap)
        assert _records(stand.history, "fault_verified")[0]["ok"] is True
        task = net.active[0].task
        assert task is not None
        await asyncio.wait_for(task, 3.0)
        assert net.active == []
        assert await _get(net.listen[LinkRef("prefill-0", "serve")]) == 200
    notes = [r["message"] for r in _records(stand.history, "note") if r["message"].startswith("flap ")]
    assert notes == ["flap prefill-0.serve up", "flap prefill-0.serve down", "flap prefill-0.serve up"]
    healed = _records(stand.history, "fault_healed")
    assert [(r["fault"], r["reason"]) for r in healed] == [("flap", "flapping ended")]


async def test_heal_cancels_a_flap(stand: Stand) -> None:
    flap = LinkFlap("prefill-0", down_s=5.0, up_s=5.0, cycles=3)
    async with NetworkLinks.for_scenario(_scenario(Step("flap", flap, At(1))), stand.topo,
                                         stand.history) as net:
        await net.install(_Fleet(None))
        inj = _injector(net, stand.topo, stand.history)
        await inj.apply("flap", flap)
        await inj.apply("mend", HealLink("prefill-0"))
        assert net.active == [] and inj.failures == []
        assert await _get(net.listen[LinkRef("prefill-0", "serve")]) == 200
    assert [r["fault"] for r in _records(stand.history, "fault_healed")] == ["flap"]


async def test_failures_are_recorded_not_raised(stand: Stand) -> None:
    s = _scenario(Step("cut", Partition("prefill-0"), At(1)))
    async with NetworkLinks.for_scenario(s, stand.topo, stand.history) as net:
        await net.install(_Fleet(None))
        inj = _injector(net, stand.topo, stand.history)
        # decode-0 has no proxied link in this scenario.
        await inj.apply("other", Partition("decode-0"))
        await inj.apply("heal_other", HealLink("decode-0"))
        assert len(inj.failures) == 2 and "no proxy" in inj.failures[0]
        bad = _records(stand.history, "fault_verified")
        assert [r["ok"] for r in bad] == [False, False]
        with pytest.raises(NetworkError):
            await net.apply("x", Partition("decode-0"), inj)


async def test_install_needs_a_side_channel_port(stand: Stand) -> None:
    s = _scenario(Step("slow", LinkLatency("prefill-0", "side_channel"), At(1)))
    async with NetworkLinks.for_scenario(s, stand.topo, stand.history) as net:
        with pytest.raises(NetworkError, match="upstream port unknown"):
            await net.install(_Fleet(None))


async def test_two_runs_side_by_side_share_one_server(stand: Stand) -> None:
    s = _scenario(Step("cut", Partition("prefill-0"), At(1)))
    a = NetworkLinks.for_scenario(s, stand.topo, stand.history)
    b = NetworkLinks.for_scenario(s, stand.topo, stand.history)
    async with b:
        async with a:
            assert a.url == b.url and a.prefix != b.prefix
            await a.install(_Fleet(None))
            await b.install(_Fleet(None))
            await _injector(a, stand.topo, stand.history).apply("cut", Partition("prefill-0"))
            assert await probe(a.listen[LinkRef("prefill-0", "serve")]) == "refused"
            assert await _get(b.listen[LinkRef("prefill-0", "serve")]) == 200
        # a's proxies went with its block; b's server and proxy live on.
        left = await asyncio.to_thread(lambda: set(Toxiproxy().proxies()))
        assert not any(name.startswith(a.prefix) for name in left)
        assert b.installed[LinkRef("prefill-0", "serve")] in left
        assert await _get(b.listen[LinkRef("prefill-0", "serve")]) == 200
