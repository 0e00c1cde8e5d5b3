"""Real-world parts against small loopback stubs: the client, the router's worker reads, fault verification
helpers, the `runs/latest` link."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from helpers.aiohttp_server import serving

from harness.history_writer import HistoryRecorder
from harness.routers import ReferenceRouter
from harness.runner import update_latest
from harness.scenario import Scenario
from harness.session import ScenarioSession
from harness.session.commands import PollWorkers
from harness.session.events import Event, WorkersSeen
from harness.session.requests import RequestPlan, expected_text
from harness.session.workers import WorkerWatch
from harness.topology import build_topology
from harness.worlds.real.client import RouterClient
from harness.worlds.real.probes import process_state
from harness.worlds.real.world import RealWorld
from pdchaos.ports import free_port

# ---------------------------------------------------------------- a stub router for the load generator


class StubRouter:
    """Answers by the prompt's last word: `good` (the expected text), `wrong`, `busy` (503), `hang`,
    `broken` (SSE with an error chunk); streaming when asked."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.release = asyncio.Event()

    def _mode(self, body: dict[str, Any]) -> str:
        text = body.get("prompt") or body["messages"][-1]["content"]
        return str(text).split()[-1]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(body)
        chat = request.path.endswith("chat/completions")
        mode = self._mode(body)
        if mode == "busy":
            err = {"error": {"message": "none", "code": "no_available_workers"}}
            return web.json_response(err, status=503)
        if mode == "hang":
            await self.release.wait()
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        stream = bool(body.get("stream"))
        plan = RequestPlan(0, "", request.path, stream, prompt, body["max_tokens"], 1.0, body)
        text = expected_text(plan) or "x"
        if mode == "wrong":
            text = text + " extra"
        if not body.get("stream"):
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            return web.json_response({"choices": [choice]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in text.split(" "):
            piece = {"delta": {"content": " " + word}} if chat else {"text": " " + word}
            if word:
                await resp.write(f"data: {json.dumps({'choices': [piece]})}\n\n".encode())
            if mode == "broken":
                await resp.write(b'data: {"error": {"message": "kv load failed"}}\n\n')
                break
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def stub() -> Any:
    router = StubRouter()
    app = web.Application()
    app.router.add_post("/v1/completions", router.handle)
    app.router.add_post("/v1/chat/completions", router.handle)
    async with serving(app) as url:
        try:
            yield router, url
        finally:
            router.release.set()


def _plan(seq: int, mode: str, stream: bool, chat: bool, deadline: float = 2.0) -> RequestPlan:
    prompt = f"[pdchaos:t:{seq}] alpha bravo {mode}"
    body: dict[str, Any] = {"model": "m", "max_tokens": 5, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    return RequestPlan(seq, f"[pdchaos:t:{seq}]", endpoint, stream, prompt, 5, deadline, body)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True])
async def test_client_reports_outcomes(stub: Any, stream: bool, chat: bool) -> None:
    _router, url = stub
    async with aiohttp.ClientSession() as s:
        client = RouterClient(s, url)
        good = await client.send(_plan(1, "good", stream, chat))
        wrong = await client.send(_plan(2, "wrong", stream, chat))
        busy = await client.send(_plan(3, "busy", stream, chat))
    assert good.ok and good.status == 200 and good.seq == 1
    assert good.text == expected_text(_plan(1, "good", stream, chat))
    assert good.ttft_s is not None and not good.timed_out
    assert wrong.ok and wrong.text != expected_text(_plan(2, "wrong", stream, chat))
    assert not busy.ok and busy.status == 503 and "no_available_workers" in (busy.error or "")


async def test_client_deadline_and_error_chunk(stub: Any) -> None:
    _router, url = stub
    async with aiohttp.ClientSession() as s:
        client = RouterClient(s, url)
        hung = await client.send(_plan(1, "hang", False, False, deadline=0.3))
        broken = await client.send(_plan(2, "broken", True, False))
    assert hung.timed_out and not hung.ok and hung.status == 0 and hung.latency_s < 2.0
    assert not broken.ok and broken.status == 200 and broken.error == "kv load failed"


async def test_client_refused_connection_is_a_clear_failure() -> None:
    async with aiohttp.ClientSession() as s:
        out = await RouterClient(s, f"http://127.0.0.1:{free_port()}").send(_plan(1, "good", False, False))
    assert not out.ok and out.status == 0 and not out.timed_out and out.error


# ---------------------------------------------------------------- the router's workers against a stub


async def test_worker_reads_map_urls_to_engines_and_record_changes(tmp_path: Path) -> None:
    topo = build_topology("1p1d", "mooncake", "http", [free_port() for _ in range(11)])
    workers: list[dict[str, Any]] = [
        {"id": "w1", "url": topo.url_of("prefill-0"), "role": "prefill", "status": "pending",
         "kv_engine_id": None},
        {"id": "w2", "url": topo.url_of("decode-0"), "role": "decode", "status": "ready",
         "kv_engine_id": None},
    ]

    async def list_workers(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer k":
            return web.json_response({"error": "auth"}, status=401)
        return web.json_response({"workers": workers})

    app = web.Application()
    app.router.add_get("/workers", list_workers)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", topo.router_port).start()
    plan = ScenarioSession(Scenario(name="w", description=""), topo, router="reference").plan
    hist = HistoryRecorder(None)
    watch = WorkerWatch(hist)
    seen: list[Event] = []

    async def read(adapter: ReferenceRouter) -> WorkersSeen:
        async with RealWorld(plan, adapter, tmp_path) as world:
            seen.clear()
            await world.execute(PollWorkers(), seen.append)
        got = seen[0]
        assert isinstance(got, WorkersSeen)
        return got

    try:
        first = await read(ReferenceRouter(api_key="k"))
        assert first.engines == {topo.url_of("prefill-0"): "prefill-0", topo.url_of("decode-0"): "decode-0"}
        watch.seen(first.workers, first.engines)
        assert watch.status == {"prefill-0": "pending", "decode-0": "ready"} and watch.supported
        again = await read(ReferenceRouter(api_key="k"))
        watch.seen(again.workers, again.engines)  # nothing changed: nothing recorded
        workers[0] = {**workers[0], "status": "ready", "kv_engine_id": "e1"}
        del workers[1]
        later = await read(ReferenceRouter(api_key="k"))
        watch.seen(later.workers, later.engines)
        refused = await read(ReferenceRouter(api_key="wrong"))
        assert refused.workers is None
        # The run's note says why the list was not read (it read "no readable /workers" alone).
        assert refused.problem == "answered 401"
        keyless = await read(ReferenceRouter(api_key=None))
        assert keyless.problem.startswith("answered 401 (an API key: a cmd: template passes the run's")
    finally:
        await runner.cleanup()
    statuses = [r for r in hist.records if r["type"] == "router_status"]
    got = [(r["engine"], r["status"], r["kv_engine_id"]) for r in statuses]
    assert got == [
        ("prefill-0", "pending", None), ("decode-0", "ready", None),
        ("prefill-0", "ready", "e1"), ("decode-0", "absent", None),
    ]
    assert watch.status == {"prefill-0": "ready"}


# ---------------------------------------------------------------- helpers


def test_process_state_sees_a_stopped_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_state(child.pid) not in (None, "T", "Z")
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(200):  # the kernel applies the stop asynchronously
            if process_state(child.pid) == "T":
                break
            time.sleep(0.01)
        assert process_state(child.pid) == "T"
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait(5)
    assert process_state(child.pid) is None


def test_update_latest_points_at_newest_run(tmp_path: Path) -> None:
    a, b = tmp_path / "run-a", tmp_path / "run-b"
    a.mkdir()
    b.mkdir()
    update_latest(a)
    assert (tmp_path / "latest").resolve() == a.resolve()
    update_latest(b)
    assert (tmp_path / "latest").resolve() == b.resolve()
    assert os.readlink(tmp_path / "latest") == "run-b"  # relative: the runs folder can move
