"""JSON answers for the errors aiohttp answers itself, before any handler runs.

An unknown method, a malformed request line or headers over aiohttp's 8 KiB limits never reach a
middleware: aiohttp's protocol handler answers them in plain text. A server whose clients expect JSON errors
swaps in a handler class that answers those in its own JSON shape; everything else is aiohttp's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

ErrorBody = Callable[[int, str], dict[str, Any]]
# aiohttp quotes the offending bytes (up to 100 of a 9 KB header line): enough to say what was wrong.
_MAX_MESSAGE = 160


def answer_parser_errors_as_json(runner: web.AppRunner, body: ErrorBody) -> None:
    """After `runner.setup()`: every error aiohttp answers itself on this runner's server is
    `body(status, message)` as JSON (same status, connection closed as aiohttp does)."""
    server = runner.server
    if server is None:
        raise RuntimeError("call after runner.setup()")

    class JsonErrorHandler(RequestHandler):
        def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                         message: str | None = None) -> web.StreamResponse:
            plain = super().handle_error(request, status, exc, message)
            reason = (message or "").strip() or (str(exc) if exc else "") or plain.reason or "error"
            line = reason.splitlines()[0][:_MAX_MESSAGE]
            resp = web.Response(status=status, text=json.dumps(body(status, line)),
                                content_type="application/json")
            resp.force_close()
            return resp

    class JsonErrorServer(type(server)):  # type: ignore[misc]
        def __call__(self) -> RequestHandler:
            return JsonErrorHandler(self, loop=self._loop, **self._kwargs)

    # The server object is the one aiohttp made (its settings and connection tracking stay); only the class
    # that builds each connection's protocol handler changes.
    server.__class__ = JsonErrorServer
