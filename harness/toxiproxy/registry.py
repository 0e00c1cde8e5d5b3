"""Proxies and their toxics as the API sees them (sans-IO): validation and bookkeeping only.

Binding listeners and moving bytes is the asyncio shell's job (service.py); this module decides what
a request means and whether it is allowed, and answers Toxiproxy's errors when it is not.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from harness.toxiproxy.errors import (
    PROXY_EXISTS,
    PROXY_NOT_FOUND,
    TOXIC_EXISTS,
    TOXIC_NOT_FOUND,
    ApiError,
    bad_body,
    missing_field,
)
from harness.toxiproxy.toxics import STREAMS, ToxicSpec, check_name, parse_new_toxic, update_toxic

LOOPBACK = "127.0.0.1"
_WILDCARDS = {"", "0.0.0.0", "::", "localhost"}


def split_hostport(value: object, what: str) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise bad_body(f"{what} must be host:port")
    host, _, port_text = value.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise bad_body(f"{what} port is not a number") from None
    if not 0 <= port <= 65535:
        raise bad_body(f"{what} port out of range")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen(value: object) -> tuple[str, int]:
    """Where to listen. This server only ever binds loopback: wildcards and localhost mean 127.0.0.1."""
    host, port = split_hostport(value, "listen")
    if host in _WILDCARDS:
        return LOOPBACK, port
    if not is_loopback(host) or ":" in host:
        raise bad_body("listen must be a loopback IPv4 address (this server binds loopback only)")
    return host, port


def parse_upstream(value: object) -> tuple[str, int]:
    """Where to connect. Only loopback upstreams: the harness never sends traffic off this machine."""
    host, port = split_hostport(value, "upstream")
    if not is_loopback(host):
        raise bad_body("upstream must be a loopback address")
    if port == 0:
        raise bad_body("upstream port must not be 0")
    return host, port


def format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class ProxySpec:
    name: str
    listen: str
    upstream: str
    enabled: bool = True
    toxics: list[ToxicSpec] = field(default_factory=list)

    def toxics_for(self, stream: str) -> list[ToxicSpec]:
        return [t for t in self.toxics if t.stream == stream]

    def toxics_json(self) -> list[dict[str, object]]:
        # Toxiproxy lists the upstream chain first, each in the order the toxics were added.
        return [t.to_json() for stream in STREAMS for t in self.toxics_for(stream)]

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics_json(),
        }


def _enabled(value: object, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_body("enabled must be a boolean")
    return value


def parse_proxy(body: object, where: str = "") -> ProxySpec:
    """A new proxy from a create/populate entry; listen defaults to a free loopback port."""
    if not isinstance(body, dict):
        raise bad_body("expected a JSON object")
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise missing_field("name" + where)
    check_name(name, "proxy")
    upstream = body.get("upstream")
    if not isinstance(upstream, str) or not upstream:
        raise missing_field("upstream" + where)
    parse_upstream(upstream)
    listen = body.get("listen") or f"{LOOPBACK}:0"
    host, port = parse_listen(listen)
    return ProxySpec(name, format_addr(host, port), upstream, _enabled(body.get("enabled"), True))


@dataclass(frozen=True)
class ProxyUpdate:
    listen: str
    upstream: str
    enabled: bool


class ProxyRegistry:
    def __init__(self) -> None:
        self.proxies: dict[str, ProxySpec] = {}
        self._version = 0

    def _next_version(self) -> int:
        self._version += 1
        return self._version

    # --- proxies -------------------------------------------------------------------------------
    def get(self, name: str) -> ProxySpec:
        try:
            return self.proxies[name]
        except KeyError:
            raise ApiError(404, PROXY_NOT_FOUND) from None

    def check_new(self, body: object) -> ProxySpec:
        spec = parse_proxy(body)
        if spec.name in self.proxies:
            raise ApiError(409, PROXY_EXISTS)
        return spec

    def add(self, spec: ProxySpec) -> None:
        if spec.name in self.proxies:
            raise ApiError(409, PROXY_EXISTS)
        self.proxies[spec.name] = spec

    def remove(self, name: str) -> ProxySpec:
        spec = self.get(name)
        del self.proxies[name]
        return spec

    def plan_update(self, name: str, body: object) -> ProxyUpdate:
        """What `POST/PATCH /proxies/{name}` asks for; fields not given keep their values."""
        spec = self.get(name)
        if not isinstance(body, dict):
            raise bad_body("expected a JSON object")
        listen = spec.listen
        if body.get("listen"):
            listen = format_addr(*parse_listen(body["listen"]))
        upstream = spec.upstream
        if body.get("upstream"):
            parse_upstream(body["upstream"])
            upstream = body["upstream"]
        return ProxyUpdate(listen, upstream, _enabled(body.get("enabled"), spec.enabled))

    def plan_populate(self, body: object) -> list[ProxySpec]:
        """Every entry of a populate body, all validated before anything changes."""
        if not isinstance(body, list):
            raise bad_body("expected a JSON array of proxies")
        specs = [parse_proxy(entry, f" at proxy {i + 1}") for i, entry in enumerate(body)]
        names = [s.name for s in specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise bad_body(f"duplicate proxy name {duplicates[0]!r}")
        return specs

    # --- toxics --------------------------------------------------------------------------------
    def _find(self, spec: ProxySpec, toxic: str) -> int:
        for index, existing in enumerate(spec.toxics):
            if existing.name == toxic:
                return index
        raise ApiError(404, TOXIC_NOT_FOUND)

    def get_toxic(self, name: str, toxic: str) -> ToxicSpec:
        spec = self.get(name)
        return spec.toxics[self._find(spec, toxic)]

    def add_toxic(self, name: str, body: object) -> ToxicSpec:
        spec = self.get(name)
        toxic = parse_new_toxic(body, self._next_version())
        if any(t.name == toxic.name for t in spec.toxics):
            raise ApiError(409, TOXIC_EXISTS)
        spec.toxics.append(toxic)
        return toxic

    def update_toxic(self, name: str, toxic: str, body: object) -> ToxicSpec:
        spec = self.get(name)
        index = self._find(spec, toxic)
        updated = update_toxic(spec.toxics[index], body, self._next_version())
        spec.toxics[index] = updated
        return updated

    def remove_toxic(self, name: str, toxic: str) -> None:
        spec = self.get(name)
        del spec.toxics[self._find(spec, toxic)]
