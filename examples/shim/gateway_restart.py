"""A gateway test of your own, run on the fake engines through the vLLM shim, with a #2491 outage added in one
line (`pdchaos fault prefill-0 restart --new-id`).

It starts a Mooncake prefill and a decode the way smg's e2e suite starts vLLM (`python3 -m
vllm.entrypoints.grpc_server ...` with the shim first on PYTHONPATH), then the gateway over gRPC, sends chat
requests, restarts the prefill with a new engine id, and sends more. It passes when every request after the
restart is answered within --timeout-s; a gateway that keeps minting the dead id makes them hang.

    python examples/shim/gateway_restart.py --gateway ~/.cache/pdchaos/gateways/smg-1.13.0/bin/smg
Exit status: 0 pass, 1 fail, 2 could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.vllm.cli import shim_folder
from pdchaos.ports import free_ports

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def post_chat(port: int, text: str, timeout_s: float) -> tuple[int | None, float]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, time.monotonic() - start
    except urllib.error.HTTPError as e:
        return e.code, time.monotonic() - start
    except (TimeoutError, urllib.error.URLError, OSError):
        return None, time.monotonic() - start


def wait_for(what: str, check: object, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready within {deadline_s} s")


def run(gateway: str, timeout_s: float, workdir: Path) -> int:
    p_port, d_port, boot, g_port, m_port = free_ports(5)
    env = {
        **os.environ,
        "PYTHONPATH": f"{shim_folder()}:{os.environ.get('PYTHONPATH', '')}",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PDCHAOS_ENGINES_REGISTRY": str(workdir / "engines.json"),
    }
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
        with (workdir / f"{name}.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    argv,
                    env={**env, **(extra or {})},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def vllm(port: int, role: str) -> list[str]:
        config = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": role})
        return [
            "python3",
            "-m",
            "vllm.entrypoints.grpc_server",
            "--model",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tensor-parallel-size",
            "1",
            "--gpu-memory-utilization",
            "0.9",
            "--kv-transfer-config",
            config,
        ]

    try:
        start("prefill", vllm(p_port, "kv_producer"), {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(boot)})
        start("decode", vllm(d_port, "kv_consumer"))
        wait_for(
            "engines",
            lambda: all(
                "PDCHAOS_ENGINE_READY" in (workdir / f"{n}.log").read_text() for n in ("prefill", "decode")
            ),
            30,
        )
        start(
            "gateway",
            [
                gateway,
                "launch",
                "--host",
                "127.0.0.1",
                "--port",
                str(g_port),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(m_port),
                "--pd-disaggregation",
                "--prefill",
                f"grpc://127.0.0.1:{p_port}",
                str(boot),
                "--decode",
                f"grpc://127.0.0.1:{d_port}",
                "--policy",
                "round_robin",
                "--health-check-interval-secs",
                "1",
                # As the #2491 scenario: one failed probe takes the worker out, one good one brings it back.
                "--health-failure-threshold",
                "1",
                "--health-success-threshold",
                "1",
                "--log-level",
                "info",
            ],
        )
        wait_for("the gateway and its workers", lambda: post_chat(g_port, "warm up", 5)[0] == 200, 60)
        before = [post_chat(g_port, f"before {i}", timeout_s) for i in range(5)]
        fault = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness.cli",
                "fault",
                "prefill-0",
                "restart",
                "--new-id",
                "--down-s",
                "2",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        said = fault.stdout.strip() or fault.stderr.strip()
        print(f"pdchaos fault prefill-0 restart --new-id --down-s 2: {said}")
        time.sleep(4)  # probes see the prefill down and back
        after = [post_chat(g_port, f"after {i}", timeout_s) for i in range(5)]
    except TimeoutError as e:
        print(f"could not run: {e}; logs in {workdir}")
        return 2
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def show(rs: list[tuple[int | None, float]]) -> str:
        return ", ".join(f"{s or 'no answer'} in {t:.1f}s" for s, t in rs)

    print(f"before the restart: {show(before)}")
    print(f"after the restart:  {show(after)}")
    ok = all(s == 200 for s, _ in before + after)
    print(f"{'PASS' if ok else 'FAIL'}: {shlex.quote(gateway)} (logs and engine records in {workdir})")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--gateway", required=True, help="the smg executable (e.g. from `pdchaos gateways install`)"
    )
    p.add_argument("--timeout-s", type=float, default=10.0, help="a request's deadline (default 10)")
    p.add_argument("--keep", type=Path, default=None, help="keep the logs in this folder")
    args = p.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        return run(args.gateway, args.timeout_s, args.keep)
    with tempfile.TemporaryDirectory() as tmp:
        return run(args.gateway, args.timeout_s, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
