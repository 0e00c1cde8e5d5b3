"""What each health outcome tells: the router event records and counters of a probe, a re-read and an
identity check (CONTRACTS §2 `probe`, `status_change`, `metadata_read`, `engine_id`)."""

from __future__ import annotations

from .effects import METADATA_READS_TOTAL, PROBES_TOTAL, Effects
from .engine_id import EngineIdDecision
from .identity import IdentityVerdict
from .probes import ProbeResult
from .workers import Worker


def record_probe(out: Effects, worker: Worker, result: ProbeResult, duration_s: float) -> None:
    out.inc(PROBES_TOTAL, outcome="ok" if result.ok else "failed")
    out.event("probe", worker=worker.id, url=worker.spec.url, ok=result.ok, duration_s=round(duration_s, 6))
    if result.changed:
        out.event("status_change", worker=worker.id, url=worker.spec.url,
                  **{"from": result.status_before.value, "to": result.status_after.value})


def record_read(
    out: Effects, worker: Worker, decision: EngineIdDecision, read: str, duration_s: float,
    was_confirmed: bool,
) -> None:
    """A re-read's outcome; `read` is the raw read (complete|partial|error|timeout), `was_confirmed` the
    confirmation before it (an `engine_id` record is written only when the id or its confirmation moved)."""
    out.inc(METADATA_READS_TOTAL, outcome=decision.event_outcome)
    out.event("metadata_read", worker=worker.id, url=worker.spec.url, outcome=decision.event_outcome,
              read=read, duration_s=round(duration_s, 6))
    if decision.changed or decision.confirmed != was_confirmed:
        out.event("engine_id", worker=worker.id, url=worker.spec.url, old=decision.previous,
                  new=decision.engine_id, confirmed=decision.confirmed, reason=decision.reason)


def record_identity_failed(out: Effects, read: str) -> None:
    out.inc(METADATA_READS_TOTAL, outcome=f"identity_{read}")


def record_identity(
    out: Effects, worker: Worker, verdict: IdentityVerdict, before_id: str | None, before_confirmed: bool
) -> None:
    """A complete identity read, recorded after the verdict was applied to the worker."""
    rt = worker.runtime
    out.inc(METADATA_READS_TOTAL, outcome=f"identity_{verdict.kind.value}")
    if verdict.restarted or rt.engine_id != before_id:
        out.event("engine_id", worker=worker.id, url=worker.spec.url, old=before_id, new=rt.engine_id,
                  confirmed=rt.engine_id_confirmed, reason=f"identity check: {verdict.kind.value}")
    elif rt.engine_id_confirmed != before_confirmed:
        out.event("engine_id", worker=worker.id, url=worker.spec.url, old=before_id, new=before_id,
                  confirmed=rt.engine_id_confirmed, reason="identity check")
