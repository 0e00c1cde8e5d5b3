"""vLLM's command line read for a fake engine: the flags that shape what a router sees, the ones accepted
without effect, and vLLM's refusals."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.vllm_worker_args import smg_e2e_worker_args

from fake_engines import registry
from fake_engines.vllm_cli import (
    SHIM_PYTHON_ENV,
    VllmUsageError,
    build_parser,
    fake_argv,
    handover_argv,
    read_args,
)
from harness.vllm.cli import shim_folder, shim_text

pytestmark = pytest.mark.unit

SMG_E2E_PREFILL = smg_e2e_worker_args(41234)


def test_smg_e2e_prefill_command_line() -> None:
    v = read_args(SMG_E2E_PREFILL, "grpc_server", {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "39001"})
    assert (v.role, v.connector, v.port, v.bootstrap_port) == ("prefill", "mooncake", 41234, 39001)
    assert v.served_name == "meta-llama/Llama-3.1-8B-Instruct"
    argv = fake_argv(v, "prefill-0", 40000, "/tmp/r.jsonl")
    assert argv[argv.index("--grpc-port") + 1] == "41234" and "--http-port" not in argv
    assert argv[argv.index("--bootstrap-port") + 1] == "39001"


def test_nixl_decode_with_side_channel_and_abort_timeout() -> None:
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5601", "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "30"}
    v = read_args(
        ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'],
        "api_server",
        env,
    )
    assert (v.role, v.connector, v.side_channel_port, v.abort_timeout_s, v.port) == (
        "decode",
        "nixl",
        5601,
        30.0,
        8000,
    )
    argv = fake_argv(v, "decode-0", 1, "r")
    assert argv[argv.index("--nixl-port") + 1] == "5601" and "--bootstrap-port" not in argv


def test_serve_model_positional_served_name_and_dp_suffix() -> None:
    v = read_args(
        [
            "org/model",
            "--served-model-name",
            "m1",
            "m2",
            "--data-parallel-size",
            "2",
            "--data-parallel-rank",
            "1",
            "--kv-transfer-config",
            '{"kv_connector":"MooncakeConnector","kv_role":"kv_both","engine_id":"e7"}',
        ],
        "serve",
        {},
    )
    assert (v.model, v.served_name, v.dp_size, v.role) == ("org/model", "m1", 2, "both")
    assert v.engine_id == "e7_dp1"  # vLLM suffixes a pinned id per data-parallel rank


def test_default_host_binds_loopback_and_other_hosts_are_refused() -> None:
    v = read_args([], "api_server", {})
    assert v.host == "127.0.0.1" and "0.0.0.0" in v.notes[0]
    with pytest.raises(VllmUsageError, match="loopback"):
        read_args(["--host", "10.0.0.5"], "api_server", {})
    with pytest.raises(VllmUsageError, match="not a port"):
        read_args([], "api_server", {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "eighty"})


def test_flags_without_effect_are_accepted() -> None:
    read_args(
        ["--enforce-eager", "--trust-remote-code", "--max-model-len", "2048", "-tp", "2", "--dtype", "half"],
        "api_server",
        {},
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--kv-transfer-config", "{not json"], "cannot be converted to KVTransferConfig"),
        (["--kv-transfer-config", '{"kv_role": "kv_weird"}'], "Unsupported kv_role: kv_weird"),
        (["--kv-transfer-config", '{"kv_connector": "P2pNcclConnector"}'], "Unsupported kv_connector"),
        (["--kv-transfer-config", '{"kv_rol": "kv_producer"}'], "unexpected keyword"),
    ],
)
def test_refused_as_vllm_refuses(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser("api_server").parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: api_server.py") and "api_server.py: error: " in err and message in err


def test_registry_names_and_drops_dead_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.ENV, str(tmp_path / "engines.json"))
    a = registry.register("prefill", {"role": "prefill"})
    assert a["name"] == "prefill-0" and a["records"].endswith("records/prefill-0.jsonl")
    # Another process's entry, gone: dropped when the file is read.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    entries = json.loads((tmp_path / "engines.json").read_text())
    entries["prefill-9"] = {**entries["prefill-0"], "name": "prefill-9", "pid": int(dead.stdout)}
    (tmp_path / "engines.json").write_text(json.dumps(entries))
    assert set(registry.engines()) == {"prefill-0"}
    assert registry.register("prefill", {"role": "prefill"})["name"] == "prefill-1"
    registry.unregister("prefill-0", os.getpid())
    assert set(registry.engines()) == {"prefill-1"}
    (tmp_path / "engines.json").write_text("{cut")
    assert registry.engines() == {}


def test_the_shim_is_never_on_the_path_by_accident() -> None:
    spec = importlib.util.find_spec("vllm")
    assert spec is None or "vllm_shim" not in str(spec.origin)
    folder = shim_folder()
    assert (folder / "vllm" / "entrypoints" / "grpc_server.py").is_file()
    assert os.access(folder / "bin" / "vllm", os.X_OK)
    assert shim_text(False) == str(folder)
    assert f"PYTHONPATH={folder}" in shim_text(True)


@pytest.mark.parametrize(
    "entrypoint, module",
    [
        ("grpc_server", "vllm.entrypoints.grpc_server"),
        ("api_server", "vllm.entrypoints.openai.api_server"),
        ("serve", "vllm.entrypoints.cli.main"),
    ],
)
def test_handover_to_pdchaos_python(entrypoint: str, module: str) -> None:
    env = {SHIM_PYTHON_ENV: "/opt/pdchaos/bin/python"}
    assert handover_argv(["--port", "1"], entrypoint, env, "/opt/gateway/bin/python3") == [
        "/opt/pdchaos/bin/python", "-m", module, "--port", "1",
    ]
    # Unset, already that Python, or already handed over once: run here.
    assert handover_argv(["--port", "1"], entrypoint, {}, "/opt/gateway/bin/python3") is None
    assert handover_argv([], entrypoint, env, "/opt/pdchaos/bin/python") is None
    assert handover_argv([], entrypoint, {**env, "PDCHAOS_SHIM_HANDED_OVER": "1"}, "/x/python") is None


@pytest.mark.parametrize("how", ["module", "vllm serve"])
def test_a_gateways_python_hands_the_engine_to_pdchaos_python(how: str, tmp_path: Path) -> None:
    # smg's e2e suite runs `python3 -m vllm.entrypoints.grpc_server ...` with its own python3 (the one with
    # smg installed): the shim re-executes itself under $PDCHAOS_SHIM_PYTHON, the shim still on its path.
    stand_in = tmp_path / "python"
    stand_in.write_text('#!/bin/sh\necho "ARGS $*"\necho "PYTHONPATH $PYTHONPATH"\n')
    stand_in.chmod(0o755)
    folder = shim_folder()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PDCHAOS_SHIM_HANDED_OVER")}
    env[SHIM_PYTHON_ENV] = str(stand_in)
    if how == "module":
        argv = [sys.executable, "-m", "vllm.entrypoints.grpc_server", "--port", "7"]
        env["PYTHONPATH"] = str(folder)
        expected = "ARGS -m vllm.entrypoints.grpc_server --port 7"
    else:
        argv = [sys.executable, str(folder / "bin" / "vllm"), "serve", "m", "--port", "7"]
        expected = "ARGS -m vllm.entrypoints.cli.main serve m --port 7"
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == expected
    assert lines[1].split(" ", 1)[1].split(os.pathsep)[0] == str(folder)


def test_a_handover_to_a_missing_python_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PDCHAOS_SHIM_HANDED_OVER"}
    env.update({SHIM_PYTHON_ENV: str(tmp_path / "nope"), "PYTHONPATH": str(shim_folder())})
    argv = [sys.executable, "-m", "vllm.entrypoints.grpc_server"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not an executable" in r.stderr
