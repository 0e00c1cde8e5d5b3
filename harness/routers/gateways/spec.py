"""Router specs as the user writes them: `reference`, `cmd:<template>`, `smg`, `smg==1.12.0`, `smg==latest`,
`vllm-router==0.1.17`, and named variants of a gateway's configuration (`smg-flags==1.13.0`: the same
release, workers from flags only). Pure parsing; nothing is looked up or installed here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.routers.base import RouterAdapterError


@dataclass(frozen=True)
class Gateway:
    """A real gateway known to pdchaos: its PyPI package, its executable and the env var naming a binary."""

    package: str
    executable: str
    env_var: str
    adapter: str
    # The spec's own name when it is a variant of the package (`smg-flags`); empty: the package's name.
    name: str = ""

    @property
    def spec_name(self) -> str:
        return self.name or self.package


GATEWAYS: dict[str, Gateway] = {
    "smg": Gateway("smg", "smg", "PDCHAOS_SMG", "smg"),
    # The same releases, run with `--prefill/--decode` only (no KV transfer facts over HTTP).
    "smg-flags": Gateway("smg", "smg", "PDCHAOS_SMG", "smg-flags", name="smg-flags"),
    # The same releases over HTTP, with an operator registering a restarted Mooncake prefill again.
    "smg-operator": Gateway("smg", "smg", "PDCHAOS_SMG", "smg-operator", name="smg-operator"),
    "vllm-router": Gateway("vllm-router", "vllm-router", "PDCHAOS_VLLM_ROUTER", "vllm-router"),
}
ALIASES = {"vllm_router": "vllm-router"}

LATEST = "latest"
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+)?(\.dev[0-9]+)?$")


def is_release_version(text: str) -> bool:
    """A package release as pip names it (1.13.0, 0.9.0rc1, 2.0.post1): what `NAME==VERSION` may pin."""
    return bool(_VERSION.match(text))


@dataclass(frozen=True)
class RouterSpec:
    """`kind` is `reference`, `cmd` or `gateway`. `version` None: whatever binary is found (env var, PATH,
    newest cached release, else the newest available); `latest`: the newest release on the index."""

    kind: str
    raw: str
    gateway: Gateway | None = None
    version: str | None = None
    template: str | None = None

    @property
    def label(self) -> str:
        """Short, file-name friendly name of the router in reports (`smg-1.12.0`, `vllm-router`, `cmd`)."""
        if self.kind == "gateway" and self.gateway is not None:
            return self.gateway.spec_name + (f"-{self.version}" if self.version else "")
        return self.kind


def gateway_name(spec: str) -> str | None:
    """The gateway a spec names (`smg==1.2.0` -> `smg`), or None for anything else."""
    base = re.split(r"[=<>!~@\s]", spec.strip(), maxsplit=1)[0].lower()
    base = ALIASES.get(base, base)
    return base if base in GATEWAYS else None


def parse_router_spec(spec: str) -> RouterSpec:
    s = spec.strip()
    if s in ("", "reference", "pdchaos-router"):
        return RouterSpec("reference", s or "reference")
    if s.startswith("cmd:"):
        if not s[4:].strip():
            raise RouterAdapterError("empty router command template after 'cmd:'")
        return RouterSpec("cmd", s, template=s[4:])
    name = gateway_name(s)
    if name is None:
        known = ", ".join(GATEWAYS)
        raise RouterAdapterError(
            f"unknown router {spec!r}: use 'reference', a gateway ({known}, optionally ==VERSION or "
            "==latest) or 'cmd:<command template>'"
        )
    version: str | None = None
    if "==" in s:
        version = s.split("==", 1)[1].strip().lower()
        if not version:
            raise RouterAdapterError(f"router {spec!r}: empty version after '=='")
        if version != LATEST and not is_release_version(version):
            raise RouterAdapterError(f"router {spec!r}: {version!r} is not a release version (e.g. 1.13.0)")
    elif any(c in s for c in "<>=!~@ "):
        raise RouterAdapterError(f"router {spec!r}: only NAME or NAME==VERSION is understood")
    return RouterSpec("gateway", s, gateway=GATEWAYS[name], version=version)


def version_key(version: str) -> tuple[tuple[int, str], ...]:
    """Sort key for release versions: numeric parts compare as numbers (1.10.0 after 1.9.0)."""
    parts: list[tuple[int, str]] = []
    for piece in re.split(r"[.+-]", version):
        m = re.match(r"^(\d+)(.*)$", piece)
        if m:
            parts.append((int(m.group(1)), ""))
            if m.group(2):
                parts.append((-1, m.group(2)))
        else:
            parts.append((-1, piece))
    return tuple(parts)
