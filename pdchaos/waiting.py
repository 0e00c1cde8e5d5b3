"""Waiting for a condition, always with a deadline, on a given clock.

Every poll loop of the project goes through `poll_until` (async) so a wait can never be unbounded and the
clock can be swapped (the event loop's by default).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

Clock = Callable[[], float]


async def poll_until(
    check: Callable[[], T | Awaitable[T]],
    timeout_s: float,
    interval_s: float = 0.05,
    clock: Clock | None = None,
) -> T | None:
    """Call `check` (sync or async) every `interval_s` until it returns a truthy value, which is returned.
    Returns the last (falsy) value once `timeout_s` has passed; `check` runs at least once."""
    now = clock or asyncio.get_running_loop().time
    deadline = now() + max(0.0, timeout_s)
    while True:
        got = check()
        value = await got if inspect.isawaitable(got) else got
        if value:
            return value  # type: ignore[return-value]
        left = deadline - now()
        if left <= 0:
            return value  # type: ignore[return-value]
        await asyncio.sleep(min(interval_s, left))


async def wait_true(
    check: Callable[[], bool | Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.05
) -> None:
    """`poll_until`, raising TimeoutError naming `what` when the condition never held."""
    if not await poll_until(check, timeout_s, interval_s):
        raise TimeoutError(f"{what}: not within {timeout_s:g} s")


def poll_until_sync(
    check: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.05,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`poll_until` for code without an event loop (a test driving a subprocess): same contract."""
    deadline = clock() + max(0.0, timeout_s)
    while True:
        value = check()
        if value:
            return value
        left = deadline - clock()
        if left <= 0:
            return value
        sleep(min(interval_s, left))


async def wait_set(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until `event` is set or `timeout_s` passes (None: no limit); whether it is set. A loop around
    this stops when its task is cancelled: Python 3.11's `asyncio.wait_for` drops a cancellation that lands
    in the same step as the event, and the loop went on; `asyncio.timeout` keeps it."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()
