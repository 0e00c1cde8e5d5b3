"""The real world's wait for the next event: a cancellation (Ctrl-C, SIGTERM) is never lost."""

from __future__ import annotations

import asyncio

import pytest

from harness.session.events import WorldNote
from harness.worlds.base import next_event


async def test_an_event_within_the_wait_is_returned_and_none_after_it() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    queue.put_nowait(WorldNote("x", {}))
    assert await next_event(queue, 1.0) == WorldNote("x", {})
    assert await next_event(queue, 0.01) is None


async def test_a_cancellation_that_lands_as_an_event_arrives_still_cancels() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    waiter = asyncio.create_task(next_event(queue, 30.0))
    await asyncio.sleep(0)  # the waiter is blocked on the queue
    queue.put_nowait(WorldNote("arrives", {}))
    waiter.cancel()  # in the same step: the event and the cancellation reach the waiter together
    with pytest.raises(asyncio.CancelledError):
        await waiter
