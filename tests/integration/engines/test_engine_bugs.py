"""`pdchaos-engine --inject-bug NAME`: an engine process started with a switch shows its bug, one started
without it does not (`--list-bugs` names them)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import aiohttp
import pytest
from test_engine_cli import ready_state, spawn

from fake_engines import kv_channel
from fake_engines.core.bugs import ENGINE_BUGS
from fake_engines.core.generator import prompt_digest
from fake_engines.core.tokenizer import encode
from fake_engines.testing import loopback_config, running_engine
from pdchaos.ports import free_ports


async def prefill_process(procs: list[asyncio.subprocess.Process], *extra: str) -> tuple[int, dict[str, Any]]:
    """A Mooncake prefill process; (its HTTP port, its READY state)."""
    http_port, bootstrap_port = free_ports(2)
    proc = await spawn("--role", "prefill", "--connector", "mooncake", "--http-port", str(http_port),
                       "--bootstrap-port", str(bootstrap_port), "--ttft-ms", "0", "--itl-ms", "0", *extra)
    procs.append(proc)
    return http_port, await ready_state(proc)


async def completion(port: int, prompt: str, params: dict[str, Any] | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 1}
    if params is not None:
        body["kv_transfer_params"] = params
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r,
    ):
        return r.status, await r.json(content_type=None)


async def hold(port: int, prompt: str, transfer_id: str) -> None:
    status, _ = await completion(port, prompt, {"do_remote_decode": True, "transfer_id": transfer_id})
    assert status == 200


def test_list_bugs_prints_every_switch_and_exits_zero() -> None:
    done = subprocess.run([sys.executable, "-m", "fake_engines", "--list-bugs"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in ENGINE_BUGS)


def test_an_unknown_switch_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "fake_engines", "--role", "prefill", "--http-port", "1",
                           "--inject-bug", "nope"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "invalid choice: 'nope'" in done.stderr


@pytest.mark.parametrize("bug", [False, True], ids=["correct", "kv_freed_while_read"])
async def test_a_pull_after_the_abort_timeout(procs: list[asyncio.subprocess.Process], bug: bool) -> None:
    extra = ["--inject-bug", "kv_freed_while_read"] if bug else []
    port, state = await prefill_process(procs, "--kv-abort-timeout-s", "0.2", *extra)
    await hold(port, "[pdchaos:b:1] the late one", "xfer-a")
    await asyncio.sleep(0.3)  # past the abort timeout
    await hold(port, "[pdchaos:b:2] the next one", "xfer-b")
    res = await kv_channel.pull("127.0.0.1", int(state["side_channel_port"]), str(state["engine_id"]),
                                "xfer-a", 5.0)
    if bug:
        assert res.ok
        assert res.prompt_digest == prompt_digest(encode("[pdchaos:b:2] the next one"))
    else:
        assert not res.ok and res.error == "no KV held for xfer-a"


@pytest.mark.parametrize("bug", [False, True], ids=["correct", "shutdown_drops_pulls"])
async def test_sigterm_with_kv_still_to_pull(procs: list[asyncio.subprocess.Process], bug: bool) -> None:
    extra = ["--inject-bug", "shutdown_drops_pulls"] if bug else []
    port, state = await prefill_process(procs, *extra)
    proc = procs[-1]
    await hold(port, "[pdchaos:b:3] pull me", "xfer-c")
    proc.send_signal(signal.SIGTERM)
    side = ("127.0.0.1", int(state["side_channel_port"]))
    if bug:
        assert await asyncio.wait_for(proc.wait(), 10) == 0  # gone without waiting for the pull
        with pytest.raises(OSError):
            await kv_channel.pull(*side, str(state["engine_id"]), "xfer-c", 2.0)
        return
    await asyncio.sleep(0.3)
    assert proc.returncode is None  # still serving the KV it owes
    status, body = await completion(port, "[pdchaos:b:4] new work")
    assert status == 503 and "shutting down" in str(body)
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health") as r:
        assert r.status == 503
    res = await kv_channel.pull(*side, str(state["engine_id"]), "xfer-c", 5.0)
    assert res.ok
    start = time.monotonic()
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize("bug", [False, True], ids=["correct", "stale_peer_handshake"])
async def test_a_prefill_replaced_on_the_same_address(
    procs: list[asyncio.subprocess.Process], bug: bool
) -> None:
    http_port, control_port = free_ports(2)
    extra = ["--inject-bug", "stale_peer_handshake"] if bug else []
    decode = await spawn("--role", "decode", "--connector", "nixl", "--http-port", str(http_port),
                         "--control-port", str(control_port), "--control-token", "tok", "--ttft-ms", "0",
                         "--itl-ms", "0", "--transfer-timeout-s", "1", *extra)
    procs.append(decode)
    await ready_state(decode)
    async with running_engine(loopback_config("prefill", "nixl")) as p:
        for n in (1, 2):
            if n == 2:
                old = p.engine_id
                await p.restart()  # same NIXL port, new engine id
            prompt = f"[pdchaos:b:{10 + n}] hand me off"
            status, pre = await completion(p.http_port, prompt, {"do_remote_decode": True})
            assert status == 200
            status, body = await completion(http_port, prompt, pre["kv_transfer_params"])
        if bug:
            assert status == 500 and f"asked {old}" in body["error"]["message"]
        else:
            assert status == 200
    auth = {"Authorization": "Bearer tok"}
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{control_port}/control/records", headers=auth) as r,
    ):
        last = (await r.json())["records"][-1]
    assert last["remote_engine_id"] == p.engine_id
    assert last["peer_engine_id"] == (old if bug else p.engine_id)
