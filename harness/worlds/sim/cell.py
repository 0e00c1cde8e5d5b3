"""What a simulated engine or router sees of its cell: the clock, the network, the topology and the other
engines. A protocol, so the models need not import the world that builds the cell (`world.SimCell`)."""

from __future__ import annotations

from typing import Any, Protocol

import simpy

from harness.topology import Topology
from harness.worlds.sim.network import SimNetwork


class CellView(Protocol):
    env: simpy.Environment
    net: SimNetwork
    topology: Topology
    seed: int

    def wall(self, now: float) -> float:
        """The virtual wall clock at simulated time `now`."""
        ...

    def new_side_port(self, engine: str) -> int:
        """A side-channel port for this start of `engine` (never one used before)."""
        ...

    def add_engine_record(self, record: dict[str, Any]) -> None: ...

    def engine_at_url(self, url: str) -> Any:
        """The SimEngine serving `url`, or None."""
        ...

    def engine_at_port(self, port: int) -> Any:
        """The SimEngine listening on `port`, or None."""
        ...
