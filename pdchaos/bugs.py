"""The shape of a bug switch: a known outage bug that a test run can put back into the reference router or the
fake engines (off by default). The router's switches live in `reference_router.core.bugs`, the engines' in
`fake_engines.core.bugs`; `harness.zoo` runs the suite once per switch and shows which scenario catches it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Side = Literal["router", "engine"]
TRANSPORTS: tuple[str, ...] = ("http", "grpc")
CONNECTORS: tuple[str, ...] = ("mooncake", "nixl")


@dataclass(frozen=True)
class BugSwitch:
    """One switch. `zoo` is the DESIGN.md §6 entry ("zoo-1".."zoo-14") or "field" for a bug seen in a released
    gateway or engine; `reference` is where it is documented in public; `symptom` is what a user of the broken
    system sees. `transports`/`connectors`: where the bug can occur at all (the zoo matrix must catch it on
    each of them)."""

    name: str
    side: Side
    zoo: str
    reference: str
    symptom: str
    transports: tuple[str, ...] = TRANSPORTS
    connectors: tuple[str, ...] = CONNECTORS

    def occurs_in(self, connector: str, transport: str) -> bool:
        """Whether the bug can occur at all in a cell of this connector and transport."""
        return transport in self.transports and connector in self.connectors

    def line(self) -> str:
        where = f"{'/'.join(self.transports)}; {'/'.join(self.connectors)}"
        head = f"{self.name}  [{self.side}, {self.zoo}; {where}]"
        return f"{head}\n    {self.symptom}\n    see: {self.reference}"


def catalog(switches: Iterable[BugSwitch]) -> dict[str, BugSwitch]:
    """Name -> switch; a name given twice is a programming error."""
    out: dict[str, BugSwitch] = {}
    for s in switches:
        if s.name in out:
            raise ValueError(f"bug switch {s.name!r} declared twice")
        out[s.name] = s
    return out


def validate_names(names: Iterable[str], known: Mapping[str, BugSwitch], what: str) -> frozenset[str]:
    """The names as a frozenset; ValueError naming the unknown ones and listing the known."""
    bugs = frozenset(names)
    unknown = sorted(bugs - set(known))
    if unknown:
        raise ValueError(f"unknown bug name(s) {unknown} for the {what}; known: {sorted(known)}")
    return bugs


def list_text(switches: Iterable[BugSwitch]) -> str:
    """What `--list-bugs` prints: one block per switch."""
    return "\n".join(s.line() for s in sorted(switches, key=lambda s: s.name))
