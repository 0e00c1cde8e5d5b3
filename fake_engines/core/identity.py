"""Engine identity: engine id, restart generation and uptime, as pure values."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace


def make_engine_id(pinned: str | None = None, uuid_factory: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """The engine id for one start: the pinned id when given, else a fresh uuid4 string.

    ``uuid_factory`` lets tests and the simulator pass a seeded source.
    """
    if pinned is not None:
        if not pinned.strip():
            raise ValueError("pinned engine id must not be empty")
        return pinned
    return str(uuid_factory())


def dp_engine_id(engine_id: str, rank: int) -> str:
    """``<id>_dp<rank>``: the id a data-parallel rank is known by."""
    if rank < 0:
        raise ValueError(f"dp rank must be >= 0, got {rank}")
    return f"{engine_id}_dp{rank}"


def rank_engine_ids(engine_id: str, dp_size: int) -> list[str]:
    """Ids of every dp rank. With ``dp_size == 1`` the plain id (as GetServerInfo reports), else suffixed."""
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if dp_size == 1:
        return [engine_id]
    return [dp_engine_id(engine_id, r) for r in range(dp_size)]


@dataclass(frozen=True)
class EngineIdentity:
    """Who the engine is during one start. ``started_at`` is on whatever clock the shell passes as ``now``."""

    engine_id: str
    generation: int
    started_at: float

    @classmethod
    def first(
        cls, now: float, pinned: str | None = None, uuid_factory: Callable[[], uuid.UUID] = uuid.uuid4
    ) -> EngineIdentity:
        """Identity of the first start (generation 1)."""
        return cls(make_engine_id(pinned, uuid_factory), 1, now)

    def restarted(
        self, now: float, pinned: str | None = None, uuid_factory: Callable[[], uuid.UUID] = uuid.uuid4
    ) -> EngineIdentity:
        """Identity after a restart: new id (unless pinned), generation + 1, uptime from ``now``."""
        return replace(
            self,
            engine_id=make_engine_id(pinned, uuid_factory),
            generation=self.generation + 1,
            started_at=now,
        )

    def uptime_s(self, now: float) -> float:
        """Seconds since this start; never negative (a clock read before start counts as 0)."""
        return max(0.0, now - self.started_at)
