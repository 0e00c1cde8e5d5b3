"""The router's counters as a history keeps them: read from its Prometheus `/metrics` text (real time) or
from the increments the reference core hands out (simulated time), in one shape.

A snapshot is `{"scraped": [wall_start, wall_end], "counters": [{"name", "labels", "value"}, ...]}`: the
read began and ended within `scraped`, so each counter counts what the router did by some moment in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def snapshot(scraped: tuple[float, float], counters: Iterable[tuple[str, Mapping[str, str], float]]
             ) -> dict[str, Any]:
    rows = [{"name": name, "labels": dict(sorted(labels.items())), "value": value}
            for name, labels, value in counters]
    rows.sort(key=lambda r: (r["name"], sorted(r["labels"].items())))
    return {"scraped": [round(scraped[0], 6), round(scraped[1], 6)], "counters": rows}


def counters_of_text(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The counter samples of a Prometheus text exposition (each `NAME_total` sample of a counter family).
    ValueError when the text is not that format."""
    return [(sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text) if family.type == "counter"
            for sample in family.samples if sample.name.endswith("_total")]


class CounterTally:
    """Counters summed from increments (name and labels), as a Prometheus client library keeps them."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
        self._values[key] = self._values.get(key, 0.0) + amount

    def counters(self) -> list[tuple[str, dict[str, str], float]]:
        return [(name, dict(labels), value) for (name, labels), value in self._values.items()]
