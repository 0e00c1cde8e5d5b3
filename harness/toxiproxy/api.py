"""Toxiproxy's HTTP API over aiohttp: routes, JSON bodies and error shapes (thin shell on the service)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from harness.toxiproxy.errors import ApiError, bad_body
from harness.toxiproxy.service import ToxiproxyService

# Looks like a Toxiproxy 2.x release to clients that compare versions; the suffix tells it apart.
VERSION = "2.12.0+pdchaos.embedded"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message, "status": status}, status)


async def _body(request: web.Request) -> object:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_body(str(exc) if raw else "empty body") from None


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _json(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, exc.reason.lower())
        raise


def build_app(service: ToxiproxyService) -> web.Application:
    async def proxy_index(request: web.Request) -> web.Response:
        return _json({name: spec.to_json() for name, spec in service.proxies().items()})

    async def proxy_create(request: web.Request) -> web.Response:
        spec = await service.create(await _body(request))
        return _json(spec.to_json(), 201)

    async def populate(request: web.Request) -> web.Response:
        try:
            specs = await service.populate(await _body(request))
        except ApiError as exc:
            return _json({**exc.body(), "proxies": []}, exc.status)
        return _json({"proxies": [s.to_json() for s in specs]}, 201)

    async def proxy_show(request: web.Request) -> web.Response:
        return _json(service.get(request.match_info["proxy"]).to_json())

    async def proxy_update(request: web.Request) -> web.Response:
        spec = await service.update(request.match_info["proxy"], await _body(request))
        return _json(spec.to_json())

    async def proxy_delete(request: web.Request) -> web.Response:
        service.delete(request.match_info["proxy"])
        return web.Response(status=204)

    async def toxic_index(request: web.Request) -> web.Response:
        return _json(service.toxics(request.match_info["proxy"]))

    async def toxic_create(request: web.Request) -> web.Response:
        # 200, not 201: Toxiproxy answers 200 here and its Go client insists on it.
        toxic = service.add_toxic(request.match_info["proxy"], await _body(request))
        return _json(toxic.to_json())

    async def toxic_show(request: web.Request) -> web.Response:
        return _json(service.get_toxic(request.match_info["proxy"], request.match_info["toxic"]).to_json())

    async def toxic_update(request: web.Request) -> web.Response:
        m = request.match_info
        return _json(service.update_toxic(m["proxy"], m["toxic"], await _body(request)).to_json())

    async def toxic_delete(request: web.Request) -> web.Response:
        service.remove_toxic(request.match_info["proxy"], request.match_info["toxic"])
        return web.Response(status=204)

    async def reset(request: web.Request) -> web.Response:
        await service.reset()
        return web.Response(status=204)

    async def version(request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    app = web.Application(middlewares=[_errors])
    add = app.router.add_route
    add("GET", "/proxies", proxy_index)
    add("POST", "/proxies", proxy_create)
    add("POST", "/populate", populate)
    add("GET", "/proxies/{proxy}", proxy_show)
    add("POST", "/proxies/{proxy}", proxy_update)
    add("PATCH", "/proxies/{proxy}", proxy_update)
    add("DELETE", "/proxies/{proxy}", proxy_delete)
    add("GET", "/proxies/{proxy}/toxics", toxic_index)
    add("POST", "/proxies/{proxy}/toxics", toxic_create)
    add("GET", "/proxies/{proxy}/toxics/{toxic}", toxic_show)
    add("POST", "/proxies/{proxy}/toxics/{toxic}", toxic_update)
    add("PATCH", "/proxies/{proxy}/toxics/{toxic}", toxic_update)
    add("DELETE", "/proxies/{proxy}/toxics/{toxic}", toxic_delete)
    add("POST", "/reset", reset)
    add("GET", "/version", version)
    return app
