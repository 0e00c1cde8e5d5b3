"""What the router under test was configured with, as the contract checkers need it.

The numbers come from the run's own record: what the router took, as its adapter says (a `router contract`
note: a gateway rounds to whole seconds, keeps its own breaker when none is asked, has no identity checks),
else what the session told it (`run_started.settings`). The rules a real gateway documents differently from
the reference router come from its adapter too (`rules`, see `harness.routers.base.RouterAdapter.contract`).
A rule no setting explains is held to the reference contract: a difference is a finding, not noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fake_engines.core import calls
from harness.contract.status_model import Thresholds
from harness.history import History

# The calls each transport's routers probe with (engine call names, CONTRACTS §1).
PROBE_CALLS = {"http": (calls.HEALTH,), "grpc": (calls.GRPC_HEALTH, calls.GRPC_HEALTH_V1)}
# Reads that tell a router a Mooncake prefill's engine id.
ID_READ_CALLS = (calls.SERVER_INFO, calls.BOOTSTRAP_QUERY)


@dataclass(frozen=True)
class RouterContract:
    """One router's contract parameters for one cell."""

    interval_s: float
    probe_timeout_s: float
    thresholds: Thresholds
    request_timeout_s: float
    transport: str
    connector: str
    identity_check_interval_s: float | None = None
    breaker_failures: int | None = None
    breaker_open_s: float = 60.0
    probe_calls: tuple[str, ...] = ()
    # At most this many probes and id reads open at once (`max_concurrent_health_checks`; None: no limit set).
    max_probes_in_flight: int | None = None
    # Whether the router's worker list shows the contract's statuses (pending/ready/not_ready/failed): a
    # gateway that shows only healthy or not is compared on routability alone.
    shows_statuses: bool = True
    # Rules the adapter documents (names -> values), e.g. {"prefill_max_tokens": 1}.
    rules: Mapping[str, Any] = field(default_factory=dict)

    @property
    def detection_bound_s(self) -> float:
        """Longest a worker that cannot be reached may stay Ready: `failure` failed probes, each up to one
        interval and one probe timeout after the last (a hanging probe holds the next one back)."""
        return self.thresholds.failure * (self.interval_s + self.probe_timeout_s) + self.interval_s

    @property
    def recovery_bound_s(self) -> float:
        """Longest a recovered worker may stay out: `success` probes after it serves again."""
        return self.thresholds.success * self.interval_s + self.probe_timeout_s


CONTRACT_NOTE = "router contract"


def told(history: History) -> dict[str, Any]:
    """What the router under test was configured with, as its adapter says it took it (the `router contract`
    note: whole seconds, its own defaults, its documented rules), else as the run told it."""
    settings = dict(history.settings)
    router = dict(settings.get("router") or {})
    for r in history.records:
        if r.get("type") == "note" and r.get("message") == CONTRACT_NOTE:
            effective = r.get("router_contract")
            if isinstance(effective, Mapping):
                rules = effective.get("rules")
                router.update({k: v for k, v in effective.items() if k != "rules"})
                settings.update({k: v for k, v in effective.items() if k in _TOP})
                if isinstance(rules, Mapping):
                    settings["contract"] = {**(settings.get("contract") or {}), **rules}
    settings["router"] = router
    return settings


# The numbers `run_started.settings` also carries at its top level.
_TOP = (
    "health_interval_s", "health_timeout_s", "failure_threshold", "success_threshold", "request_timeout_s",
)


def probe_slack_s(history: History) -> float:
    """How much longer than the run asked a recovered worker may stay out, because of the probe times the
    router took instead (a gateway takes whole seconds: 0.3 s probes run as 1 s ones). 0 when it took
    them as asked, or when either side is not known."""
    took = contract_of(history)
    settings = history.settings
    router = settings.get("router") or {}
    interval, timeout, success = (_number(k, settings, router)
                                  for k in ("health_interval_s", "health_timeout_s", "success_threshold"))
    if took is None or interval is None or timeout is None or success is None:
        return 0.0
    return max(0.0, round(took.recovery_bound_s - (success * interval + timeout), 3))


def _number(key: str, *where: Mapping[str, Any]) -> float | None:
    for src in where:
        value = src.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def contract_of(history: History) -> RouterContract | None:
    """The contract a history's router was held to (None: not enough settings to judge)."""
    run = history.run
    if not run:
        return None
    settings = told(history)
    router = settings.get("router") or {}

    interval = _number("health_interval_s", settings, router)
    timeout = _number("health_timeout_s", settings, router)
    failure = _number("failure_threshold", settings, router)
    success = _number("success_threshold", settings, router)
    request_timeout = _number("request_timeout_s", settings, router)
    if interval is None or timeout is None or failure is None or success is None or request_timeout is None:
        return None
    transport = str(run.get("transport") or "http")
    rules = dict(settings.get("contract") or {})
    breaker = router.get("circuit_breaker_failures")
    slots = router.get("max_concurrent_health_checks")
    identity = router.get("identity_check_interval_s")
    return RouterContract(
        interval_s=interval,
        probe_timeout_s=timeout,
        thresholds=Thresholds(int(failure), int(success)),
        request_timeout_s=request_timeout,
        transport=transport,
        connector=str(run.get("connector") or ""),
        identity_check_interval_s=float(identity) if isinstance(identity, int | float) else None,
        breaker_failures=int(breaker) if isinstance(breaker, int) and not isinstance(breaker, bool) else None,
        breaker_open_s=float(router.get("circuit_breaker_open_s") or 60.0),
        probe_calls=tuple(rules.get("probe_calls") or PROBE_CALLS.get(transport, ("health",))),
        max_probes_in_flight=slots if isinstance(slots, int) and not isinstance(slots, bool) else None,
        shows_statuses=bool(rules.get("shows_statuses", True)),
        rules=rules,
    )
