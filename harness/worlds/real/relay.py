"""A recording relay on a real engine's serving port: HTTP passes through unchanged, and each completion leg
that crosses it leaves a line in a legs file (kind, answer status, error, what the leg was told), from which
`harness.vllm.provenance` makes provenance records in the fake engines' format (CONTRACTS.md §1), so the
handoff, legs and recovery checkers judge a real vLLM as they judge the fakes.

- kind: the leg's `kv_transfer_params` (`do_remote_decode`: prefill leg, `do_remote_prefill`: decode leg,
  none: a local request).
- status and error: the HTTP status, an error body's message, or the first SSE error chunk of a stream.
- a prefill leg's answer `kv_transfer_params` (its `remote_request_id` is the decode's key in vLLM's NIXL
  log); a decode leg's `kv_transfer_params` as told.
- engine_id and generation: the identity the engine was started with.

Liveness follows the engine: while the engine is down the relay's port refuses connections (`refuse`), as a
dead engine's port does; `serve` opens it once the engine serves. Connections in flight when the engine
dies are reset, not answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from harness.topology import EngineSpec
from pdchaos.jsonl import JsonlWriter
from pdchaos.ports import free_ports

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
CONNECT_TIMEOUT_S = 5.0
# A leg has the router's deadline around it; this only ends a relay leg nobody waits for any more.
LEG_TIMEOUT_S = 900.0


def leg_kind(body: Any) -> str:
    params = body.get("kv_transfer_params") if isinstance(body, dict) else None
    if isinstance(params, dict):
        if params.get("do_remote_decode"):
            return "prefill"
        if params.get("do_remote_prefill"):
            return "decode"
    return "local"


def prompt_text(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    if "messages" in body:
        return json.dumps(body.get("messages"), sort_keys=True)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


class RelayBase:
    """What every relay keeps: the engine it fronts, the port the engine itself listens on, the identity in
    force, and the legs file."""

    def __init__(self, name: str, spec: EngineSpec, records: Path, connector: str = "nixl") -> None:
        self.name = name
        self.spec = spec
        self.connector = connector
        self.backend_port = free_ports(1)[0]
        # The identity of the engine behind the relay now (its owner sets it at each start).
        self.engine_id: str | None = None
        self.generation = 0
        self._records = records
        self._writer: JsonlWriter | None = None
        self._seq = 0

    def _open_legs(self) -> None:
        if self._writer is None:
            self._records.parent.mkdir(parents=True, exist_ok=True)
            self._writer = JsonlWriter(self._records)


class RecordingRelay(RelayBase):
    """One engine's relay: listens on the engine's serving port, forwards to `backend_port`."""

    def __init__(self, name: str, spec: EngineSpec, records: Path, connector: str = "nixl") -> None:
        super().__init__(name, spec, records, connector)
        self._http: aiohttp.ClientSession | None = None
        self._server: web.Server | None = None
        self._listener: asyncio.Server | None = None

    @property
    def backend(self) -> str:
        return f"http://{self.spec.host}:{self.backend_port}"

    async def open(self) -> None:
        """Ready to serve (the port still refuses until `serve`)."""
        if self._http is None:
            self._open_legs()
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=LEG_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False)
            self._server = web.Server(self._handle, access_log=None)

    async def serve(self) -> None:
        """Open the engine's serving port (the engine serves behind it); returns once it accepts."""
        if self._listener is not None or self._server is None:
            return
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._server, self.spec.host, self.spec.http_port,
                                                  reuse_address=True)

    def refuse(self) -> None:
        """Close the serving port (connections refused) and reset every connection in flight."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._server is not None:
            for conn in list(self._server.connections):
                if conn.transport is not None:
                    conn.transport.abort()

    async def close(self) -> None:
        self.refuse()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.shutdown(0.5)
        if self._http is not None:
            await self._http.close()
        if self._writer is not None:
            self._writer.close()

    # ------------------------------------------------------------------ relaying

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self._http is not None
        raw = await request.read()
        body: Any = None
        if request.method == "POST" and request.path in COMPLETION_PATHS:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                body = json.loads(raw)
        kind = leg_kind(body) if isinstance(body, dict) else None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        started = time.monotonic()
        engine_id = self.engine_id
        try:
            upstream = await self._http.request(request.method, self.backend + request.path_qs,
                                                data=raw or None, headers=headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # The engine went away under the relay: a dead engine's port refuses, so the relay does too.
            self.refuse()
            if kind is not None:
                self._record(body, kind, engine_id, started, 0, None, f"{type(exc).__name__}: {exc}")
            return _reset(request)
        async with upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP_HEADERS:
                    out.headers[k] = v
            reader_left = False
            try:
                if kind is not None and body.get("stream"):
                    answer, error, reader_left = await self._stream(request, upstream, out)
                    if reader_left and answer is None and error is None:
                        error = "the router closed the stream before its first chunk"
                else:
                    data = await upstream.read()
                    answer, error = _json_or_none(data), None
                    try:
                        await out.prepare(request)
                        await out.write(data)
                        await out.write_eof()
                    except ConnectionResetError:
                        # The engine answered whole; the router had hung up (gave up on the leg).
                        reader_left = True
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                if kind is not None:
                    self._record(body, kind, engine_id, started, upstream.status, None,
                                 f"{type(exc).__name__}: {exc}")
                return _reset(request)
        if kind is not None:
            if error is None and upstream.status != 200:
                error = _error_text(answer) or f"HTTP {upstream.status}"
            self._record(body, kind, engine_id, started, upstream.status, answer, error, reader_left)
        return out

    async def _stream(self, request: web.BaseRequest, upstream: aiohttp.ClientResponse,
                      out: web.StreamResponse) -> tuple[Any, str | None, bool]:
        """Pass an SSE stream on as it comes; (its first chunk, the first error chunk's text, whether the
        router closed its side first). A router may close a stream once it has what it needs (smg does
        after the finishing chunk): the engine's request then ends as it would on a direct connection."""
        await out.prepare(request)
        first: Any = None
        error: str | None = None
        pending = b""
        async for part in upstream.content.iter_any():
            pending += part
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                chunk = _sse_json(event)
                if first is None and isinstance(chunk, dict):
                    first = chunk
                if isinstance(chunk, dict) and "error" in chunk and error is None:
                    error = _error_text(chunk) or "error chunk"
            try:
                await out.write(part)
            except ConnectionResetError:
                return first, error, True
        try:
            await out.write_eof()
        except ConnectionResetError:
            return first, error, True
        return first, error, False

    def _record(self, body: Any, kind: str, engine_id: str | None, started: float, status: int,
                answer: Any, error: str | None, reader_left: bool = False) -> None:
        if self._writer is None:
            return
        told = body.get("kv_transfer_params") if isinstance(body, dict) else None
        back = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        self._seq += 1
        request_id = (str(answer.get("id")) if isinstance(answer, dict) and answer.get("id")
                      else f"relay-{self.name}-{self._seq}")
        self._writer.write(leg_line(
            self.name, self.spec.role, self.connector, engine_id, self.generation, kind, request_id,
            prompt_text(body), bool(isinstance(body, dict) and body.get("stream")), status, error,
            time.monotonic() - started, reader_left, told, back))


def leg_line(engine: str, role: str, connector: str, engine_id: str | None, generation: int, kind: str,
             request_id: str, prompt: str, stream: bool, status: int, error: str | None, duration_s: float,
             reader_left: bool, told: Any, answered: Any) -> dict[str, Any]:
    """One line of a relay's legs file (CONTRACTS.md §13), from either surface."""
    return {
        "ts": time.time(), "engine": engine, "role": role, "connector": connector,
        "engine_id": engine_id, "generation": generation, "kind": kind, "request_id": request_id,
        "prompt": prompt, "stream": stream, "status": status, "error": error,
        "duration_s": round(duration_s, 6), "reader_left": reader_left,
        "told": told if isinstance(told, dict) else None,
        "answered": answered if isinstance(answered, dict) else None,
    }


def _reset(request: web.BaseRequest) -> web.StreamResponse:
    """The caller's connection is reset (as a dying engine's is); the response returned is never sent."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=502)


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _sse_json(event: bytes) -> Any:
    for line in event.splitlines():
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload and payload != b"[DONE]":
                return _json_or_none(payload)
    return None


def _error_text(obj: Any) -> str | None:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return None if err is None else str(err)
