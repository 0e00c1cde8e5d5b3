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
