"""What a core step asks its shell to record: router event records, metric increments, warnings.

The core never writes them itself, so the asyncio server and a simulated router record the same things for
the same decisions. Events carry the fields of CONTRACTS §2 without `ts`: the shell stamps its own clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Counters the core increments (the shell's Metrics describes them).
PROBES_TOTAL = "pdchaos_router_probes_total"
METADATA_READS_TOTAL = "pdchaos_router_metadata_reads_total"
DISPATCHES_TOTAL = "pdchaos_router_dispatches_total"
LEG_RETRIES_TOTAL = "pdchaos_router_leg_retries_total"
MINT_SKIPPED_TOTAL = "pdchaos_router_mint_skipped_total"
BREAKER_TRANSITIONS_TOTAL = "pdchaos_router_breaker_transitions_total"


@dataclass(frozen=True)
class RouterEvent:
    """One event record: its `type` and the other fields, in the order they are written."""

    type: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class MetricInc:
    name: str
    labels: Mapping[str, str]
    amount: float = 1.0


@dataclass
class Effects:
    """Everything one step produced, in the order it happened (per kind)."""

    events: list[RouterEvent] = field(default_factory=list)
    metrics: list[MetricInc] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def event(self, type_: str, **fields: Any) -> None:
        self.events.append(RouterEvent(type_, fields))

    def inc(self, name: str, **labels: str) -> None:
        self.metrics.append(MetricInc(name, labels))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def extend(self, other: Effects) -> None:
        self.events.extend(other.events)
        self.metrics.extend(other.metrics)
        self.warnings.extend(other.warnings)

    def of_type(self, type_: str) -> list[Mapping[str, Any]]:
        """The fields of the events of one type (tests and simulated routers read them this way)."""
        return [e.fields for e in self.events if e.type == type_]
