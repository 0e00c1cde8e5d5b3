"""The world interface: what a scenario session runs against.

A world executes the session's commands (`harness.session.commands`) and reports what happened as events
(`harness.session.events`). The session holds all of the run's logic; a world only moves bytes and time.
Implementations: `harness.worlds.real` (OS processes on loopback, aiohttp, Toxiproxy, real gateways, engines
on Kubernetes) and `harness.worlds.sim` (simpy, virtual clock).

The two differ in who holds the clock, so they share `World` (set up, run a session to its end, release)
and not how commands are carried out. A `CommandWorld` runs on the asyncio event loop and executes one
command at a time as the session asks (`execute`); `interpret` (below) drives the session over it. The
simulated world is a plain `World`: its commands are simpy processes, and it drives the session itself
from inside virtual time, where no asyncio task can wait.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from harness.scenario.actions import AddWorker, PatchWorker
from harness.session import ScenarioSession
from harness.session.commands import Command
from harness.session.events import CommandFailed, Event, FaultVerified

Emit = Callable[[Event], None]

# A wait on the world never exceeds this even when the session has nothing due (it always has a deadline;
# this only bounds the harm of a wrong one).
MAX_WAIT_S = 1.0
# Time allowed for the teardown a cut-short run still owes (processes killed, reports written).
INTERRUPTED_TEARDOWN_S = 30.0
# How long a respawn lets an engine process still there (dying, draining) end by itself before killing it.
RESPAWN_WAIT_S = 10.0


def refused_call(status: int, answer: Any, action: PatchWorker | AddWorker) -> dict[str, Any]:
    """What a worker API call that is a mistake records as applied: the status and body the router answered
    and the field at fault (the `worker_api` checker judges them)."""
    return {"status": status, "answer": answer, "refused": action.refused}


def graceful_stop_verified(fault: str, delivered: bool, health: str, pid: int | None) -> FaultVerified:
    """A graceful stop is in place once its SIGTERM reached the process (not on the engine's word); an
    engine still answering its health check healthy a second later is a finding on the engine's side."""
    finding = None
    if delivered and health == "ok:200":
        finding = "answered its health check healthy 1 s after SIGTERM (a draining engine must fail it)"
    return FaultVerified(fault, delivered, {"signal": "SIGTERM", "delivered": delivered, "health": health,
                                            "pid": pid}, finding)


class World(abc.ABC):
    """One cell's systems: set up by `__aenter__`, made to run a session by `run`, released by `__aexit__`
    (which must leave nothing behind, whatever happened)."""

    kind: str = "world"

    @abc.abstractmethod
    async def run(self, session: ScenarioSession) -> None:
        """Carry out the session's commands and tell it their events until it is done. A cancellation
        (Ctrl-C) still lets the session tear down before it goes on."""

    @abc.abstractmethod
    def clock(self) -> float:
        """The world's time (seconds, monotonic)."""

    @abc.abstractmethod
    def wall(self) -> float:
        """Wall-clock seconds at `clock()` (for records stamped with wall time)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        return None


class CommandWorld(World):
    """A world on the asyncio event loop that executes commands one by one as the session asks for them;
    `interpret` runs the session over it."""

    @abc.abstractmethod
    async def execute(self, command: Command, emit: Emit) -> None:
        """Carry out one command, reporting each event through `emit` as it happens. Commands run
        concurrently; each ends by its own deadline."""

    def opening_events(self) -> list[Event]:
        """What the world did to set the cell up that belongs in the history (reported right after start)."""
        return []

    def clock(self) -> float:
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        return time.time()

    async def run(self, session: ScenarioSession) -> None:
        await interpret(session, self)


async def next_event(queue: asyncio.Queue[Event], wait_s: float) -> Event | None:
    """The next event, or None when `wait_s` passes first. A cancellation always goes through: Python 3.11's
    `asyncio.wait_for` drops one that lands as the event arrives (the run then went on to its end after a
    Ctrl-C), `asyncio.timeout` does not."""
    try:
        async with asyncio.timeout(wait_s):
            return await queue.get()
    except TimeoutError:
        return None


async def interpret(session: ScenarioSession, world: CommandWorld) -> None:
    """The asyncio interpreter: executes the session's commands on `world`, feeds the events back, wakes the
    session when it asks to. Only this waits; the session decides. A cancelled run (Ctrl-C) still tears
    down through the session before the cancellation goes on."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()

    async def run_one(cmd: Command) -> None:
        try:
            await world.execute(cmd, queue.put_nowait)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the world is evidence, never a hang
            queue.put_nowait(CommandFailed(cmd, f"{type(exc).__name__}: {exc}"))

    def dispatch(cmds: list[Command]) -> None:
        for cmd in cmds:
            task = asyncio.create_task(run_one(cmd), name=f"world:{type(cmd).__name__}")
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def loop() -> None:
        while not session.done:
            now = world.clock()
            wake = session.next_wakeup(now)
            wait = MAX_WAIT_S if wake is None else min(MAX_WAIT_S, max(0.0, wake - now))
            event = await next_event(queue, wait)
            if event is None:
                dispatch(session.poll(world.clock()))
                continue
            dispatch(session.handle(event, world.clock()))
            # Events that arrived together are handled before the next wait.
            while not queue.empty() and not session.done:
                dispatch(session.handle(queue.get_nowait(), world.clock()))

    try:
        dispatch(session.start(world.clock(), world.wall()))
        for event in world.opening_events():
            dispatch(session.handle(event, world.clock()))
        await loop()
    except asyncio.CancelledError:
        dispatch(session.interrupt(world.clock()))
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(loop(), INTERRUPTED_TEARDOWN_S)
        raise
    finally:
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.wait(list(tasks), timeout=5.0)
