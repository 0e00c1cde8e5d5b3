"""A fake prefill, a fake decode and the reference router in this process, on a background event loop, for
synchronous tests (Hypothesis drives plain functions) that talk to it over loopback HTTP."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

from fake_engines.runtime import EngineHandle
from fake_engines.testing import loopback_config, running_engine
from reference_router.config import RouterConfig, WorkerArg
from reference_router.stub_engines import InProcessRouter

T = TypeVar("T")
START_TIMEOUT_S = 30.0


@dataclass
class PdStack:
    transport: str
    router: InProcessRouter
    prefill: EngineHandle
    decode: EngineHandle
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return self.router.base

    def engine_http_urls(self) -> list[str]:
        return [self.prefill.url("http"), self.decode.url("http")]

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = START_TIMEOUT_S) -> T:
        """Run a coroutine on the stack's loop (e.g. to read the router's state) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)


class BackgroundPdStack:
    """`with BackgroundPdStack("grpc") as stack:` ... the stack runs until the block ends."""

    def __init__(self, transport: str, connector: str = "mooncake", **router: Any) -> None:
        self.transport = transport
        self.connector = connector
        self.router_settings = router
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pd-stack", daemon=True)
        self._exit = AsyncExitStack()

    async def _start(self) -> PdStack:
        stack = self._exit
        p_cfg = loopback_config("prefill", self.connector, name="p")
        d_cfg = loopback_config("decode", self.connector, name="d")
        p = await stack.enter_async_context(running_engine(p_cfg))
        d = await stack.enter_async_context(running_engine(d_cfg))
        http = self.transport == "http"
        settings: dict[str, Any] = {
            "pd": True, "prefill": (WorkerArg(p.url(self.transport), p.bootstrap_port or None),),
            "decode": (d.url(self.transport),), "connector": self.connector if http else None,
            "interval_s": 0.2, "probe_timeout_s": 1.0, "success_threshold": 1, "failure_threshold": 2,
            "request_timeout_s": 10.0,
        }
        settings.update(self.router_settings)
        router = await stack.enter_async_context(InProcessRouter(RouterConfig(**settings)))
        await router.wait_ready(START_TIMEOUT_S)
        return PdStack(self.transport, router, p, d, self._loop)

    def __enter__(self) -> PdStack:
        self._thread.start()
        try:
            return asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(START_TIMEOUT_S)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._exit.aclose(), self._loop).result(START_TIMEOUT_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)
        self._loop.close()
