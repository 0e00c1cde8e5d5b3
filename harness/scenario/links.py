"""Network links and the faults on them, as data (no sockets, no clocks).

A link is one engine's connection that a fault can sit on:
- `serve`: router -> the engine's serving port (HTTP or gRPC, the cell's transport);
- `bootstrap`: decode -> a Mooncake prefill's bootstrap server (`/query`);
- `side_channel`: decode -> a prefill's KV side channel (Mooncake worker port, NIXL handshake/pull port).

A scenario puts faults on exactly the links its timeline's network actions name (`links_in`). Each fault is
expressed as Toxiproxy toxics (`toxics_for`) or as the link being disabled: the real world sends them to a
Toxiproxy, the simulated world feeds them to its link model. History kinds: `link_down`, `link_timeout`,
`link_latency`, `link_reset`, `link_bandwidth`, `link_flap`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from harness.topology import CONNECTORS

LINKS: tuple[str, ...] = ("serve", "bootstrap", "side_channel")
STREAMS: tuple[str, ...] = ("upstream", "downstream")
PARTITION_MODES: tuple[str, ...] = ("down", "timeout")


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Partition:
    """Cut the link. `down`: connects refused, open connections dropped; `timeout`: connects accepted, nothing
    ever gets through (a wedge)."""

    target: str
    link: str = "serve"
    mode: str = "down"

    def problems(self, scenario: Any = None) -> list[str]:
        out = _link_problems(self, scenario)
        if self.mode not in PARTITION_MODES:
            out.append(f"partition mode {self.mode!r} (known: {', '.join(PARTITION_MODES)})")
        return out


@dataclass(frozen=True)
class LinkLatency:
    """Delay data on the link by `latency_ms` (+/- `jitter_ms`), in one direction (`stream`)."""

    target: str
    link: str = "serve"
    latency_ms: int = 100
    jitter_ms: int = 0
    stream: str = "downstream"

    def problems(self, scenario: Any = None) -> list[str]:
        out = _link_problems(self, scenario) + _stream_problems(self.stream)
        if self.latency_ms < 0 or self.jitter_ms < 0:
            out.append("latency_ms and jitter_ms must be >= 0")
        if self.jitter_ms > self.latency_ms:
            out.append("jitter_ms must not exceed latency_ms")
        return out


@dataclass(frozen=True)
class LinkReset:
    """Reset connections (TCP RST) `timeout_ms` after the first data in `stream` arrives; `downstream` hits
    a connection while its answer (e.g. a KV pull) is on the way back."""

    target: str
    link: str = "side_channel"
    timeout_ms: int = 0
    stream: str = "downstream"

    def problems(self, scenario: Any = None) -> list[str]:
        out = _link_problems(self, scenario) + _stream_problems(self.stream)
        if self.timeout_ms < 0:
            out.append("timeout_ms must be >= 0")
        return out


@dataclass(frozen=True)
class LinkBandwidth:
    """Cap the link at `rate_kb_s` KB/s (1 KB = 1000 bytes) in `stream`."""

    target: str
    link: str = "side_channel"
    rate_kb_s: int = 64
    stream: str = "downstream"

    def problems(self, scenario: Any = None) -> list[str]:
        out = _link_problems(self, scenario) + _stream_problems(self.stream)
        if self.rate_kb_s <= 0:
            out.append("rate_kb_s must be > 0 (use Partition to cut a link)")
        return out


@dataclass(frozen=True)
class LinkFlap:
    """Take the link down for `down_s`, up for `up_s`, `cycles` times (ends up); healed when the last cycle
    ends, or earlier by a `HealLink`."""

    target: str
    link: str = "serve"
    down_s: float = 0.5
    up_s: float = 0.5
    cycles: int = 3

    def problems(self, scenario: Any = None) -> list[str]:
        out = _link_problems(self, scenario)
        if self.down_s <= 0 or self.up_s <= 0:
            out.append("down_s and up_s must be > 0")
        if self.cycles < 1:
            out.append("cycles must be >= 1")
        return out


@dataclass(frozen=True)
class HealLink:
    """End every network fault on the target's link (`link` None: on all its links): toxics removed, link
    enabled, flapping stopped."""

    target: str
    link: str | None = None

    def problems(self, scenario: Any = None) -> list[str]:
        if self.link is None:
            return []
        return _link_problems(self, scenario)


LinkFault = Partition | LinkLatency | LinkReset | LinkBandwidth | LinkFlap
NetworkAction = LinkFault | HealLink
NETWORK_ACTIONS: tuple[type, ...] = (Partition, LinkLatency, LinkReset, LinkBandwidth, LinkFlap, HealLink)


def is_network_action(action: object) -> TypeGuard[NetworkAction]:
    return isinstance(action, NETWORK_ACTIONS)


def fault_kind(action: LinkFault) -> str:
    """The history `kind` of a link fault."""
    if isinstance(action, Partition):
        return f"link_{action.mode}"
    if isinstance(action, LinkLatency):
        return "link_latency"
    if isinstance(action, LinkReset):
        return "link_reset"
    if isinstance(action, LinkBandwidth):
        return "link_bandwidth"
    if isinstance(action, LinkFlap):
        return "link_flap"
    raise TypeError(f"not a link fault: {action!r}")


def fault_params(action: NetworkAction) -> dict[str, Any]:
    """The action's fields except the target, for `fault_applied.params`."""
    return {k: v for k, v in vars(action).items() if k != "target"}


