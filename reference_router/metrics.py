"""Prometheus text exposition, written by hand (no client library in the dependency set)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

LabelKey = tuple[tuple[str, str], ...]

_HELP: dict[str, tuple[str, str]] = {
    "pdchaos_router_requests_total": ("counter", "Client requests answered, by endpoint and HTTP status."),
    "pdchaos_router_dispatches_total": ("counter", "PD dispatches, by connector and outcome."),
    "pdchaos_router_leg_retries_total": (
        "counter", "Legs that never reached their worker, by leg and outcome (retried, or why not)."
    ),
    "pdchaos_router_mint_skipped_total": ("counter", "Mooncake handoffs not minted, by reason."),
    "pdchaos_router_breaker_transitions_total": (
        "counter", "Circuit breaker state changes, by the state entered (closed, open, half_open)."
    ),
    "pdchaos_router_probes_total": ("counter", "Health probes, by outcome."),
    "pdchaos_router_metadata_reads_total": ("counter", "Worker metadata reads, by outcome."),
    "pdchaos_router_workers": ("gauge", "Registered workers, by role and status."),
    "pdchaos_router_probes_in_flight": ("gauge", "Health probes holding a concurrency slot now."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: LabelKey) -> str:
    if not key:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in key) + "}"


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[str, dict[LabelKey, float]] = defaultdict(lambda: defaultdict(float))
        self._gauge_sources: dict[str, Callable[[], Iterable[tuple[dict[str, str], float]]]] = {}

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        self._counters[name][key] += amount

    def value(self, name: str, **labels: str) -> float:
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        return self._counters.get(name, {}).get(key, 0.0)

    def gauge(self, name: str, source: Callable[[], Iterable[tuple[dict[str, str], float]]]) -> None:
        """Gauges are read at scrape time from live state, so they can never drift from it."""
        self._gauge_sources[name] = source

    def render(self) -> str:
        lines: list[str] = []
        names = sorted(set(self._counters) | set(self._gauge_sources) | set(_HELP))
        for name in names:
            kind, help_text = _HELP.get(name, ("untyped", name))
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            if name in self._gauge_sources:
                for labels, val in self._gauge_sources[name]():
                    key = tuple(sorted(labels.items()))
                    lines.append(f"{name}{_labels(key)} {val:g}")
            for key, val in sorted(self._counters.get(name, {}).items()):
                lines.append(f"{name}{_labels(key)} {val:g}")
        return "\n".join(lines) + "\n"
