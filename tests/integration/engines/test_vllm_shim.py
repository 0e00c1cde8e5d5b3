"""The vLLM shim end to end: `python3 -m vllm.entrypoints.grpc_server` (as smg's e2e suite runs it) starts a
fake engine that serves vLLM's gRPC contract, registers itself, and takes `pdchaos fault` from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from helpers.vllm_worker_args import smg_e2e_worker_args

from harness.cli import main
from harness.vllm.cli import shim_folder
from pdchaos.ports import free_ports

pytestmark = pytest.mark.integration


def _wait_ready(log: Path, proc: subprocess.Popen[bytes], deadline_s: float = 20.0) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for line in log.read_text().splitlines():
            if line.startswith("PDCHAOS_ENGINE_READY "):
                return json.loads(line.split(" ", 1)[1])
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no ready line in {deadline_s} s: {log.read_text()}")


def test_grpc_server_from_vllms_command_line_takes_faults(tmp_path: Path) -> None:
    port, boot = free_ports(2)
    env = {
        **os.environ,
        "PYTHONPATH": str(shim_folder()),
        "PDCHAOS_ENGINES_REGISTRY": str(tmp_path / "reg.json"),
        "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(boot),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    argv = ["python3", "-m", "vllm.entrypoints.grpc_server", *smg_e2e_worker_args(port)]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        state = _wait_ready(log, proc)
        assert (state["role"], state["connector"], state["grpc_port"], state["bootstrap_port"]) == (
            "prefill",
            "mooncake",
            port,
            boot,
        )
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            check = ch.unary_unary("/grpc.health.v1.Health/Check")
            answer = check(b"", timeout=5)  # an empty HealthCheckRequest
        assert answer == b"\x08\x01"  # status: SERVING
        os.environ["PDCHAOS_ENGINES_REGISTRY"] = str(tmp_path / "reg.json")
        try:
            assert main(["fault", "prefill-0", "restart", "--down-s", "0.1"]) == 0
            assert main(["fault", "prefill-0", "wedge", "nowhere"]) == 3
            assert main(["fault", "decode-7", "crash"]) == 3
        finally:
            del os.environ["PDCHAOS_ENGINES_REGISTRY"]
        deadline = time.monotonic() + 5
        while "pdchaos fault restart" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        fault_line = next(ln for ln in log.read_text().splitlines() if "pdchaos fault restart" in ln)
        assert '"generation": {"new": 2, "old": 1}' in fault_line
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_unknown_flag_exits_as_vllm_does(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(shim_folder()),
        "PDCHAOS_ENGINES_REGISTRY": str(tmp_path / "reg.json"),
    }
    r = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--no-such-flag"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "api_server.py: error: unrecognized arguments: --no-such-flag" in r.stderr
    assert not (tmp_path / "reg.json").exists() or json.loads((tmp_path / "reg.json").read_text()) == {}


def _post(port: int, body: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_nixl_pair_logs_what_pd_suites_read(tmp_path: Path) -> None:
    """A NIXL handoff between two shimmed engines: the decode logs vLLM's handshake line and its KV transfer
    metrics line with the successful count (smg's e2e PD tests grep worker logs for both)."""
    p_port, d_port, p_side, d_side = free_ports(4)
    base = {
        **os.environ,
        "PYTHONPATH": str(shim_folder()),
        "PDCHAOS_ENGINES_REGISTRY": str(tmp_path / "reg.json"),
        "VLLM_LOG_STATS_INTERVAL": "0.5",
    }
    procs, logs = [], []
    for role, port, side in (("kv_producer", p_port, p_side), ("kv_consumer", d_port, d_side)):
        log = tmp_path / f"{role}.log"
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *smg_e2e_worker_args(port, role, "NixlConnector"),
        ]
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    argv,
                    env={**base, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        logs.append(log)
    try:
        for log, proc in zip(logs, procs, strict=True):
            _wait_ready(log, proc)
        prompt = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "the cat sat on the mat"}
        first = _post(
            p_port,
            {
                **prompt,
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            },
        )
        second = _post(d_port, {**prompt, "max_tokens": 4, "kv_transfer_params": first["kv_transfer_params"]})
        assert second["choices"][0]["text"]
        deadline = time.monotonic() + 10
        while "Num successful transfers=1" not in logs[1].read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = logs[1].read_text()
        assert (
            "NIXL compatibility check passed" in text
            and "KV Transfer metrics: Num successful transfers=1" in text
        )
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
