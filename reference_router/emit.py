"""Records what a core step produced: its events into the EventLog (which stamps them), its counters into
Metrics, its warnings into the log."""

from __future__ import annotations

import logging

from .core import Effects
from .events import EventLog
from .metrics import Metrics


def emit(effects: Effects, events: EventLog, metrics: Metrics, log: logging.Logger) -> None:
    for message in effects.warnings:
        log.warning("%s", message)
    for inc in effects.metrics:
        metrics.inc(inc.name, inc.amount, **inc.labels)
    for event in effects.events:
        events.emit(event.type, **event.fields)
