"""The `pdchaos-engine` process: READY line, serving, SIGTERM, crash and death faults, bad flags."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from fake_engines.cli import READY_PREFIX
from fake_engines.control import ControlError, EngineControlClient
from fake_engines.core.calls import is_call_record
from fake_engines.core.generator import expected_completion
from pdchaos.jsonl import read_jsonl
from pdchaos.ports import free_ports, port_is_open


async def spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fake_engines.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def ready_state(proc: asyncio.subprocess.Process, timeout_s: float = 20) -> dict[str, object]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
    text = line.decode()
    assert text.startswith(READY_PREFIX + " "), text
    return json.loads(text[len(READY_PREFIX) + 1 :])




async def test_cli_start_ready_serve_sigterm(procs: list[asyncio.subprocess.Process], tmp_path: Path) -> None:
    http_port, grpc_port, control_port, bootstrap_port = free_ports(4)
    records = tmp_path / "rec.jsonl"
    proc = await spawn(
        "--role",
        "prefill",
        "--connector",
        "mooncake",
        "--name",
        "cli-p",
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--control-port",
        str(control_port),
        "--bootstrap-port",
        str(bootstrap_port),
        "--ttft-ms",
        "0",
        "--itl-ms",
        "0",
        "--records",
        str(records),
        # SIGTERM drains the KV held for decodes; nobody pulls it here, so it expires soon.
        "--kv-abort-timeout-s",
        "0.3",
    )
    procs.append(proc)
    state = await ready_state(proc)
    assert state["pid"] == proc.pid and state["name"] == "cli-p" and state["serving"] is True
    assert (state["http_port"], state["grpc_port"], state["bootstrap_port"]) == (
        http_port,
        grpc_port,
        bootstrap_port,
    )
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.post(
            f"http://127.0.0.1:{http_port}/v1/completions",
            json={
                "prompt": "[pdchaos:cli:1] hi",
                "max_tokens": 3,
                "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "x"},
            },
        ) as r,
    ):
        body = await r.json()
    assert body["choices"][0]["text"] == expected_completion("[pdchaos:cli:1] hi", 3)
    (rec,) = [r for r in read_jsonl(records) if not is_call_record(r)]
    assert rec["engine"] == "cli-p" and rec["transfer_id"] == "x" and rec["engine_id"] == state["engine_id"]
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    assert not port_is_open(http_port)


async def test_cli_crash_is_sigkill(procs: list[asyncio.subprocess.Process]) -> None:
    http_port, control_port = free_ports(2)
    proc = await spawn(
        "--role",
        "both",
        "--http-port",
        str(http_port),
        "--control-port",
        str(control_port),
        "--control-token",
        "tok",
    )
    procs.append(proc)
    await ready_state(proc)
    answer = await EngineControlClient(f"http://127.0.0.1:{control_port}", "tok").crash()
    assert answer["ok"] is True
    assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL


async def test_cli_die_exits_after_delay(procs: list[asyncio.subprocess.Process]) -> None:
    http_port, control_port = free_ports(2)
    proc = await spawn("--role", "decode", "--http-port", str(http_port), "--control-port", str(control_port),
                       "--control-open")
    procs.append(proc)
    await ready_state(proc)
    client = EngineControlClient(f"http://127.0.0.1:{control_port}", None)
    await client.die(exit_after_s=0.3)
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{http_port}/health") as r:
        assert r.status == 503
    assert await asyncio.wait_for(proc.wait(), 10) == 1


def test_cli_help_documents_flags_and_faults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fake_engines.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    for flag in (
        "--role",
        "--connector",
        "--http-port",
        "--grpc-port",
        "--control-port",
        "--control-token",
        "--bootstrap-port",
        "--nixl-port",
        "--engine-id",
        "--dp-size",
        "--model",
        "--transfer-timeout-s",
        "--kv-abort-timeout-s",
        "--handshake-timeout-s",
        "--load-failure-policy",
        "--load-time-s",
        "--ttft-ms",
        "--itl-ms",
        "--seed",
        "--records",
        "--log-level",
    ):
        assert flag in out
    for fault in (
        "wedge",
        "fail_server_info",
        "no_engine_id",
        "fail_requests",
        "latency",
        "restart",
        "slow_start",
        "crash",
        "die",
    ):
        assert fault in out


@pytest.mark.parametrize(
    "args",
    [
        ["--role", "both"],  # neither HTTP nor gRPC
        ["--role", "both", "--http-port", "1", "--host", "0.0.0.0"],
        ["--role", "sideways", "--http-port", "1"],
        # Each was a traceback (bind, the timing model) or taken as given.
        ["--role", "prefill", "--http-port", "70000"],
        ["--role", "prefill", "--http-port", "-3"],
        ["--role", "prefill", "--http-port", "18431", "--connector", "mooncake", "--bootstrap-port", "70000"],
        ["--role", "prefill", "--http-port", "18431", "--ttft-ms", "-5"],
        ["--role", "prefill", "--http-port", "18431", "--dp-size", "0"],
        ["--role", "prefill", "--http-port", "18431", "--transfer-timeout-s", "-1"],
        ["--role", "prefill", "--http-port", "18431", "--itl-ms", "nan"],
    ],
)
def test_cli_rejects_bad_flags(args: list[str]) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fake_engines.cli", *args], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2
    assert "error" in res.stderr and "Traceback" not in res.stderr


def test_cli_port_in_use_exits_2() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "fake_engines.cli", "--role", "both", "--http-port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert res.returncode == 2
    assert "cannot serve" in res.stderr
    assert READY_PREFIX not in res.stdout


async def test_cli_without_token_generates_and_prints_one(procs: list[asyncio.subprocess.Process]) -> None:
    """Issue 16: an engine started without a control token must not leave its control API open."""
    http_port, control_port = free_ports(2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fake_engines.cli", "--role", "decode", "--http-port", str(http_port),
        "--control-port", str(control_port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "PDCHAOS_CONTROL_TOKEN"},
    )  # fmt: skip
    procs.append(proc)
    await ready_state(proc)
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stderr.readline(), 10)).decode()
    assert "control API token" in line
    token = line.rsplit(" ", 1)[1].strip()
    base = f"http://127.0.0.1:{control_port}"
    with pytest.raises(ControlError) as refused:
        await EngineControlClient(base, None).state()
    assert refused.value.status == 401
    state = await EngineControlClient(base, token).state()
    assert state["role"] == "decode"


def test_cli_open_control_excludes_a_token() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fake_engines.cli", "--role", "both", "--http-port", "1",
         "--control-port", "2",
         "--control-open", "--control-token", "x"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.returncode == 2 and "exclude each other" in res.stderr
