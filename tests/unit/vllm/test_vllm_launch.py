"""How a real vLLM engine is started: command line, environment, KV transfer config (pure)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.topology import build_topology, parse_topology
from harness.vllm.launch import SERVED_MODEL, core_for, kv_transfer_config, vllm_argv, vllm_env


def _topo():
    return build_topology(parse_topology("1p1d"), "nixl", "http", list(range(20000, 20020)))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_argv_serves_the_fakes_model_name_on_the_engines_own_loopback_port() -> None:
    spec = _topo().engine("prefill-0")
    argv = vllm_argv(Path("/v/bin/python"), Path("/m"), spec, "prefill-0-g1-ab", {"kv_abort_timeout_s": 2.5})
    assert argv[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--served-model-name") == SERVED_MODEL == "pdchaos-fake"
    assert _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--port") == str(spec.http_port)
    assert _flag(argv, "--dtype") == "float32"  # bf16 picks the AMX kernel: SIGILL on pulled KV
    cfg = json.loads(_flag(argv, "--kv-transfer-config"))
    assert cfg["engine_id"] == "prefill-0-g1-ab"
    assert cfg["kv_connector"] == "NixlConnector"


def test_grpc_argv_starts_vllms_grpc_server_on_the_engines_grpc_port() -> None:
    topo = build_topology(parse_topology("1p1d"), "nixl", "grpc", list(range(20000, 20020)))
    spec = topo.engine("decode-0")
    argv = vllm_argv(Path("/v/bin/python"), Path("/m"), spec, "decode-0-g1-cd", {}, transport="grpc")
    assert argv[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.launchers.grpc_server"]
    assert _flag(argv, "--port") == str(spec.grpc_port) != str(spec.http_port)
    assert _flag(argv, "--served-model-name") == SERVED_MODEL
    assert json.loads(_flag(argv, "--kv-transfer-config"))["kv_role"] == "kv_consumer"


def test_kv_transfer_config_maps_the_fakes_engine_settings() -> None:
    p = kv_transfer_config("prefill", "p1", {"kv_abort_timeout_s": 2.5, "load_failure_policy": "recompute"})
    d = kv_transfer_config("decode", "d1", {})
    assert p["kv_role"] == "kv_producer" and d["kv_role"] == "kv_consumer"
    assert p["kv_connector_extra_config"]["kv_lease_duration"] == 3  # whole seconds, rounded up
    assert p["kv_load_failure_policy"] == "recompute"
    assert d["kv_load_failure_policy"] == "fail"  # vLLM's default
    assert kv_transfer_config("prefill", "x", {"kv_abort_timeout_s": 0.2})["kv_connector_extra_config"][
        "kv_lease_duration"] == 1


def test_env_pins_a_core_and_keeps_the_side_channel_on_loopback() -> None:
    spec = _topo().engine("decode-0")
    env = vllm_env(spec, 1)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(spec.nixl_port)
    assert env["HF_HUB_OFFLINE"] == "1"  # nothing downloaded
    assert vllm_env(spec, 0, side_channel_port=4242)["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "4242"


def test_engines_take_the_cores_in_turn() -> None:
    assert [core_for(i, 2) for i in range(4)] == [0, 1, 0, 1]
    assert core_for(5, 1) == 0
