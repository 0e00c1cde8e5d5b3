"""Real gateways under test (smg, vllm-router): router specs, cached release venvs, adapters.

`make_gateway_adapter("smg==1.12.0")` installs that release on first use (see `cache`) and returns its
adapter; `harness.routers.make_router_adapter` hands gateway specs here. `pdchaos matrix`
(harness.matrix) runs scenarios against several routers and writes the comparison report.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from harness.routers.gateways.adapters import ADAPTERS, GatewayAdapter, SmgRouter, VllmRouter
from harness.routers.gateways.cache import ReleaseCache, Resolved
from harness.routers.gateways.spec import GATEWAYS, RouterSpec, gateway_name, parse_router_spec

__all__ = [
    "GATEWAYS", "GatewayAdapter", "ReleaseCache", "Resolved", "RouterSpec", "SmgRouter", "VllmRouter",
    "gateway_name", "installed_version", "make_gateway_adapter", "parse_router_spec",
]

# One resolution per spec and process: the runner builds an adapter per cell, the index is asked once.
_RESOLVED: dict[tuple[str, str], Resolved] = {}


def installed_version(executable: str, package: str) -> str | None:
    """The release of a binary, from the `*.dist-info` of the environment it lives in."""
    exe = Path(executable).resolve()
    dist = package.replace("-", "_").lower()
    for lib in exe.parent.parent.glob("lib/python*/site-packages"):
        for d in lib.glob("*.dist-info"):
            m = re.match(rf"^{re.escape(dist)}-([^-]+)\.dist-info$", d.name, re.IGNORECASE)
            if m:
                return m.group(1)
    return None


def make_gateway_adapter(
    spec: str | RouterSpec, cache: ReleaseCache | None = None, extra_args: Sequence[str] = ()
) -> GatewayAdapter:
    rs = spec if isinstance(spec, RouterSpec) else parse_router_spec(spec)
    if rs.gateway is None:
        raise ValueError(f"{rs.raw!r} is not a gateway spec")
    c = cache if cache is not None else ReleaseCache()
    key = (str(c.root), rs.raw)
    resolved = _RESOLVED.get(key)
    if resolved is None:
        resolved = c.resolve(rs)
        _RESOLVED[key] = resolved
    version = resolved.version or installed_version(resolved.executable, rs.gateway.package)
    return ADAPTERS[rs.gateway.adapter](resolved.executable, version=version, extra_args=extra_args)
