"""`wait_set`: an event within the wait, a wait that runs out, and a cancellation that is never lost."""

from __future__ import annotations

import asyncio

import pytest

from pdchaos.waiting import wait_set


async def test_a_set_event_is_seen_and_a_wait_that_runs_out_says_so() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_set(event, 5.0) is True
    assert await wait_set(event, None) is True


async def test_a_cancellation_that_lands_as_the_event_is_set_still_cancels() -> None:
    # Under asyncio.wait_for (Python 3.11) the waiter returns True here and a loop around it goes on.
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_set(event, 30.0))
    await asyncio.sleep(0)  # the waiter is blocked on the event
    event.set()
    waiter.cancel()  # in the same step: the event and the cancellation reach the waiter together
    with pytest.raises(asyncio.CancelledError):
        await waiter
