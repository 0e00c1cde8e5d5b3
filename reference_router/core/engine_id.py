"""The KV engine id in force: when to re-read it after a probe, and what a read does to it (DESIGN §2).

Gate (`reread_due`): after a successful probe, re-read when the status before the probe was Failed or
NotReady, or Pending with no id, or Ready with the id not confirmed. Never for Draining or regular workers.
Which connectors: Mooncake (the router mints its id into every decode) and unknown (a gRPC worker whose
connector the read will tell). NIXL relays the prefill's own params, so its id is informational: not re-read;
connector none has no id at all.

Outcomes (`decide_engine_id`): an id -> store it, confirmed. A complete read without an id -> keep the
previous id (or none), confirmed, so an engine that never reports one is not re-read every probe (bug #5).
An error, partial read (server info failed) or timeout -> keep the previous id, unconfirmed, so the next
successful probe retries (bug #4). A read never clears a known id (bug #3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .bugs import PARTIAL_READ_CLEARS_ID, REREAD_EVERY_PROBE, REREAD_NO_RETRY, STALE_ENGINE_ID
from .config import HealthConfig
from .workers import Connector, Role, Status, Worker, parse_connector


class ReadOutcome(StrEnum):
    COMPLETE = "complete"
    PARTIAL = "partial"  # some metadata answered, server info did not
    ERROR = "error"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class MetadataRead:
    """What one metadata read (GetServerInfo, or a Mooncake bootstrap `/query`) returned.

    engine_id: None or "" when the engine reported none. connector: vLLM's name ("MooncakeConnector", "", ...)
    or ours, None when the read does not say. uptime_s feeds the identity check when present.
    """

    outcome: ReadOutcome
    engine_id: str | None = None
    connector: str | None = None
    kv_role: str | None = None
    dp_size: int | None = None
    uptime_s: float | None = None
    duration_s: float = 0.0


@dataclass(frozen=True)
class EngineIdDecision:
    """The id in force after a read. `event_outcome` is the router event's metadata_read outcome."""

    engine_id: str | None
    confirmed: bool
    previous: str | None
    event_outcome: str  # "id" | "no_id" | "error" | "timeout"
    reason: str

    @property
    def changed(self) -> bool:
        return self.engine_id != self.previous


def connector_has_id(role: Role, connector: Connector | None) -> bool:
    """Whether the router tracks this worker's engine id by re-reads: PD Mooncake, or PD connector unknown."""
    if role is Role.REGULAR:
        return False
    return connector is None or connector is Connector.MOONCAKE


def reread_due(
    status_before: Status,
    role: Role,
    connector: Connector | None,
    engine_id: str | None,
    confirmed: bool,
    bugs: frozenset[str] = frozenset(),
) -> bool:
    """Whether a successful probe should be followed by an engine-id re-read (pure)."""
    if status_before is Status.DRAINING or not connector_has_id(role, connector):
        return False
    if STALE_ENGINE_ID in bugs:
        return engine_id is None
    if status_before in (Status.FAILED, Status.NOT_READY):
        return True
    if status_before is Status.PENDING:
        return engine_id is None
    return not confirmed  # Ready


def reread_due_for(worker: Worker, status_before: Status, cfg: HealthConfig) -> bool:
    """reread_due() on a worker's current knowledge."""
    rt = worker.runtime
    return reread_due(
        status_before, worker.role, worker.connector, rt.engine_id, rt.engine_id_confirmed, cfg.bugs
    )


def decide_engine_id(
    previous: str | None, read: MetadataRead, bugs: frozenset[str] = frozenset()
) -> EngineIdDecision:
    """The id in force and its confirmation after one read (pure)."""
    if read.outcome is ReadOutcome.COMPLETE:
        if read.engine_id:
            return EngineIdDecision(read.engine_id, True, previous, "id", "read")
        if REREAD_EVERY_PROBE in bugs:
            return EngineIdDecision(previous, False, previous, "no_id", "no id: re-read (injected bug)")
        return EngineIdDecision(previous, True, previous, "no_id", "complete read without id: kept")
    if read.outcome is ReadOutcome.PARTIAL and PARTIAL_READ_CLEARS_ID in bugs:
        return EngineIdDecision(None, False, previous, "error", "partial read cleared the id (injected bug)")
    label = "timeout" if read.outcome is ReadOutcome.TIMEOUT else "error"
    if REREAD_NO_RETRY in bugs:
        return EngineIdDecision(previous, True, previous, label, f"{read.outcome.value} read: kept as final "
                                "(injected bug)")
    reason = f"{read.outcome.value} read: kept, retry next probe"
    return EngineIdDecision(previous, False, previous, label, reason)


def apply_metadata_read(
    worker: Worker, read: MetadataRead, now: float, cfg: HealthConfig
) -> EngineIdDecision:
    """Apply a read to the worker's runtime: the id decision, plus what a complete read teaches (connector and
    dp size of a worker configured without them, the uptime baseline for the identity check)."""
    rt = worker.runtime
    decision = decide_engine_id(rt.engine_id, read, cfg.bugs)
    rt.engine_id = decision.engine_id
    rt.engine_id_confirmed = decision.confirmed
    if rt.first_engine_id is None:
        rt.first_engine_id = decision.engine_id
    if read.outcome is ReadOutcome.COMPLETE:
        if read.connector is not None and worker.spec.connector is None:
            try:
                rt.learned_connector = parse_connector(read.connector)
            except ValueError:
                # A connector we do not drive: route without handoff params.
                rt.learned_connector = Connector.NONE
        if read.dp_size is not None and read.dp_size >= 1:
            rt.learned_dp_size = read.dp_size
        # A complete read is an identity observation too: it resets the identity check's clock and baseline.
        rt.last_identity_check_at = now
        if read.uptime_s is not None:
            rt.last_uptime_s = read.uptime_s
    return decision


_DP_SUFFIX = re.compile(r"_dp\d+$")


def parse_bootstrap_query(payload: Any) -> MetadataRead:
    """`{"<dp_rank>": {"engine_id": ..., "worker_addr": {...}}}` -> the base engine id and the dp size."""
    if not isinstance(payload, dict) or not payload:
        return MetadataRead(ReadOutcome.ERROR)
    ranks = {k: v for k, v in payload.items() if isinstance(v, dict)}
    first = ranks.get("0") or (next(iter(ranks.values())) if ranks else None)
    if first is None:
        return MetadataRead(ReadOutcome.ERROR)
    engine_id = first.get("engine_id")
    if not isinstance(engine_id, str) or not engine_id:
        return MetadataRead(ReadOutcome.COMPLETE, engine_id=None, dp_size=len(ranks))
    if len(ranks) > 1:
        engine_id = _DP_SUFFIX.sub("", engine_id)  # the router ranks it again per request
    return MetadataRead(ReadOutcome.COMPLETE, engine_id=engine_id, dp_size=len(ranks))
