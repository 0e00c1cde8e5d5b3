"""What makes two cells "the same cell" across runs: the key a sweep and its baseline are lined up by."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

KEY_FIELDS = ("scenario", "topology", "connector", "transport", "router", "world", "settings", "engines")


@dataclass(frozen=True, order=True)
class CellKey:
    """A cell's coordinates. `router` is the label the sweep gave the router (its spec by default; a plain
    run folder's cells carry the router's name), `engines` the engine backend (`local`: fake engines on
    loopback)."""

    scenario: str
    topology: str
    connector: str
    transport: str
    router: str = "reference"
    world: str = "real"
    settings: str = "scaled"
    engines: str = "local"

    @property
    def cell(self) -> str:
        return f"{self.topology}-{self.connector}-{self.transport}"

    @property
    def group(self) -> str:
        """The run folder a sweep puts this cell in: one per router x world x settings x engines."""
        raw = f"{self.router}_{self.world}_{self.settings}_{self.engines}"
        return re.sub(r"[^A-Za-z0-9_.-]", "-", raw)

    @property
    def label(self) -> str:
        return f"{self.scenario} {self.cell} [{self.router}, {self.world}, {self.settings}, {self.engines}]"

    @property
    def axes(self) -> dict[str, str]:
        """The values an [[exclude]] entry matches against (singular axis names)."""
        return {"scenario": self.scenario, "topology": self.topology, "connector": self.connector,
                "transport": self.transport, "router": self.router, "world": self.world,
                "settings": self.settings, "engine": self.engines}

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CellKey:
        return cls(**{k: str(d[k]) for k in KEY_FIELDS if d.get(k) is not None})