# ---------------------------------------------------------------- toxics


@dataclass(frozen=True)
class ToxicPlan:
    """One toxic as the Toxiproxy API takes it."""

    name: str
    type: str
    stream: str
    attributes: Mapping[str, int] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "stream": self.stream, "toxicity": 1.0,
                "attributes": dict(self.attributes)}


def toxics_for(action: LinkFault, fault_id: str) -> list[ToxicPlan]:
    """The toxics a fault adds (named after its step, so a heal removes exactly them); none for faults that
    disable the link instead (down, flap). A timeout partition holds both directions: the request never
    reaches the engine, and nothing (not even its close) comes back."""
    name = f"pdchaos-{fault_id}"
    if isinstance(action, Partition):
        if action.mode == "down":
            return []
        return [ToxicPlan(name, "timeout", "downstream", {"timeout": 0}),
                ToxicPlan(f"{name}-up", "timeout", "upstream", {"timeout": 0})]
    if isinstance(action, LinkLatency):
        return [ToxicPlan(name, "latency", action.stream, {"latency": action.latency_ms,
                                                           "jitter": action.jitter_ms})]
    if isinstance(action, LinkReset):
        return [ToxicPlan(name, "reset_peer", action.stream, {"timeout": action.timeout_ms})]
    if isinstance(action, LinkBandwidth):
        return [ToxicPlan(name, "bandwidth", action.stream, {"rate": action.rate_kb_s})]
    if isinstance(action, LinkFlap):
        return []
    raise TypeError(f"not a link fault: {action!r}")


def flap_schedule(down_s: float, up_s: float, cycles: int) -> list[tuple[float, bool]]:
    """(offset from the start, enabled) toggles of a flapping link: down at 0, up at down_s, ... ends up."""
    out: list[tuple[float, bool]] = []
    t = 0.0
    for _ in range(cycles):
        out.append((t, False))
        t += down_s
        out.append((t, True))
        t += up_s
    return out


# ---------------------------------------------------------------- which links exist


@dataclass(frozen=True, order=True)
class LinkRef:
    engine: str
    link: str

    @property
    def label(self) -> str:
        return f"{self.engine}.{self.link}"


def link_applies(engine: str, link: str, connector: str) -> str | None:
    """None when `engine` has `link` under `connector`, else why not."""
    role = engine.split("-", 1)[0]
    if link not in LINKS:
        return f"unknown link {link!r} (known: {', '.join(LINKS)})"
    if link == "bootstrap" and not (role == "prefill" and connector == "mooncake"):
        return f"link 'bootstrap' is a Mooncake prefill's ({engine} under {connector} has none)"
    if link == "side_channel" and role != "prefill":
        return f"link 'side_channel' is a prefill's KV side channel ({engine} is not a prefill)"
    return None


def _link_problems(action: NetworkAction, scenario: Any) -> list[str]:
    link = action.link
    if link not in LINKS:
        return [f"unknown link {link!r} (known: {', '.join(LINKS)})"]
    connectors = tuple(getattr(scenario, "connectors", ()) or CONNECTORS)
    whys = (link_applies(action.target, link, c) for c in connectors)
    return [why for why in whys if why is not None]


def _stream_problems(stream: str) -> list[str]:
    return [] if stream in STREAMS else [f"stream {stream!r} (known: {', '.join(STREAMS)})"]


def links_in(timeline: Iterable[Any], connector: str | None = None) -> list[LinkRef]:
    """The links a timeline's network actions name, in first-mention order (a heal of all links names none).
    With `connector`, links that do not exist under it are left out."""
    seen: dict[LinkRef, None] = {}
    for step in timeline:
        a = getattr(step, "action", step)
        if not is_network_action(a) or a.link is None:
            continue
        if connector is not None and link_applies(a.target, a.link, connector) is not None:
            continue
        seen.setdefault(LinkRef(a.target, a.link), None)
    return list(seen)
