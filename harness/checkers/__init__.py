"""Checkers: pure functions `(History, expectations) -> Verdict`, looked up by name.

Scenarios name checkers with parameters (`Expect("recovery", {"max_recovery_s": 5})`); `run_checks`
turns those into verdicts and always adds `run_complete` (a history without a normal `run_ended` cannot
pass). A checker that raises gives an `unknown` verdict naming the exception, never a crash of the report.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.checkers.availability import AvailabilityExpect, check_availability
from harness.checkers.balance import BalanceExpect, check_balance
from harness.checkers.breaker_contract import BreakerContractExpect, check_breaker_contract
from harness.checkers.call_deadlines import CallDeadlinesExpect, check_call_deadlines
from harness.checkers.error_answers import ErrorAnswersExpect, check_error_answers
from harness.checkers.handoff import (
    HandoffExpect,
    HandoffStrictExpect,
    NoLocalComputeExpect,
    check_handoff,
    check_no_local_compute,
)
from harness.checkers.handoff_params import HandoffParamsExpect, check_handoff_params
from harness.checkers.latency import LatencyExpect, check_latency
from harness.checkers.leg_shape import LegShapeExpect, check_leg_shape
from harness.checkers.legs import LegsOnceExpect, LegsSequencedExpect, check_legs_once, check_legs_sequenced
from harness.checkers.lost import NothingLostExpect, check_nothing_lost
from harness.checkers.metadata_reads import MetadataReadsExpect, check_metadata_reads
from harness.checkers.output import OutputExpect, check_output
from harness.checkers.probe_slots import ProbeSlotsExpect, check_probe_slots
from harness.checkers.probes import ProbeScheduleExpect, check_probe_schedule
from harness.checkers.prompt_503 import Prompt503Expect, check_prompt_503
from harness.checkers.recovery import RecoveryExpect, check_recovery
from harness.checkers.reported_id import ReportedEngineIdExpect, check_reported_engine_id
from harness.checkers.request_contract import RequestContractExpect, check_request_contract
from harness.checkers.router_events import RouterEventsExpect, check_router_events
from harness.checkers.router_metrics import RouterMetricsExpect, check_router_metrics
from harness.checkers.status_contract import StatusContractExpect, check_status_contract
from harness.checkers.transfer_timeout import TransferTimeoutExpect, check_transfer_timeout
from harness.checkers.worker_api import WorkerApiExpect, check_worker_api
from harness.history import History
from harness.verdict import Verdict

__all__ = [
    "CHECKERS",
    "CONTRACT_CHECKS",
    "DEFAULT_CHECKS",
    "AvailabilityExpect",
    "BalanceExpect",
    "BreakerContractExpect",
    "CallDeadlinesExpect",
    "CheckerError",
    "CheckerSpec",
    "ErrorAnswersExpect",
    "HandoffExpect",
    "HandoffParamsExpect",
    "HandoffStrictExpect",
    "LatencyExpect",
    "LegShapeExpect",
    "LegsOnceExpect",
    "LegsSequencedExpect",
    "MetadataReadsExpect",
    "NoLocalComputeExpect",
    "NothingLostExpect",
    "OutputExpect",
    "ProbeScheduleExpect",
    "ProbeSlotsExpect",
    "Prompt503Expect",
    "RecoveryExpect",
    "ReportedEngineIdExpect",
    "RequestContractExpect",
    "RouterEventsExpect",
    "RouterMetricsExpect",
    "StatusContractExpect",
    "TransferTimeoutExpect",
    "WorkerApiExpect",
    "check_availability",
    "check_balance",
    "check_breaker_contract",
    "check_call_deadlines",
    "check_error_answers",
    "check_handoff",
    "check_handoff_params",
    "check_latency",
    "check_leg_shape",
    "check_legs_once",
    "check_legs_sequenced",
    "check_metadata_reads",
    "check_no_local_compute",
    "check_nothing_lost",
    "check_output",
    "check_probe_schedule",
    "check_probe_slots",
    "check_prompt_503",
    "check_recovery",
    "check_reported_engine_id",
    "check_request_contract",
    "check_router_events",
    "check_router_metrics",
    "check_run_complete",
    "check_status_contract",
    "check_transfer_timeout",
    "check_worker_api",
    "make_params",
    "run_check",
    "run_checks",
    "validate_expect",
]

# `run_ended.reason` values that mean the run finished as planned.
NORMAL_END_REASONS = frozenset({"done", "completed", "complete", "finished", "ok", "end"})


class CheckerError(ValueError):
    """An unknown checker name or a bad parameter for one."""


@dataclass(frozen=True)
class CheckerSpec:
    name: str
    params: type[Any]
    fn: Callable[[History, Any], Verdict]
    # Evidence the checker judges from that a run collects only as it ends ("handoffs": the engines'
    # provenance records): a history without it gets unknown, never a fail for what was never collected.
    needs: tuple[str, ...] = ()


HANDOFFS = ("handoffs",)

CHECKERS: dict[str, CheckerSpec] = {
    spec.name: spec
    for spec in (
        CheckerSpec("recovery", RecoveryExpect, check_recovery, needs=HANDOFFS),
        CheckerSpec("handoff", HandoffExpect, check_handoff, needs=HANDOFFS),
        CheckerSpec("handoff_strict", HandoffStrictExpect, check_handoff, needs=HANDOFFS),
        CheckerSpec("metadata_reads", MetadataReadsExpect, check_metadata_reads),
        CheckerSpec("no_local_compute", NoLocalComputeExpect, check_no_local_compute, needs=HANDOFFS),
        CheckerSpec("transfer_timeout", TransferTimeoutExpect, check_transfer_timeout, needs=HANDOFFS),
        CheckerSpec("prompt_503", Prompt503Expect, check_prompt_503),
        CheckerSpec("probe_schedule", ProbeScheduleExpect, check_probe_schedule),
        CheckerSpec("availability", AvailabilityExpect, check_availability),
        CheckerSpec("nothing_lost", NothingLostExpect, check_nothing_lost),
        CheckerSpec("output", OutputExpect, check_output),
        CheckerSpec("balance", BalanceExpect, check_balance, needs=HANDOFFS),
        CheckerSpec("reported_engine_id", ReportedEngineIdExpect, check_reported_engine_id),
        CheckerSpec("legs_sequenced", LegsSequencedExpect, check_legs_sequenced, needs=HANDOFFS),
        CheckerSpec("legs_once", LegsOnceExpect, check_legs_once, needs=HANDOFFS),
        CheckerSpec("latency", LatencyExpect, check_latency),
        CheckerSpec("status_contract", StatusContractExpect, check_status_contract, needs=HANDOFFS),
        CheckerSpec("leg_shape", LegShapeExpect, check_leg_shape, needs=HANDOFFS),
        CheckerSpec("handoff_params", HandoffParamsExpect, check_handoff_params, needs=HANDOFFS),
        CheckerSpec("request_contract", RequestContractExpect, check_request_contract, needs=HANDOFFS),
        CheckerSpec("breaker_contract", BreakerContractExpect, check_breaker_contract, needs=HANDOFFS),
        CheckerSpec("router_events", RouterEventsExpect, check_router_events, needs=HANDOFFS),
        CheckerSpec("worker_api", WorkerApiExpect, check_worker_api),
        CheckerSpec("error_answers", ErrorAnswersExpect, check_error_answers),
        CheckerSpec("call_deadlines", CallDeadlinesExpect, check_call_deadlines),
        CheckerSpec("probe_slots", ProbeSlotsExpect, check_probe_slots),
        CheckerSpec("router_metrics", RouterMetricsExpect, check_router_metrics),
    )
}

# The router's contract on every leg, probe and worker status the engines saw: any router, any scenario.
CONTRACT_CHECKS: tuple[str, ...] = (
    "status_contract", "breaker_contract", "leg_shape", "handoff_params", "request_contract", "router_events",
    "error_answers", "call_deadlines", "probe_slots", "router_metrics",
)

# What every scenario gets when it names no checker.
DEFAULT_CHECKS: tuple[str, ...] = ("nothing_lost", "output", "handoff", "transfer_timeout", *CONTRACT_CHECKS)


def make_params(name: str, params: Mapping[str, Any] | None = None) -> Any:
    """The checker's expectation dataclass from a plain mapping (lists become tuples). Raises CheckerError."""
    spec = CHECKERS.get(name)
    if spec is None:
        raise CheckerError(f"unknown checker {name!r} (known: {', '.join(sorted(CHECKERS))})")
    known = {f.name for f in dataclasses.fields(spec.params)}
    given = dict(params or {})
    extra = sorted(set(given) - known)
    if extra:
        raise CheckerError(f"checker {name!r}: unknown parameter(s) {extra} (known: {sorted(known)})")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    hints = typing.get_type_hints(spec.params)
    for key, value in values.items():
        if value is None:
            # None is documented for some parameters ("None: measure only"): allowed where the type says so.
            if type(None) not in typing.get_args(hints[key]):
                raise CheckerError(f"checker {name!r}: {key} may not be None")
            continue
        default = getattr(spec.params(), key)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise CheckerError(f"checker {name!r}: {key} must be true/false, got {value!r}")
        number_wanted = isinstance(default, int | float) and not isinstance(default, bool)
        if number_wanted and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise CheckerError(f"checker {name!r}: {key} must be a number, got {value!r}")
    return spec.params(**values)


