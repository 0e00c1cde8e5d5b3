"""Runner parts against small loopback stubs: the load generator, the router watcher, fault verification
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

from fake_engines.control_client import EngineControlClient
from harness.faults import process_state
from harness.history import HistoryRecorder
from harness.load import LoadGenerator, RequestPlan, expected_text
from harness.observe import RouterWatcher, poll_handoffs
from harness.routers import ReferenceRouter
from harness.runner import update_latest
from harness.scenario import Workload, World
from harness.topology import build_topology
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
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield router, f"http://127.0.0.1:{port}"
    finally:
        router.release.set()
        await runner.cleanup()


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
async def test_load_records_outcomes(stub: Any, stream: bool, chat: bool) -> None:
    _router, url = stub
    hist = HistoryRecorder(None)
    async with aiohttp.ClientSession() as s:
        load = LoadGenerator(s, url, Workload(), hist, "t")
        good = await load.one(_plan(1, "good", stream, chat))
        wrong = await load.one(_plan(2, "wrong", stream, chat))
        busy = await load.one(_plan(3, "busy", stream, chat))
    assert good.ok and good.status == 200
    assert wrong.ok
    assert not busy.ok and busy.status == 503 and "no_available_workers" in (busy.error or "")
    done = {r["req"]: r for r in hist.records if r["type"] == "request_completed"}
    assert done[1]["text_ok"] is True and done[2]["text_ok"] is False and done[3]["text_ok"] is None
    assert (done[1]["ttft_s"] is not None) and done[1]["timed_out"] is False
    invoked = [r for r in hist.records if r["type"] == "request_invoked"]
    assert [r["stream"] for r in invoked] == [stream] * 3 and invoked[0]["tag"] == "[pdchaos:t:1]"


async def test_load_deadline_and_error_chunk(stub: Any) -> None:
    _router, url = stub
    hist = HistoryRecorder(None)
    async with aiohttp.ClientSession() as s:
        load = LoadGenerator(s, url, Workload(), hist, "t")
        hung = await load.one(_plan(1, "hang", False, False, deadline=0.3))
        broken = await load.one(_plan(2, "broken", True, False))
    assert hung.timed_out and not hung.ok and hung.status == 0
    assert not broken.ok and broken.status == 200 and broken.error == "kv load failed"
    done = {r["req"]: r for r in hist.records if r["type"] == "request_completed"}
    assert done[1]["timed_out"] is True and done[1]["latency_s"] < 2.0


async def test_load_refused_connection_is_a_clear_failure() -> None:
    hist = HistoryRecorder(None)
    async with aiohttp.ClientSession() as s:
        load = LoadGenerator(s, f"http://127.0.0.1:{free_port()}", Workload(), hist, "t")
        out = await load.one(_plan(1, "good", False, False))
    assert not out.ok and out.status == 0 and not out.timed_out and out.error


@pytest.mark.parametrize("mode", ["closed", "open"])
async def test_load_run_closed_and_open_loop(stub: Any, mode: str) -> None:
    router, url = stub
    hist = HistoryRecorder(None)
    w = Workload(mode=mode, concurrency=2, rate_rps=40, duration_s=0.5, think_time_s=0.01, chat_fraction=0.5,
                 stream_fraction=0.5, deadline_s=2.0)
    async with aiohttp.ClientSession() as s:
        load = LoadGenerator(s, url, w, hist, "run9", seed=5)
        stats = await load.run()
    assert stats.invoked == stats.completed == len(router.seen) > 3
    tags = [r["tag"] for r in hist.records if r["type"] == "request_invoked"]
    assert len(set(tags)) == len(tags) and all(t.startswith("[pdchaos:run9:") for t in tags)
    # Random words can end a prompt in no stub mode word: those are answered as `good` would be.
    assert stats.ok == stats.completed


# ---------------------------------------------------------------- router watcher against a stub /workers


async def test_router_watcher_records_changes_and_world() -> None:
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
    hist = HistoryRecorder(None)
    world = World()
    try:
        async with aiohttp.ClientSession() as s:
            watcher = RouterWatcher(ReferenceRouter(api_key="k"), s, topo, hist, world)
            await watcher.poll_once()
            assert world.worker_status == {"prefill-0": "pending", "decode-0": "ready"}
            await watcher.poll_once()  # nothing changed: nothing recorded
            workers[0] = {**workers[0], "status": "ready", "kv_engine_id": "e1"}
            del workers[1]
            await watcher.poll_once()
            bad = RouterWatcher(ReferenceRouter(api_key="wrong"), s, topo, HistoryRecorder(None), World())
            assert await bad.poll_once() is None and bad.supported is False
    finally:
        await runner.cleanup()
    statuses = [r for r in hist.records if r["type"] == "router_status"]
    seen = [(r["engine"], r["status"], r["kv_engine_id"]) for r in statuses]
    assert seen == [
        ("prefill-0", "pending", None), ("decode-0", "ready", None),
        ("prefill-0", "ready", "e1"), ("decode-0", "absent", None),
    ]
    assert world.worker_status == {"prefill-0": "ready"}


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


async def test_poll_handoffs_follows_the_cursor() -> None:
    records = [
        {"ts": 1.0, "engine": "decode-0", "kind": "decode", "tag": f"[pdchaos:t:{i}]"} for i in range(3)
    ]

    async def get_records(request: web.Request) -> web.Response:
        since = int(request.query.get("since", "0"))
        return web.json_response({"records": records[since:], "next": len(records)})

    app = web.Application()
    app.router.add_get("/control/records", get_records)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    hist = HistoryRecorder(None)
    try:
        client = EngineControlClient(f"http://127.0.0.1:{port}", None, 1.0)
        assert await poll_handoffs(client, hist, 0) == 3
        assert await poll_handoffs(client, hist, 3) == 3
    finally:
        await runner.cleanup()
    dead = EngineControlClient(f"http://127.0.0.1:{free_port()}", None, 0.5)
    assert await poll_handoffs(dead, hist, 2) == 2  # unreachable: cursor kept, nothing recorded
    tags = [r["tag"] for r in hist.records if r["type"] == "handoff"]
    assert tags == [f"[pdchaos:t:{i}]" for i in range(3)]
