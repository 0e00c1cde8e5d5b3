"""The context length each worker's model reports, so a request that cannot fit is refused before any leg.

gRPC workers report it with their tokenizer (`GetModelInfo.max_context_length`, on the codec). HTTP workers
report `max_model_len` in `GET /v1/models`; it is read in the background, never on a request's path: a
worker whose metadata surface hangs must not stall the requests sent to it. Until a worker's length is
known the router does not cap (the engine still refuses with its own 400).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from .core import Transport, Worker

# A failed read is tried again no sooner than this: a worker that is down is not asked on every request.
RETRY_AFTER_S = 5.0


def max_model_len(models: Any) -> int | None:
    """The smallest positive `max_model_len` in a `/v1/models` answer (None: none reported)."""
    data = models.get("data") if isinstance(models, dict) else None
    found = [
        m["max_model_len"] for m in data or []
        if isinstance(m, dict) and isinstance(m.get("max_model_len"), int)
        and not isinstance(m.get("max_model_len"), bool) and m["max_model_len"] > 0
    ]
    return min(found) if found else None


class HttpContextLengths:
    """`max_model_len` per HTTP worker URL, learned in the background."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._session = session
        self._timeout_s = timeout_s
        self._clock = clock
        self._known: dict[str, int] = {}
        self._tried_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, worker: Worker) -> int | None:
        """The worker's context length if known; else starts (at most one) background read and says None."""
        if worker.spec.transport is not Transport.HTTP:
            return None
        url = worker.spec.url
        known = self._known.get(url)
        if known is not None:
            return known
        last = self._tried_at.get(url)
        if last is None or self._clock() - last >= RETRY_AFTER_S:
            self._tried_at[url] = self._clock()
            task = asyncio.get_running_loop().create_task(self._read(url))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return None

    async def _read(self, url: str) -> None:
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with self._session().get(f"{url}/v1/models", timeout=timeout) as resp:
                if resp.status != 200:
                    return
                length = max_model_len(await resp.json(content_type=None))
            if length is not None:
                self._known[url] = length

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
