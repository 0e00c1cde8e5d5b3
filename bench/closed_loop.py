"""Closed-loop HTTP load for the bench scripts: N clients posting back to back for a fixed time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp


async def drive(url: str, body: dict[str, Any], seconds: float, concurrency: int) -> tuple[int, int, float]:
    """Closed loop: `concurrency` clients, each posting back to back for `seconds`. (ok, errors, elapsed)."""
    ok = errors = 0
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def client() -> None:
            nonlocal ok, errors
            while time.monotonic() < deadline:
                try:
                    async with session.post(url, json=body) as r:
                        await r.read()
                        if r.status == 200:
                            ok += 1
                        else:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1

        t0 = time.monotonic()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return ok, errors, time.monotonic() - t0