def validate_expect(name: str, params: Mapping[str, Any] | None = None) -> list[str]:
    """Problems with a checker name/parameters (empty: fine); for scenario validation."""
    try:
        make_params(name, params)
    except (CheckerError, TypeError) as e:
        return [str(e)]
    return []


def check_run_complete(history: History) -> Verdict:
    """Pass only when the history holds `run_started` and a normal `run_ended`."""
    name = "run_complete"
    numbers = {"records": history.record_count, "bad_records": history.bad_records, "end_t": history.end_t}
    if history.run is None:
        return Verdict.unknown_(name, "no run_started record: history missing or cut short", numbers)
    lines = getattr(history, "bad_lines", [])
    damage = [f"history line {n} unreadable" for n in lines[:25]]
    if history.ended is None:
        why = f"no run_ended record: run stopped at t={history.end_t:.2f}s"
        if history.bad_records:
            why += f"; {_damage(history.bad_records, lines)}"
        return Verdict.unknown_(name, why, numbers, damage)
    if history.bad_records:
        # Records were lost: any checker may have judged without them, so the run cannot pass.
        return Verdict.unknown_(name, _damage(history.bad_records, lines), numbers, damage)
    malformed = getattr(history, "malformed", 0)
    if malformed:
        # The engines' evidence is not of its documented shape: a checker may have read it wrong.
        return Verdict.unknown_(name, f"{malformed} engine record(s) not of the documented shape: evidence "
                                "damaged", {**numbers, "malformed": malformed}, history.malformed_examples)
    reason = str(history.ended.get("reason", ""))
    if reason not in NORMAL_END_REASONS:
        return Verdict.unknown_(name, f"run ended abnormally: {reason or 'no reason'}", numbers)
    return Verdict.ok(name, "", numbers)


