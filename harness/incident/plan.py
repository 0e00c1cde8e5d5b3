"""The plan of a replay, in the incident's own units (seconds of its timeline, its own settings): what the
scenario file is written from. Every element says where it came from: a `file:line` citation, or the name of
the default it fell back to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PlanFault:
    at_s: float
    action: str  # a harness.scenario action class name
    target: str
    params: dict[str, Any]
    cite: str
    # Set for a fault whose end the evidence shows (a heal, a respawn): its own step.
    label: str = ""


@dataclass(frozen=True)
class PlanSymptom:
    checker: str
    params: dict[str, Any]
    why: str
    cite: str


@dataclass
class Plan:
    gateway: str | None = None
    release: str | None = None
    prefills: list[str] = field(default_factory=list)
    decodes: list[str] = field(default_factory=list)
    connector: str = "mooncake"
    transport: str = "http"
    router: dict[str, float | int | None] = field(default_factory=dict)
    transfer_timeout_s: float = 480.0
    load_start: float = 0.0
    duration_s: float = 0.0
    concurrency: int = 3
    chat_fraction: float = 0.2
    deadline_s: float = 6.0
    # The slowest client request the logs show (0: none shown).
    longest_s: float = 0.0
    faults: list[PlanFault] = field(default_factory=list)
    symptoms: list[PlanSymptom] = field(default_factory=list)
    # element -> "file:line" or "default: why"
    sources: dict[str, str] = field(default_factory=dict)
    defaults: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    time_scale: float = 1.0

    @property
    def topology(self) -> str:
        return f"{len(self.prefills)}p{len(self.decodes)}d"

    def cite(self, element: str, source: str) -> None:
        self.sources[element] = source

    def default(self, element: str, why: str) -> None:
        self.sources[element] = f"default: {why}"
        self.defaults.append(f"{element}: {why}")
