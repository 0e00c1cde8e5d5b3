"""Topologies: how many prefill and decode engines (or regular engines, for a router in regular mode), which
connector, which transport, on which loopback ports.

`parse_topology("2p1d")` (or `"2r"`) is pure; `allocate(...)` picks free loopback ports (the only I/O here) so
the runner can start every engine and the router on known addresses, and restart an engine on the same ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pdchaos.ports import LOOPBACK, free_ports

Connector = Literal["mooncake", "nixl"]
Transport = Literal["http", "grpc"]
Role = Literal["prefill", "decode", "regular"]

CONNECTORS: tuple[Connector, ...] = ("mooncake", "nixl")
TRANSPORTS: tuple[Transport, ...] = ("http", "grpc")

_SHAPE = re.compile(r"^([1-9][0-9]?)p([1-9][0-9]?)d$")
_REGULAR_SHAPE = re.compile(r"^([1-9][0-9]?)r$")
# Each engine gets http, grpc, control, bootstrap, nixl ports (bootstrap unused by NIXL and by decodes, but a
# fixed-size block keeps allocation simple and the numbers predictable).
PORTS_PER_ENGINE = 5


@dataclass(frozen=True)
class Shape:
    """The shape of a topology, e.g. 2 prefills and 1 decode for `2p1d`, or 2 regular engines for `2r` (a
    router in regular mode: each request runs whole on one engine, no handoff)."""

    prefills: int
    decodes: int
    regulars: int = 0

    @property
    def name(self) -> str:
        if self.regulars:
            return f"{self.regulars}r"
        return f"{self.prefills}p{self.decodes}d"

    @property
    def pd(self) -> bool:
        return not self.regulars

    @property
    def engines(self) -> int:
        return self.prefills + self.decodes + self.regulars

    def counts(self) -> tuple[tuple[Role, int], ...]:
        return (("prefill", self.prefills), ("decode", self.decodes), ("regular", self.regulars))

    def engine_names(self) -> list[str]:
        return [f"{role}-{i}" for role, count in self.counts() for i in range(count)]


def parse_topology(text: str) -> Shape:
    """`NpMd` with 1 <= N, M <= 99 (`1p1d`, `1p2d`, `2p1d`, ...), or `Nr` (N regular engines, the router in
    regular mode); anything else is a ValueError."""
    key = text.strip().lower() if isinstance(text, str) else ""
    m = _SHAPE.match(key)
    if m is not None:
        return Shape(int(m.group(1)), int(m.group(2)))
    r = _REGULAR_SHAPE.match(key)
    if r is not None:
        return Shape(0, 0, int(r.group(1)))
    raise ValueError(
        f"bad topology {text!r}: expected NpMd with N prefills and M decodes, e.g. 1p1d, 1p2d, 2p1d, or Nr "
        "with N regular engines (a router in regular mode), e.g. 2r"
    )


def check_connector(text: str) -> Connector:
    if text not in CONNECTORS:
        raise ValueError(f"bad connector {text!r}: expected one of {', '.join(CONNECTORS)}")
    return text  # type: ignore[return-value]


def check_transport(text: str) -> Transport:
    if text not in TRANSPORTS:
        raise ValueError(f"bad transport {text!r}: expected one of {', '.join(TRANSPORTS)}")
    return text  # type: ignore[return-value]


@dataclass(frozen=True)
class EngineSpec:
    """One engine's identity and addresses; the same across restarts (only side-channel ports move)."""

    name: str
    role: Role
    index: int
    http_port: int
    grpc_port: int
    control_port: int
    bootstrap_port: int
    nixl_port: int
    host: str = LOOPBACK

    def url(self, transport: Transport) -> str:
        port = self.http_port if transport == "http" else self.grpc_port
        return f"{transport}://{self.host}:{port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def control_url(self) -> str:
        return f"http://{self.host}:{self.control_port}"

    @property
    def engine_role(self) -> str:
        """The role the engine runs as: a regular engine is vLLM in both roles (`kv_both`)."""
        return "both" if self.role == "regular" else self.role

    def engine_connector(self, connector: str) -> str:
        """The KV connector the engine runs with: a regular engine has none (each request runs whole)."""
        return "none" if self.role == "regular" else connector

    def serving_port(self, transport: Transport) -> int:
        return self.http_port if transport == "http" else self.grpc_port


