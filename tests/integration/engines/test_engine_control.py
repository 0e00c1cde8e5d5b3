"""Control API and Python handle: state, restart, slow start, crash, death, every protocol fault, records."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from fake_engines.control import ControlError, EngineControlClient
from fake_engines.runtime import EngineHandle
from fake_engines.testing import loopback_config, running_engine
from pdchaos.ports import port_is_open

TOKEN = "s3cret"


@pytest.fixture
async def engine() -> AsyncIterator[EngineHandle]:
    cfg = loopback_config("prefill", "mooncake", name="ctl", control_token=TOKEN)
    async with running_engine(cfg) as handle:
        yield handle


@pytest.fixture
def client(engine: EngineHandle) -> EngineControlClient:
    return EngineControlClient(engine.url("control"), TOKEN, timeout_s=5)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def answers_within(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            await r.read()
            return True
    except TimeoutError:
        return False


async def test_state_and_token(engine: EngineHandle, client: EngineControlClient) -> None:
    state = await client.state()
    assert state["name"] == "ctl" and state["role"] == "prefill" and state["connector"] == "mooncake"
    assert state["engine_id"] == engine.engine_id and state["generation"] == 1
    assert state["serving"] is True and state["dead"] is False and state["faults"] == {}
    assert state["http_port"] == engine.http_port and state["bootstrap_port"] == engine.bootstrap_port
    assert state["side_channel_port"] == engine.side_channel_port
    for bad in (None, "wrong"):
        with pytest.raises(ControlError) as exc:
            await EngineControlClient(engine.url("control"), bad).state()
        assert exc.value.status == 401
    # Behind a proxy that keeps `Authorization` for itself (the Kubernetes API server), the token travels in
    # the engine's own header; a wrong one is refused the same way.
    async with aiohttp.ClientSession() as session:
        for value, status in ((TOKEN, 200), ("wrong", 401)):
            async with session.get(engine.url("control") + "/control/state",
                                   headers={"X-Pdchaos-Control-Token": value},
                                   timeout=aiohttp.ClientTimeout(total=5)) as r:
                assert r.status == status


async def test_restart_refuses_while_down(engine: EngineHandle, client: EngineControlClient) -> None:
    before = await client.state()
    task = asyncio.create_task(client.restart(down_s=0.4, engine_id="pinned-id"))
    await asyncio.sleep(0.2)
    assert not port_is_open(engine.http_port)
    assert not port_is_open(engine.grpc_port)
    assert not port_is_open(engine.bootstrap_port)
    # The control API stays up across the restart.
    assert (await client.state())["serving"] is False
    answer = await task
    assert answer["ok"] is True
    assert answer["changed"]["engine_id"] == {"old": before["engine_id"], "new": "pinned-id"}
    assert answer["changed"]["side_channel_port"]["old"] == before["side_channel_port"]
    state = answer["state"]
    assert state["generation"] == 2 and state["serving"] is True
    assert (state["http_port"], state["grpc_port"], state["bootstrap_port"]) == (
        before["http_port"],
        before["grpc_port"],
        before["bootstrap_port"],
    )
    assert state["side_channel_port"] != before["side_channel_port"]
    assert port_is_open(engine.http_port)


async def test_slow_start(engine: EngineHandle, client: EngineControlClient) -> None:
    task = asyncio.create_task(client.slow_start(0.3))
    await asyncio.sleep(0.15)
    assert not port_is_open(engine.http_port)
    answer = await task
    assert answer["changed"]["refuse_s"] == 0.3
    assert port_is_open(engine.http_port)
    with pytest.raises(ControlError) as exc:
        await client._call("POST", "/control/slow_start", {})
    assert exc.value.status == 400


async def test_die_then_exit(
    engine: EngineHandle, client: EngineControlClient, session: aiohttp.ClientSession
) -> None:
    answer = await client.die(exit_after_s=0.3)
    assert answer["changed"]["dead"] == {"old": False, "new": True} and answer["state"]["dead"] is True
    async with session.get(engine.url() + "/health") as r:
        assert r.status == 503
    async with session.post(engine.url() + "/v1/completions", json={"prompt": "x"}) as r:
        assert r.status == 503
    assert await asyncio.wait_for(engine.wait_closed(), 3) == 1
    assert not port_is_open(engine.http_port) and not port_is_open(engine.control_port)


async def test_crash_in_process_closes_everything(engine: EngineHandle, client: EngineControlClient) -> None:
    answer = await client.crash()
    assert answer["ok"] is True and "crash" in answer["changed"]
    assert await asyncio.wait_for(engine.wait_closed(), 3) == 137
    assert not port_is_open(engine.http_port) and not port_is_open(engine.control_port)


@pytest.mark.parametrize(
    ("surface", "path", "other"),
    [
        ("health", "/health", "/v1/models"),
        ("metadata", "/v1/models", "/health"),
        ("all", "/health", None),
    ],
)
async def test_wedge_http_surfaces(
    engine: EngineHandle,
    client: EngineControlClient,
    session: aiohttp.ClientSession,
    surface: str,
    path: str,
    other: str | None,
) -> None:
    answer = await client.fault("wedge", surface=surface)
    assert answer["changed"]["wedge"] == {"old": None, "new": [surface]}
    assert answer["state"]["faults"] == {"wedge": [surface]}
    assert not await answers_within(session, engine.url() + path, 0.3)
    assert port_is_open(engine.http_port)  # accepted, never answered
    if other is not None:
        assert await answers_within(session, engine.url() + other, 2)
    parked = asyncio.create_task(answers_within(session, engine.url() + path, 3))
    await asyncio.sleep(0.1)
    cleared = await client.clear_fault("wedge")
    assert cleared["changed"]["wedge"] == {"old": [surface], "new": None}
    assert await parked


async def test_wedge_generate_and_bootstrap(
    engine: EngineHandle, client: EngineControlClient, session: aiohttp.ClientSession
) -> None:
    await client.fault("wedge", surface="generate")
    with pytest.raises(TimeoutError):
        async with session.post(
            engine.url() + "/v1/completions", json={"prompt": "x"}, timeout=aiohttp.ClientTimeout(total=0.3)
        ) as r:
            await r.read()
    await client.fault("wedge", surface="side_channel")
    assert not await answers_within(session, f"http://127.0.0.1:{engine.bootstrap_port}/query", 0.3)
    assert (await client.state())["faults"]["wedge"] == ["generate", "side_channel"]
    await client.clear()
    assert await answers_within(session, f"http://127.0.0.1:{engine.bootstrap_port}/query", 2)


async def test_latency_and_no_engine_id(
    engine: EngineHandle, client: EngineControlClient, session: aiohttp.ClientSession
) -> None:
    await client.fault("latency", surface="health", ms=300)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with session.get(engine.url() + "/health") as r:
        assert r.status == 200
    assert loop.time() - t0 >= 0.25
    answer = await client.fault("no_engine_id")
    assert answer["state"]["faults"]["no_engine_id"] is True
    async with session.get(f"http://127.0.0.1:{engine.bootstrap_port}/query") as r:
        assert (await r.json())["0"]["engine_id"] == ""
    cleared = await client.clear()
    assert set(cleared["changed"]) == {"latency", "no_engine_id"}
    assert cleared["state"]["faults"] == {}


async def test_restart_clears_faults(engine: EngineHandle, client: EngineControlClient) -> None:
    await client.fault("fail_server_info")
    answer = await client.restart()
    assert "fail_server_info" in answer["changed"]["faults_cleared"]
    assert answer["state"]["faults"] == {}


@pytest.mark.parametrize(
    "body",
    [
        {"fault": "explode"},
        {"fault": "wedge", "surface": "kitchen"},
        {"fault": "fail_requests", "count": 0},
        {"fault": "fail_requests", "count": 1, "status": 200},
        {"fault": "latency", "ms": -1},
        {"nofault": 1},
    ],
)
async def test_bad_fault_requests(client: EngineControlClient, body: dict[str, object]) -> None:
    with pytest.raises(ControlError) as exc:
        await client._call("POST", "/control/fault", body)
    assert exc.value.status == 400
    assert (await client.state())["faults"] == {}


async def test_bad_bodies(
    engine: EngineHandle, client: EngineControlClient, session: aiohttp.ClientSession
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with session.post(engine.url("control") + "/control/restart", data=b"{x", headers=headers) as r:
        assert r.status == 400
    async with session.post(
        engine.url("control") + "/control/restart", json={"down_s": -1}, headers=headers
    ) as r:
        assert r.status == 400
    async with session.get(engine.url("control") + "/control/records?since=abc", headers=headers) as r:
        assert r.status == 400
    with pytest.raises(ControlError):
        await client.clear_fault("nonsense")
    assert (await client.state())["generation"] == 1


async def test_records_since(
    engine: EngineHandle, client: EngineControlClient, session: aiohttp.ClientSession
) -> None:
    assert await client.records() == {"records": [], "next": 0}
    for i in range(3):
        async with session.post(
            engine.url() + "/v1/completions",
            json={
                "prompt": f"[pdchaos:r:{i}] p",
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"t{i}"},
            },
        ):
            pass
    page = await client.records()
    assert page["next"] == 3 and [r["tag"] for r in page["records"]] == [f"[pdchaos:r:{i}]" for i in range(3)]
    page2 = await client.records(since=2)
    assert page2["next"] == 3 and [r["transfer_id"] for r in page2["records"]] == ["t2"]
    assert (await client.records(since=3))["records"] == []


async def test_load_time_refuses_then_serves() -> None:
    cfg = loopback_config("both", load_time_s=0.4)
    task = asyncio.create_task(running_engine(cfg).__aenter__())
    await asyncio.sleep(0.15)
    assert not port_is_open(cfg.http_port)
    assert port_is_open(cfg.control_port)  # control answers while loading
    handle = await task
    try:
        assert port_is_open(cfg.http_port)
    finally:
        await handle.close()


async def test_restart_onto_a_taken_port_reports_500_then_recovers(
    engine: EngineHandle, client: EngineControlClient
) -> None:
    task = asyncio.create_task(client.restart(down_s=0.3))
    await asyncio.sleep(0.1)
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", engine.http_port))
        squatter.listen()
        with pytest.raises(ControlError) as exc:
            await task
        assert exc.value.status == 500
        state = await client.state()
        assert state["serving"] is False
    finally:
        squatter.close()
    answer = await client.restart()
    assert answer["state"]["serving"] is True and port_is_open(engine.http_port)
