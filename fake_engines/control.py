"""Loopback control API of a fake engine (CONTRACTS.md §1) and its Python client.

Every mutating call answers `{"ok": true, "changed": {...}, "state": STATE}`; errors answer
`{"ok": false, "error": "..."}` with 400 (bad request), 401 (token) or 404.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from fake_engines.control_client import ControlError, EngineControlClient
from fake_engines.core.engine_config import EngineConfig
from fake_engines.engine import Engine

log = logging.getLogger(__name__)
# Starts every fault line an engine logs (the rest: the action and what it changed, as JSON).
FAULT_LOG_PREFIX = "pdchaos fault"

__all__ = ["ControlError", "ControlledEngine", "EngineControlClient", "control_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ControlledEngine(Protocol):
    """What the control API drives: the lifecycle owner (`runtime.EngineHandle`), which builds this app."""

    @property
    def config(self) -> EngineConfig: ...

    @property
    def engine(self) -> Engine: ...

    def state(self) -> dict[str, Any]: ...

    async def restart(self, down_s: float = 0.0, engine_id: str | None = None) -> dict[str, Any]: ...

    def crash(self) -> dict[str, Any]: ...

    def die(self, exit_after_s: float = 5.0) -> dict[str, Any]: ...


def _fail(status: int, message: str) -> web.Response:
    return web.json_response({"ok": False, "error": message}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    return body


def _number(body: dict[str, Any], key: str, default: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ValueError(f"{key} must be a number >= 0")
    return float(v)


# The token in a header of its own, for callers behind a proxy that takes `Authorization` for itself (the
# Kubernetes API server's service proxy authenticates the caller with it and does not pass it on).
TOKEN_HEADER = "X-Pdchaos-Control-Token"


def control_app(handle: ControlledEngine) -> web.Application:
    token = handle.config.control_token

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token:
            bearer = request.headers.get("Authorization", "")
            plain = request.headers.get(TOKEN_HEADER, "")
            if not (hmac.compare_digest(bearer.encode(), f"Bearer {token}".encode())
                    or hmac.compare_digest(plain.encode(), token.encode())):
                return _fail(401, "missing or wrong bearer token")
        try:
            return await handler(request)
        except ValueError as exc:
            return _fail(400, str(exc))
        except OSError as exc:  # e.g. a restart whose serving port was taken while it was down
            return _fail(500, f"{type(exc).__name__}: {exc}")

    def ok(changed: dict[str, Any], action: str) -> web.Response:
        # One line per fault in the engine's own log: an incident bundle built from these logs sees the
        # outage as an operator would (`pdchaos incident` reads it back).
        log.warning("%s %s: %s", FAULT_LOG_PREFIX, action, json.dumps(changed, sort_keys=True, default=str))
        return web.json_response({"ok": True, "changed": changed, "state": handle.state()})

    async def state(request: web.Request) -> web.Response:
        return web.json_response(handle.state())

    async def restart(request: web.Request) -> web.Response:
        body = await _body(request)
        engine_id = body.get("engine_id")
        if engine_id is not None and (not isinstance(engine_id, str) or not engine_id.strip()):
            raise ValueError("engine_id must be a non-empty string or null")
        return ok(await handle.restart(_number(body, "down_s", 0.0), engine_id), "restart")

    async def slow_start(request: web.Request) -> web.Response:
        body = await _body(request)
        if "refuse_s" not in body:
            raise ValueError("refuse_s is required")
        changed = await handle.restart(_number(body, "refuse_s", 0.0))
        changed["refuse_s"] = changed.pop("down_s")
        return ok(changed, "slow_start")

    async def crash(request: web.Request) -> web.Response:
        return ok(handle.crash(), "crash")

    async def die(request: web.Request) -> web.Response:
        body = await _body(request)
        return ok(handle.die(_number(body, "exit_after_s", 5.0)), "die")

    async def fault(request: web.Request) -> web.Response:
        body = await _body(request)
        return ok(handle.engine.faults.apply_spec(body), "fault")

    async def clear_fault(request: web.Request) -> web.Response:
        return ok(handle.engine.faults.clear(request.match_info["kind"]), "clear_fault")

    async def clear(request: web.Request) -> web.Response:
        return ok(handle.engine.faults.clear_all(), "clear")

    async def records(request: web.Request) -> web.Response:
        raw = request.query.get("since", "0")
        if not raw.lstrip("-").isdigit():
            raise ValueError("since must be an integer")
        recs, nxt = handle.engine.state.records_since(int(raw))
        return web.json_response({"records": recs, "next": nxt})

    app = web.Application(middlewares=[auth])
    app.router.add_get("/control/state", state)
    app.router.add_post("/control/restart", restart)
    app.router.add_post("/control/slow_start", slow_start)
    app.router.add_post("/control/crash", crash)
    app.router.add_post("/control/die", die)
    app.router.add_post("/control/fault", fault)
    app.router.add_delete("/control/fault/{kind}", clear_fault)
    app.router.add_post("/control/clear", clear)
    app.router.add_get("/control/records", records)
    return app
