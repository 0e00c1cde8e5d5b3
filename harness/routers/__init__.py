"""Routers under test: the adapter interface (`base`), the reference router, a command template, and real
gateway releases (`gateways`). `make_router_adapter(spec)` turns a `--router` value into an adapter."""

from __future__ import annotations

from typing import Any

from harness.routers.base import READY_PREFIX, RouterAdapter, RouterAdapterError, RouterLaunch
from harness.routers.command import PLACEHOLDERS, CommandRouter
from harness.routers.gateways import gateway_name, make_gateway_adapter
from harness.routers.profiles import PREFIX as PROFILE_PREFIX
from harness.routers.profiles import ProfileRouter, profile_named
from harness.routers.reference import ReferenceRouter

__all__ = [
    "PLACEHOLDERS", "READY_PREFIX", "CommandRouter", "ProfileRouter", "ReferenceRouter", "RouterAdapter",
    "RouterAdapterError", "RouterLaunch", "make_router_adapter", "router_profile",
]


def make_router_adapter(spec: str | RouterAdapter) -> RouterAdapter:
    """`reference` (default), `profile:NAME`, `cmd:<template>`, a gateway release; an adapter passes
    through."""
    if isinstance(spec, RouterAdapter):
        return spec
    if spec in ("reference", "", "pdchaos-router"):
        return ReferenceRouter()
    if spec.startswith(PROFILE_PREFIX):
        try:
            return ProfileRouter(profile_named(spec))
        except ValueError as e:
            raise RouterAdapterError(str(e)) from None
    if spec.startswith("cmd:"):
        return CommandRouter(spec[4:])
    # A gateway (smg, smg==1.12.0, vllm-router): its adapter may install that release on first use.
    if gateway_name(spec) is not None:
        return make_gateway_adapter(spec)
    raise RouterAdapterError(
        f"unknown router {spec!r}: use 'reference', 'profile:NAME', 'smg[==X.Y.Z]', 'smg-flags[==X.Y.Z]', "
        "'smg-operator[==X.Y.Z]', 'vllm-router[==X.Y.Z]' or 'cmd:<command template>'"
    )


def router_profile(spec: str | RouterAdapter) -> Any:
    """The gateway profile a router spec names (None: not a profile); RouterAdapterError for an unknown
    one."""
    if isinstance(spec, ProfileRouter):
        return spec.profile
    if isinstance(spec, str) and spec.startswith(PROFILE_PREFIX):
        try:
            return profile_named(spec)
        except ValueError as e:
            raise RouterAdapterError(str(e)) from None
    return None