def _damage(count: int, lines: list[int], shown: int = 10) -> str:
    where = ""
    if lines:
        head = ", ".join(str(n) for n in lines[:shown])
        more = f" and {len(lines) - shown} more" if len(lines) > shown else ""
        where = f" (line{'s' if len(lines) > 1 else ''} {head}{more})"
    return f"{count} damaged history record(s){where}: evidence lost"


def missing_evidence(history: History, needs: Iterable[str]) -> str | None:
    """Why the evidence a checker needs is not in the history (None: it is)."""
    if "handoffs" in needs and not history.handoffs_collected:
        return "the engines' handoff records were never collected (the run was cut short): cannot judge"
    return None


def run_check(history: History, name: str, params: Mapping[str, Any] | None = None) -> Verdict:
    """One checker by name. Bad parameters, missing evidence or a checker exception give `unknown` (the
    run cannot pass, and nothing is failed for what was never collected)."""
    try:
        exp = make_params(name, params)
    except (CheckerError, TypeError) as e:
        return Verdict.unknown_(name, f"bad expectation: {e}")
    missing = missing_evidence(history, CHECKERS[name].needs)
    if missing is not None:
        return Verdict.unknown_(name, missing)
    try:
        verdict = CHECKERS[name].fn(history, exp)
    except Exception as e:  # a checker bug must not lose the report
        return Verdict.unknown_(name, f"checker raised {type(e).__name__}: {e}")
    # Aliases (handoff_strict) share a function: the verdict carries the name the scenario asked for.
    return verdict if verdict.name == name else dataclasses.replace(verdict, name=name)


def run_checks(history: History, expects: Iterable[Any] | None = None) -> list[Verdict]:
    """Verdicts for `expects` (items: checker name, `(name, params)`, or objects with `.checker` and `.params`
    such as `harness.scenario.Expect`); None or empty: DEFAULT_CHECKS. `run_complete` is always first."""
    items: list[tuple[str, Mapping[str, Any] | None]] = []
    for e in list(expects or []) or list(DEFAULT_CHECKS):
        if isinstance(e, str):
            items.append((e, None))
        elif isinstance(e, tuple):
            items.append((str(e[0]), e[1] if len(e) > 1 else None))
        else:
            items.append((str(e.checker), getattr(e, "params", None)))
    return [check_run_complete(history), *(run_check(history, n, p) for n, p in items)]
