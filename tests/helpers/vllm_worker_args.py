"""vLLM's command line for a PD worker, as smg's e2e suite builds it (e2e_test/infra/worker.py)."""

from __future__ import annotations

import json


def smg_e2e_worker_args(
    port: int, kv_role: str = "kv_producer", connector: str = "MooncakeConnector"
) -> list[str]:
    return [
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1", "--port", str(port),
        "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9",
        "--kv-transfer-config", json.dumps({"kv_connector": connector, "kv_role": kv_role}),
    ]
