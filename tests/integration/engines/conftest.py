"""Fixtures shared by the engine tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture
async def procs() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Engine processes a test started: killed at its end, whatever happened."""
    started: list[asyncio.subprocess.Process] = []
    try:
        yield started
    finally:
        for p in started:
            if p.returncode is None:
                p.kill()
                await p.wait()
