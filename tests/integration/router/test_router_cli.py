"""`pdchaos-router` as a process: READY line, serving, clean exit on SIGTERM/SIGINT, flag errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from pdchaos.waiting import poll_until
from reference_router.cli import build_parser, config_from_args, main
from reference_router.stub_engines import HttpStubEngine, StubState

ROUTER = [sys.executable, "-m", "reference_router"]


async def read_ready(proc: asyncio.subprocess.Process) -> int:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 15.0)
    text = line.decode()
    assert text.startswith("PDCHAOS_ROUTER_READY "), text
    return int(json.loads(text.split(" ", 1)[1])["port"])


@pytest.fixture
async def stubs() -> AsyncIterator[tuple[HttpStubEngine, HttpStubEngine]]:
    p = await HttpStubEngine(StubState("p", "prefill", "mooncake"), bootstrap=True).start()
    d = await HttpStubEngine(StubState("d", "decode", "mooncake")).start()
    try:
        yield p, d
    finally:
        await p.stop()
        await d.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_cli_serves_pd_and_exits_cleanly_on_signal(
    stubs: tuple[HttpStubEngine, HttpStubEngine], sig: signal.Signals, tmp_path: os.PathLike[str]
) -> None:
    p, d = stubs
    events = os.path.join(tmp_path, "ev.jsonl")
    proc = await asyncio.create_subprocess_exec(
        *ROUTER, "--pd-disaggregation", "--prefill", p.url, str(p.bootstrap_port), "--decode", d.url,
        "--health-check-interval-secs", "0.1", "--health-success-threshold", "1", "--events-file", events,
        "--api-key", "k", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        port = await read_ready(proc)
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:

            async def ready() -> bool:
                async with s.get(base + "/readiness") as r:
                    return r.status == 200

            await poll_until(ready, 5.0)
            async with s.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["text"] == d.state.answer_text()
            async with s.get(base + "/workers", headers={"Authorization": "Bearer k"}) as r:
                workers = (await r.json())["workers"]
        assert [w["role"] for w in workers] == ["prefill", "decode"]
        assert workers[0]["bootstrap_port"] == p.bootstrap_port
        kv = d.state.received[0]["body"]["kv_transfer_params"]
        assert kv["remote_engine_id"] == p.state.engine_id
        proc.send_signal(sig)
        rc = await asyncio.wait_for(proc.wait(), 10.0)
        assert rc == 0
        text = await asyncio.to_thread(Path(events).read_text, encoding="utf-8")
        assert any(json.loads(line)["type"] == "dispatch" for line in text.splitlines())
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("argv,needle", [
    (["--prefill", "http://127.0.0.1:1"], "need --pd-disaggregation"),
    (["--pd-disaggregation", "--prefill", "http://127.0.0.1:1", "x"], "bootstrap port must be an integer"),
    (["--pd-disaggregation", "--prefill", "http://127.0.0.1:1", "1", "2"], "URL [BOOTSTRAP_PORT]"),
    (["--pd-disaggregation", "--decode", "ftp://127.0.0.1:1"], "scheme"),
    (["--host", "0.0.0.0"], "127.0.0.1 only"),
    (["--inject-bug", "nonsense"], "invalid choice"),
    (["--prefill-policy", "nonsense"], "invalid choice"),
    (["--port", "70000"], "a port is 0..65535, not 70000"),  # was a traceback from bind()
    (["--port", "-1"], "a port is 0..65535, not -1"),
    (["--log-level", "BOGUS"], "invalid choice: 'BOGUS'"),  # was a traceback from logging
])
def test_cli_rejects_bad_flags(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_help_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--pd-disaggregation", "--prefill", "--decode", "--health-check-interval-secs",
                 "--health-check-timeout-secs", "--health-failure-threshold", "--health-success-threshold",
                 "--prefill-policy", "--decode-policy", "--api-key", "--request-timeout-secs",
                 "--inject-bug", "--identity-check-interval-secs", "--max-concurrent-health-checks"):
        assert flag in out
    assert "Mooncake" in out and "NIXL" in out


def test_flags_map_to_config() -> None:
    ns = build_parser().parse_args([
        "--pd-disaggregation", "--prefill", "grpc://127.0.0.1:5", "9000", "--prefill", "http://127.0.0.1:6",
        "--decode", "grpc://127.0.0.1:7", "--health-check-interval-secs", "0.5",
        "--health-check-timeout-secs", "0.2", "--health-failure-threshold", "1",
        "--health-success-threshold", "4", "--inject-bug", "metadata_no_deadline", "--connector", "nixl",
    ])
    cfg = config_from_args(ns)
    assert [(a.url, a.bootstrap_port) for a in cfg.prefill] == [("grpc://127.0.0.1:5", 9000),
                                                               ("http://127.0.0.1:6", None)]
    h = cfg.health()
    assert (h.interval_s, h.probe_timeout_s, h.failure_threshold, h.success_threshold) == (0.5, 0.2, 1, 4)
    assert h.metadata_timeout_s == 0.2 and h.bugs == frozenset({"metadata_no_deadline"})
    assert cfg.connector == "nixl" and cfg.decode == ("grpc://127.0.0.1:7",)
