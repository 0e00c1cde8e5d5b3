"""What a dispatch tells: the `dispatch`, `mint_skipped` and `worker_suspect` records of CONTRACTS §2 and
their counters."""

from __future__ import annotations

from typing import Any

from .connectors import HandoffPlan
from .effects import DISPATCHES_TOTAL, LEG_RETRIES_TOTAL, MINT_SKIPPED_TOTAL, Effects
from .workers import Worker


def pd_record(
    request_id: str, prefill: Worker, decode: Worker, plan: HandoffPlan, retried_from: list[str]
) -> dict[str, Any]:
    """The dispatch record of a PD request, before its outcome; `retried_from` only when a prefill leg ran
    again elsewhere."""
    record: dict[str, Any] = {
        "request_id": request_id, "prefill": prefill.id, "decode": decode.id,
        "prefill_url": prefill.spec.url, "decode_url": decode.spec.url,
        "connector": plan.connector.value if plan.connector else None,
        "transfer_id": plan.transfer_id, "remote_engine_id": plan.remote_engine_id,
    }
    if retried_from:
        record["retried_from"] = list(retried_from)
    return record


def regular_record(request_id: str, worker: Worker) -> dict[str, Any]:
    return {"request_id": request_id, "prefill": None, "decode": worker.id, "decode_url": worker.spec.url,
            "connector": None, "transfer_id": None, "remote_engine_id": None}


def record_dispatch(
    out: Effects, record: dict[str, Any], status: int, outcome: str, error: str | None = None
) -> None:
    out.inc(DISPATCHES_TOTAL, connector=str(record.get("connector")), outcome=outcome)
    out.event("dispatch", **record, status=status, outcome=outcome, error=error)


def record_mint_skipped(out: Effects, reason: str, request_id: str, prefill: Worker) -> None:
    out.inc(MINT_SKIPPED_TOTAL, reason=reason)
    out.event("mint_skipped", reason=reason, request_id=request_id, worker=prefill.id, url=prefill.spec.url)
    out.warn(f"no KV handoff for {request_id} via {prefill.id}: {reason} (decode recomputes)")


def record_suspect(out: Effects, worker: Worker, error: str) -> None:
    out.event("worker_suspect", worker=worker.id, url=worker.spec.url, error=error)


def record_leg_retry(out: Effects, outcome: str) -> None:
    out.inc(LEG_RETRIES_TOTAL, leg="prefill", outcome=outcome)
