"""Routers under test: the adapter interface (`base`), the reference router, a command template, and real
gateway releases (`gateways`). `make_router_adapter(spec)` turns a `--router` value into an adapter."""

from __future__ import annotations

from harness.routers.base import READY_PREFIX, RouterAdapter, RouterAdapterError, RouterLaunch
from harness.routers.command import PLACEHOLDERS, CommandRouter
from harness.routers.gateways import gateway_name, make_gateway_adapter
from harness.routers.reference import ReferenceRouter

__all__ = [
    "PLACEHOLDERS", "READY_PREFIX", "CommandRouter", "ReferenceRouter", "RouterAdapter", "RouterAdapterError",
    "RouterLaunch", "make_router_adapter",
]


def make_router_adapter(spec: str | RouterAdapter) -> RouterAdapter:
    """`reference` (default), `cmd:<template>`; an adapter passes through."""
    if isinstance(spec, RouterAdapter):
        return spec
    if spec in ("reference", "", "pdchaos-router"):
        return ReferenceRouter()
    if spec.startswith("cmd:"):
        return CommandRouter(spec[4:])
    # A gateway (smg, smg==1.12.0, vllm-router): its adapter may install that release on first use.
    if gateway_name(spec) is not None:
        return make_gateway_adapter(spec)
    raise RouterAdapterError(
        f"unknown router {spec!r}: use 'reference', 'smg[==X.Y.Z]', 'vllm-router[==X.Y.Z]' "
        "or 'cmd:<command template>'"
    )
