"""What one fake engine is configured to be (CONTRACTS.md §1 flags), as a plain value.

It lives in the core because the request path's decisions read it; the command line that fills it is
`fake_engines.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Role = Literal["prefill", "decode", "both"]
Connector = Literal["mooncake", "nixl", "none"]
LoadFailure = Literal["fail", "recompute"]


@dataclass(frozen=True)
class EngineConfig:
    role: Role = "both"
    name: str = "engine"
    connector: Connector = "none"
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    control_port: int = 0
    control_token: str | None = None
    bootstrap_port: int = 0
    nixl_port: int = 0
    # Side-channel port told to decodes instead of the bound one (a proxy in front of it); 0 = the bound one.
    advertise_side_channel_port: int = 0
    engine_id: str | None = None
    dp_size: int = 1
    model: str = "pdchaos-fake"
    transfer_timeout_s: float = 540.0
    kv_abort_timeout_s: float = 480.0
    handshake_timeout_s: float = 5.0
    load_failure_policy: LoadFailure = "fail"
    load_time_s: float = 0.0
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    seed: int | None = None
    records: str | None = None
    log_level: str = "WARNING"
    # Test-only engine bug switches (`fake_engines.core.bugs`); empty = the correct engine.
    bugs: frozenset[str] = field(default_factory=frozenset)

    def with_(self, **changes: object) -> EngineConfig:
        return replace(self, **changes)  # type: ignore[arg-type]
