"""Async client for a fake engine's control API (CONTRACTS.md §1); re-exported by `fake_engines.control`."""

from __future__ import annotations

from typing import Any

import aiohttp


class ControlError(RuntimeError):
    """The control API answered with an error status."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"control API answered {status}: {body}")
        self.status = status
        self.body = body


class EngineControlClient:
    """One engine's control API. Every method returns the decoded JSON answer."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self.timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, self.base_url + path, json=body, headers=headers) as resp,
        ):
            try:
                data = await resp.json(content_type=None)
            except ValueError:
                data = await resp.text()
            if resp.status >= 400:
                raise ControlError(resp.status, data)
            return data

    async def state(self) -> Any:
        return await self._call("GET", "/control/state")

    async def restart(self, down_s: float = 0.0, engine_id: str | None = None) -> Any:
        # The answer comes once the engine serves again, so the wait covers the downtime.
        return await self._call(
            "POST",
            "/control/restart",
            {"down_s": down_s, "engine_id": engine_id},
            timeout_s=self.timeout_s + down_s,
        )

    async def slow_start(self, refuse_s: float) -> Any:
        return await self._call(
            "POST", "/control/slow_start", {"refuse_s": refuse_s}, timeout_s=self.timeout_s + refuse_s
        )

    async def crash(self) -> Any:
        return await self._call("POST", "/control/crash", {})

    async def die(self, exit_after_s: float = 5.0) -> Any:
        return await self._call("POST", "/control/die", {"exit_after_s": exit_after_s})

    async def fault(self, kind: str, **params: Any) -> Any:
        return await self._call("POST", "/control/fault", {"fault": kind, **params})

    async def clear_fault(self, kind: str) -> Any:
        return await self._call("DELETE", f"/control/fault/{kind}")

    async def clear(self) -> Any:
        return await self._call("POST", "/control/clear", {})

    async def records(self, since: int = 0) -> Any:
        return await self._call("GET", f"/control/records?since={since}")
