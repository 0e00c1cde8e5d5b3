"""Where a request meets the protocol faults on the event loop: a wedge parks it, latency delays it.

The decisions (is the surface wedged, how much latency) are the core's `FaultState.gate_delay`; this only
waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fake_engines.core.fault_state import FaultState


class FaultGate:
    """Every server awaits `gate(surface)` before it answers. Wraps the engine's pure FaultState."""

    def __init__(self, state: FaultState) -> None:
        self.state = state
        self._released = asyncio.Event()

    def apply_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self.state.apply_spec(spec)

    def clear(self, kind: str) -> dict[str, Any]:
        changed = self.state.clear(kind)
        self.wake()
        return changed

    def clear_all(self) -> dict[str, Any]:
        changed = self.state.clear_all()
        self.wake()
        return changed

    def wake(self) -> None:
        """Let parked requests re-check their surface (after faults were cleared, here or by the core)."""
        # Like a SIGCONT after a SIGSTOP: every parked request looks again, the still-wedged park again.
        self._released.set()
        self._released = asyncio.Event()

    async def gate(self, surface: str) -> None:
        """Park while `surface` is wedged (connection accepted, nothing answered), then add its latency."""
        while (delay := self.state.gate_delay(surface)) is None:
            await self._released.wait()
        if delay > 0:
            await asyncio.sleep(delay)
