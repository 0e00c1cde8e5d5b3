"""Helpers for tests and the harness: engines started in this process, always closed on exit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fake_engines.config import EngineConfig
from fake_engines.runtime import EngineHandle, start_engine
from pdchaos.ports import free_ports


def loopback_config(
    role: str = "both", connector: str = "none", *, grpc: bool = True, control: bool = True, **overrides: Any
) -> EngineConfig:
    """A config with free HTTP (and gRPC / control) ports and zero timing."""
    http_port, grpc_port, control_port = free_ports(3)
    fields: dict[str, Any] = {
        "role": role,
        "connector": connector,
        "http_port": http_port,
        "grpc_port": grpc_port if grpc else 0,
        "control_port": control_port if control else 0,
        "ttft_ms": 0.0,
        "itl_ms": 0.0,
    }
    fields.update(overrides)
    return EngineConfig(**fields)


@asynccontextmanager
async def running_engine(config: EngineConfig) -> AsyncIterator[EngineHandle]:
    """Start an engine in process; it is closed on every path out of the block."""
    handle = await start_engine(config)
    try:
        yield handle
    finally:
        await handle.close()
