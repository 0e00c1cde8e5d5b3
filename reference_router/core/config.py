"""Health-loop settings: state machine, engine-id gate, identity check and planner."""

from __future__ import annotations

from dataclasses import dataclass, field

from .bugs import validate_bugs


@dataclass(frozen=True)
class HealthConfig:
    """Gateway-typical defaults; tests pass small values (interval 0.2-1 s, thresholds 1-2).

    identity_check_interval_s: how often a Ready PD Mooncake worker's identity (engine id, uptime) is
    read although its probes pass. It bounds how long a restart that no probe sees keeps the dead id in
    force: detection within identity_check_interval_s + probe_timeout_s (while the planner has free
    slots). The default (30 s, half the probe interval) is one read per worker per 30 s, far below a read
    per probe.
    """

    failure_threshold: int = 3
    success_threshold: int = 2
    probe_timeout_s: float = 5.0
    interval_s: float = 60.0
    max_probes_in_flight: int = 128
    metadata_timeout_s: float = 10.0
    identity_check_interval_s: float = 30.0
    bugs: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if self.success_threshold < 1:
            raise ValueError("success_threshold must be >= 1")
        for name in ("probe_timeout_s", "interval_s", "metadata_timeout_s", "identity_check_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.max_probes_in_flight < 1:
            raise ValueError("max_probes_in_flight must be >= 1")
        object.__setattr__(self, "bugs", validate_bugs(self.bugs))

    @property
    def pending_probe_cap(self) -> int:
        """Probes while Pending after which the worker is Failed (10 x failure_threshold)."""
        return 10 * self.failure_threshold

    @property
    def not_ready_failure_cap(self) -> int:
        """Consecutive failures (counted from Ready) after which a NotReady worker is Failed."""
        return 3 * self.failure_threshold

    @property
    def probe_slot_s(self) -> float:
        """Longest a probe may hold its slot: the probe plus its engine-id re-read, each bounded by the probe
        timeout. Past this the planner frees the slot whatever the probe task is doing."""
        return 2 * self.probe_timeout_s
