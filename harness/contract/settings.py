"""What the router under test was configured with, as the contract checkers need it.

The numbers come from the run's own record (`run_started.settings`: what the session told the router), and
the rules a real gateway documents differently from the reference router come from its adapter
(`run_started.settings.contract`, see `harness.routers.base.RouterAdapter.contract`). A rule no setting
explains is held to the reference contract: a difference is a finding, not noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fake_engines.core import calls
from harness.contract.status_model import Thresholds

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


def contract_of(run: Mapping[str, Any] | None) -> RouterContract | None:
    """The contract a history's `run_started` record describes (None: not enough settings to judge)."""
    if not run:
        return None
    settings = run.get("settings") or {}
    router = settings.get("router") or {}

    def num(key: str, *where: Mapping[str, Any]) -> float | None:
        for src in where:
            value = src.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
        return None

    interval = num("health_interval_s", settings, router)
    timeout = num("health_timeout_s", settings, router)
    failure = num("failure_threshold", settings, router)
    success = num("success_threshold", settings, router)
    request_timeout = num("request_timeout_s", settings, router)
    if None in (interval, timeout, failure, success, request_timeout):
        return None
    assert interval is not None and timeout is not None and failure is not None and success is not None
    assert request_timeout is not None
    transport = str(run.get("transport") or "http")
    rules = dict(settings.get("contract") or {})
    breaker = router.get("circuit_breaker_failures")
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
        shows_statuses=bool(rules.get("shows_statuses", True)),
        rules=rules,
    )
