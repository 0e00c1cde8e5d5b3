"""An operator beside a gateway that mints Mooncake handoffs from the engine id its workers were registered
with: when a prefill's engine id changes (it restarted), the worker is registered again with the new one.

smg over HTTP takes a Mooncake prefill's `kv_engine_id` from the worker's registration (`kv_facts`) and never
reads it again (its HTTP discovery reads no KV facts). After the prefill restarts with a new id, every decode
is told the dead one and waits out its KV transfer timeout (vLLM #2491) until someone registers the worker
again. Deployments do that with a small controller watching the engines; this is one: every `interval_s` it
reads each watched prefill's id where the registration read it (the Mooncake bootstrap `/query`), and when it
changed it removes the worker and adds it back with its new facts. Each re-registration is reported (the
history shows when the gateway was told).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# How often the operator reads the engine ids. A controller watching pods reacts within about a second of a
# restart whatever the gateway's probe interval is.
DEFAULT_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Reregistration:
    """One worker registered again: the id it had and the one it has now, and how the gateway answered."""

    engine: str
    old_id: str | None
    new_id: str
    ok: bool
    detail: str

    def fields(self) -> dict[str, object]:
        return {"engine": self.engine, "old_engine_id": self.old_id, "new_engine_id": self.new_id,
                "ok": self.ok, "detail": self.detail}


# Reads an engine's current id (None: not readable now, e.g. it is down or still loading).
ReadId = Callable[[str], Awaitable[str | None]]
# Removes the engine's worker and registers it again; (accepted, what the gateway said).
Reregister = Callable[[str], Awaitable[tuple[bool, str]]]


class EngineIdOperator:
    """Watches the engine ids of the workers it is told about (`watch`, `forget`) and re-registers a worker
    whose id changed. `step` is one pass; `run` loops until cancelled."""

    def __init__(
        self, read_id: ReadId, reregister: Reregister, interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        if not interval_s > 0:
            raise ValueError("operator interval must be > 0")
        self._read_id = read_id
        self._reregister = reregister
        self.interval_s = interval_s
        self._known: dict[str, str | None] = {}

    def watch(self, engine: str, engine_id: str | None) -> None:
        """`engine`'s worker was registered with `engine_id` (None: with no id)."""
        self._known[engine] = engine_id

    def forget(self, engine: str) -> None:
        """`engine`'s worker was removed on purpose: never add it back."""
        self._known.pop(engine, None)

    @property
    def watched(self) -> dict[str, str | None]:
        return dict(self._known)

    async def step(self, seen: Callable[[str, str | None, str], None] | None = None) -> list[Reregistration]:
        """Read every watched engine's id once; re-register those whose id changed (`seen(engine, old, new)`
        is told first: a re-registration can take seconds). A failed re-registration keeps the old id, so
        the next pass tries again."""
        done = []
        for engine, old in list(self._known.items()):
            new = await self._read_id(engine)
            if new is None or new == old or engine not in self._known:
                continue
            if seen is not None:
                seen(engine, old, new)
            ok, detail = await self._reregister(engine)
            if ok and engine in self._known:
                self._known[engine] = new
            done.append(Reregistration(engine, old, new, ok, detail))
        return done

    async def run(self, report: Callable[[Reregistration], None],
                  seen: Callable[[str, str | None, str], None] | None = None) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            for r in await self.step(seen):
                report(r)