@dataclass(frozen=True)
class Topology:
    """A shape made concrete: engines with ports, a router port, a connector and a transport."""

    shape: Shape
    connector: Connector
    transport: Transport
    engines: tuple[EngineSpec, ...]
    router_port: int
    extra_ports: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.shape.name

    @property
    def prefills(self) -> list[EngineSpec]:
        return [e for e in self.engines if e.role == "prefill"]

    @property
    def decodes(self) -> list[EngineSpec]:
        return [e for e in self.engines if e.role == "decode"]

    @property
    def regulars(self) -> list[EngineSpec]:
        return [e for e in self.engines if e.role == "regular"]

    @property
    def router_url(self) -> str:
        return f"http://{LOOPBACK}:{self.router_port}"

    def engine(self, name: str) -> EngineSpec:
        for e in self.engines:
            if e.name == name:
                return e
        raise KeyError(f"no engine {name!r} in topology {self.name} (have: {', '.join(self.names())})")

    def names(self) -> list[str]:
        return [e.name for e in self.engines]

    def url_of(self, name: str) -> str:
        return self.engine(name).url(self.transport)

    def name_of_url(self, url: str) -> str | None:
        """The engine behind a worker URL as a router reports it (trailing slashes and scheme case
        ignored)."""
        want = _norm_url(url)
        for e in self.engines:
            if _norm_url(e.url(self.transport)) == want or _norm_url(e.http_url) == want:
                return e.name
        return None


def registration_body(spec: EngineSpec, connector: str, transport: Transport) -> dict[str, Any]:
    """The worker API body that registers `spec`'s engine with a router (POST /workers)."""
    body: dict[str, Any] = {"url": spec.url(transport), "role": spec.role}
    if spec.role != "regular":
        body["connector"] = connector
    if spec.role == "prefill" and connector == "mooncake":
        body["bootstrap_port"] = spec.bootstrap_port
    return body


def _norm_url(url: str) -> str:
    u = url.strip().rstrip("/").lower()
    return u.replace("localhost", LOOPBACK)


def build_topology(
    shape: Shape | str,
    connector: str,
    transport: str,
    ports: list[int],
) -> Topology:
    """Lay out engines on the given ports (pure: `allocate` supplies real free ones, tests may pass any)."""
    sh = parse_topology(shape) if isinstance(shape, str) else shape
    conn = check_connector(connector)
    tr = check_transport(transport)
    need = sh.engines * PORTS_PER_ENGINE + 1
    if len(ports) < need or len(set(ports)) != len(ports):
        raise ValueError(f"topology {sh.name} needs {need} distinct ports, got {len(ports)}")
    engines: list[EngineSpec] = []
    it = iter(ports)
    for role, count in sh.counts():
        for i in range(count):
            engines.append(
                EngineSpec(
                    name=f"{role}-{i}",
                    role=role,
                    index=i,
                    http_port=next(it),
                    grpc_port=next(it),
                    control_port=next(it),
                    bootstrap_port=next(it),
                    nixl_port=next(it),
                )
            )
    return Topology(sh, conn, tr, tuple(engines), router_port=next(it))


def allocate(shape: Shape | str, connector: str, transport: str, extra: int = 0) -> Topology:
    """A topology on free loopback ports; `extra` more ports are kept in `extra_ports` (e.g. router
    metrics)."""
    sh = parse_topology(shape) if isinstance(shape, str) else shape
    need = sh.engines * PORTS_PER_ENGINE + 1
    ports = free_ports(need + extra)
    topo = build_topology(sh, connector, transport, ports[:need])
    if extra:
        extras = {f"extra-{i}": p for i, p in enumerate(ports[need:])}
        topo = Topology(topo.shape, topo.connector, topo.transport, topo.engines, topo.router_port, extras)
    return topo
