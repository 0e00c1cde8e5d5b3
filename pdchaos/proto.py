"""The vLLM gRPC contract, as shipped by the ``smg-grpc-proto`` package.

One import point so every module (router client, fake engine servicer, tests) uses the same generated stubs.
"""

from __future__ import annotations

from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

SERVICE_NAME = "vllm.grpc.engine.VllmEngine"

__all__ = ["SERVICE_NAME", "common_pb2", "vllm_engine_pb2", "vllm_engine_pb2_grpc"]
