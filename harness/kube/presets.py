"""What an engine pod runs: the shipped presets (`preset = "..."` in an `[engines.NAME]` table).

The vLLM presets follow vLLM's connector guides and llm-d's P/D deployment: NIXL engines take
`--kv-transfer-config {"kv_connector": "NixlConnector", "kv_role": "kv_both"}` and advertise their side
channel on the pod IP (`VLLM_NIXL_SIDE_CHANNEL_HOST` from `status.podIP`, port `VLLM_NIXL_SIDE_CHANNEL_PORT`,
5600 by default), with UCX over CUDA IPC / copy and TCP; Mooncake engines take `MooncakeConnector` with
`kv_producer` (prefill, bootstrap server on `VLLM_MOONCAKE_BOOTSTRAP_PORT`, 8998) or `kv_consumer`
(decode). One GPU per engine, a memory-backed /dev/shm, readiness on `/health`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from harness.topology import TRANSPORTS
from pdchaos import __version__

VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
HARNESS_IMAGE = f"pdchaos:{__version__}"
TOXIPROXY_IMAGE = "ghcr.io/shopify/toxiproxy:2.12.0"
SMALL_MODEL = "Qwen/Qwen3-0.6B"

# Container ports (the same in every pod: each engine has its own pod IP and Service).
HTTP_PORT = 8000
GRPC_PORT = 8001
CONTROL_PORT = 8002
BOOTSTRAP_PORT = 8998
NIXL_PORT = 5600
TOXIPROXY_API_PORT = 8474
# A proxied link listens on its real port plus this.
PROXY_OFFSET = 10000


@dataclass(frozen=True)
class EnginePreset:
    name: str
    kind: Literal["vllm", "fake"]
    description: str
    image: str
    model: str = SMALL_MODEL
    gpus: int = 1
    cpu: str = "8"
    memory: str = "32Gi"
    shm: str | None = "8Gi"
    # The connector the preset is built for (None: the cell's own).
    connector: str | None = None
    transports: tuple[str, ...] = ("http",)
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


PRESETS: dict[str, EnginePreset] = {
    p.name: p
    for p in (
        EnginePreset(
            "vllm-nixl-gpu", "vllm",
            "vLLM engines with NixlConnector (kv_both), one GPU each, side channel on the pod IP",
            VLLM_IMAGE, connector="nixl",
            env={"UCX_TLS": "cuda_ipc,cuda_copy,tcp", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(NIXL_PORT)},
            args=("--enforce-eager", "--max-model-len", "8192"),
        ),
        EnginePreset(
            "vllm-mooncake-gpu", "vllm",
            "vLLM engines with MooncakeConnector (prefill kv_producer, decode kv_consumer), one GPU each",
            VLLM_IMAGE, connector="mooncake",
            env={"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(BOOTSTRAP_PORT)},
            args=("--enforce-eager", "--max-model-len", "8192"),
        ),
        EnginePreset(
            "pdchaos-fake", "fake",
            "pdchaos's fake engines as pods (no GPU): every fault, and handoff provenance records",
            HARNESS_IMAGE, model="pdchaos-fake", gpus=0, cpu="1", memory="1Gi", shm=None,
            transports=TRANSPORTS,
        ),
    )
}
