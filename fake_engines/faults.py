"""The asyncio side of protocol faults: a wedge parks a request, latency sleeps. Decisions: core.faults."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fake_engines.core.faults import FaultState


class FaultGate:
    """Wraps the pure FaultState; every server awaits `gate(surface)` before it answers."""

    def __init__(self) -> None:
        self.state = FaultState()
        self._released = asyncio.Event()

    def apply_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self.state.apply_spec(spec)

    def clear(self, kind: str) -> dict[str, Any]:
        changed = self.state.clear(kind)
        self._wake()
        return changed

    def clear_all(self) -> dict[str, Any]:
        changed = self.state.clear_all()
        self._wake()
        return changed

    def _wake(self) -> None:
        # Parked requests re-check their surface, like a SIGCONT after a SIGSTOP.
        self._released.set()
        self._released = asyncio.Event()

    async def gate(self, surface: str) -> None:
        """Park while `surface` is wedged (connection accepted, nothing answered), then add latency."""
        while self.state.is_wedged(surface):
            await self._released.wait()
        delay = self.state.latency_s(surface)
        if delay > 0:
            await asyncio.sleep(delay)
