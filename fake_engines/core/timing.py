"""Timing model: how long a fake engine takes, as pure functions of its config."""

from __future__ import annotations

from dataclasses import dataclass

# A new engine process takes this long to serve, as an interpreter start and the imports took on the fakes
# (measured ~0.5 s). Both worlds keep it: the simulated engine waits it out, and an engine forked from the
# harness's preloaded fork server (which would serve in milliseconds) sleeps it before it starts, so a crash
# followed by a respawn leaves the same outage in both worlds.
PROCESS_START_S = 0.5
# A restart in place lets the work its servers have in progress finish within this long before cutting it
# (gRPC's stop grace, aiohttp's shutdown timeout); both worlds keep it.
SHUTDOWN_GRACE_S = 0.2


@dataclass(frozen=True)
class TimingModel:
    """Time to first token grows with prompt length; each further token costs a fixed inter-token latency."""

    ttft_ms: float = 20.0
    ttft_per_token_ms: float = 0.05
    itl_ms: float = 5.0

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "ttft_per_token_ms", "itl_ms"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    def ttft_s(self, n_prompt_tokens: int) -> float:
        """Seconds from request arrival to the first output token (the prefill's cost)."""
        return (self.ttft_ms + self.ttft_per_token_ms * max(0, n_prompt_tokens)) / 1000.0

    def itl_s(self) -> float:
        """Seconds between two consecutive output tokens."""
        return self.itl_ms / 1000.0
