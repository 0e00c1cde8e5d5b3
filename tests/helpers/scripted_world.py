"""A scripted world on a virtual clock, for driving a `ScenarioSession` in unit tests without a process or a
socket: each command is answered by a test-supplied function with events and their delays."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.session import ScenarioSession
from harness.session.commands import Command
from harness.session.events import Event

# (delay after the command, event)
Answer = list[tuple[float, Event]]
Respond = Callable[[Command, float], Answer]


@dataclass
class Trace:
    """What happened: every command with the virtual time it was issued."""

    commands: list[tuple[float, Command]] = field(default_factory=list)

    def of(self, kind: type) -> list[tuple[float, Any]]:
        return [(t, c) for t, c in self.commands if isinstance(c, kind)]


def drive(session: ScenarioSession, respond: Respond, until: float = 600.0, start: float = 100.0) -> Trace:
    """Run the session on a virtual clock from `start` until it is done (or `until` passes)."""
    trace = Trace()
    pending: list[tuple[float, int, Event]] = []
    seq = itertools.count()

    def issue(cmds: list[Command], now: float) -> None:
        for cmd in cmds:
            trace.commands.append((now, cmd))
            for delay, ev in respond(cmd, now):
                heapq.heappush(pending, (now + delay, next(seq), ev))

    now = start
    issue(session.start(now, wall_now=1_000_000.0), now)
    while not session.done:
        wake = session.next_wakeup(now)
        nxt = pending[0][0] if pending else None
        if nxt is not None and (wake is None or nxt <= wake):
            now, _, ev = heapq.heappop(pending)
            issue(session.handle(ev, now), now)
        else:
            assert wake is not None and wake > now - 1e-9, (wake, now)
            now = max(now, wake)
            issue(session.poll(now), now)
        if now > start + until:
            raise AssertionError(f"session not done after {until} virtual seconds (phase {session.phase})")
    return trace
