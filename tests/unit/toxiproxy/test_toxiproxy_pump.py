"""The embedded Toxiproxy's read pump on a connection whose chain already ended (a reset handed out).

The chain then ignores the EOF the aborted socket gives; a pump that kept reading would spin on b"" without
ever yielding, freezing the whole embedded server (and every Toxiproxy API call after it). The pump runs on
a thread of its own here, so the test fails instead of hanging if it spins.
"""

from __future__ import annotations

import asyncio
import threading
from unittest import mock

from harness.toxiproxy.chain import DirectionChain
from harness.toxiproxy.link import _Pump


def _read_after_end(data: bytes) -> bool:
    """Whether the pump's read loop returned for a reader holding `data` then EOF, its chain ended."""
    finished = threading.Event()

    async def go() -> None:
        reader = asyncio.StreamReader()
        if data:
            reader.feed_data(data)
        reader.feed_eof()
        chain = DirectionChain(0, "proxy", 1, "upstream")
        chain.ended = True
        pump = _Pump(mock.Mock(), reader, mock.Mock(), chain)
        await pump.read_loop()
        finished.set()

    thread = threading.Thread(target=asyncio.run, args=(go(),), daemon=True)
    thread.start()
    thread.join(5.0)
    return finished.is_set()


def test_read_loop_ends_at_eof_when_the_chain_already_ended() -> None:
    assert _read_after_end(b"")


def test_read_loop_ends_at_eof_after_data_the_ended_chain_drops() -> None:
    assert _read_after_end(b"late bytes")
