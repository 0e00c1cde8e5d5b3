"""A recording relay on a real engine's serving port: HTTP passes through unchanged, and each completion leg
that crosses it leaves a line in a legs file (kind, answer status, error, what the leg was told), from which
`harness.vllm.provenance` makes provenance records in the fake engines' format (CONTRACTS.md §1), so the
handoff, legs and recovery checkers judge a real vLLM as they judge the fakes.

- kind: the leg's `kv_transfer_params` (`do_remote_decode`: prefill leg, `do_remote_prefill`: decode leg,
  none: a local request).
- status and error: the HTTP status, an error body's message, or the first SSE error chunk of a stream.
- a prefill leg's answer `kv_transfer_params` (its `remote_request_id` is the decode's key in vLLM's NIXL
  log); a decode leg's `kv_transfer_params` as told.
- engine_id and generation: the identity the engine was started with (as the relay knows it when the leg
  arrives).
- leg: the leg's shape (`fake_engines.core.calls.leg_of_openai`), tag (its `[pdchaos:...]` tag) and caller
  (header `X-Pdchaos-Caller`; unmarked: the router).

Every other call the engine answers through the relay leaves an engine call line (CONTRACTS.md §1) in the same
file: `/health`, `/v1/models`, `/version` and `/metrics` by name, with the arrival wall time, the engine's
status (502: the engine could not be reached, 504: it did not answer in time, 499: the caller left first)
and the caller; a completion whose body is no JSON object is a `generate` call when the engine refuses it.
Paths of no known call pass through unrecorded. The caller header passes on to the engine (vLLM ignores it).

Liveness follows the engine: while the engine is down the relay's port refuses connections (`refuse`), as a
dead engine's port does; `serve` opens it once the engine serves. Connections in flight when the engine
dies are reset, not answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from fake_engines.core.calls import (
    CALLER_HEADER,
    CLIENT_GONE,
    GENERATE,
    HEALTH,
    METRICS,
    MODELS,
    VERSION,
    caller_of,
    leg_of_openai,
    make_call,
    tag_of_openai,
)
from harness.topology import EngineSpec
from pdchaos.jsonl import JsonlWriter
from pdchaos.ports import free_ports

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
CONNECT_TIMEOUT_S = 5.0
# A leg has the router's deadline around it; this only ends a relay leg nobody waits for any more.
LEG_TIMEOUT_S = 900.0
# The engine call each non-completion path is (CONTRACTS.md §1); others pass through unrecorded.
CALL_PATHS = {"/health": HEALTH, "/v1/models": MODELS, "/version": VERSION, "/metrics": METRICS}
# How often a call waiting on the engine looks whether its caller is still there: a probe the router gave up
# on is the router's failed probe from the moment it hung up, not from when the engine answers.
CALLER_POLL_S = 0.05


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


@dataclass(frozen=True)
class Arrival:
    """A call as it reached the relay: when (wall, for the record; monotonic, for its duration), the engine's
    identity then (a restart during the call does not rename what it reached) and who called."""

    wall: float
    started: float
    engine_id: str | None
    generation: int
    caller: str


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

    def arrival(self, caller: str | None) -> Arrival:
        """Now, for a call that just reached the relay (`caller`: what the call named itself, if anything)."""
        return Arrival(time.time(), time.monotonic(), self.engine_id, self.generation, caller_of(caller))

    def write_call(self, call: str, arrival: Arrival, status: int,
                   detail: Mapping[str, Any] | None = None) -> None:
        """One engine call line (CONTRACTS.md §1) for a call that ended now."""
        if self._writer is None:
            return
        self._writer.write(make_call(
            ts=arrival.wall, engine=self.name, engine_id=arrival.engine_id or "",
            generation=arrival.generation, role=self.spec.role, call=call, status=status,
            duration_s=round(time.monotonic() - arrival.started, 6), caller=arrival.caller, detail=detail))


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
        arrival = self.arrival(request.headers.get(CALLER_HEADER))
        raw = await request.read()
        body: Any = None
        if request.method == "POST" and request.path in COMPLETION_PATHS:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                body = json.loads(raw)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        if isinstance(body, dict):
            return await self._leg(request, raw, headers, body, arrival)
        call = CALL_PATHS.get(request.path) if request.method in ("GET", "HEAD") else None
        if request.method == "POST" and request.path in COMPLETION_PATHS:
            call = GENERATE  # a body that is no JSON object: what the engine made of it is still a call
        return await self._call(request, raw, headers, call, arrival)

    async def _leg(self, request: web.BaseRequest, raw: bytes, headers: dict[str, str], body: dict[str, Any],
                   arrival: Arrival) -> web.StreamResponse:
        assert self._http is not None
        kind = leg_kind(body)
        # Read before the engine checks the body, so a leg it refuses still has its shape.
        shape = leg_of_openai(body, request.path == "/v1/chat/completions")
        try:
            upstream = await self._http.request(request.method, self.backend + request.path_qs,
                                                data=raw or None, headers=headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # The engine went away under the relay: a dead engine's port refuses, so the relay does too.
            self.refuse()
            self._record(body, shape, kind, arrival, 0, None, f"{type(exc).__name__}: {exc}")
            return _reset(request)
        async with upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP_HEADERS:
                    out.headers[k] = v
            reader_left = False
            try:
                if body.get("stream"):
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
                self._record(body, shape, kind, arrival, upstream.status, None,
                             f"{type(exc).__name__}: {exc}")
                return _reset(request)
        if error is None and upstream.status != 200:
            error = _error_text(answer) or f"HTTP {upstream.status}"
        self._record(body, shape, kind, arrival, upstream.status, answer, error, reader_left)
        return out

    async def _call(self, request: web.BaseRequest, raw: bytes, headers: dict[str, str], call: str | None,
                    arrival: Arrival) -> web.StreamResponse:
        """Any other request, passed on whole; recorded as `call` (None: not recorded)."""
        fetch = asyncio.ensure_future(self._fetch(request, raw, headers))
        left = asyncio.ensure_future(_caller_left(request))
        try:
            await asyncio.wait((fetch, left), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            fetch.cancel()
            raise
        finally:
            left.cancel()
        if not fetch.done():
            fetch.cancel()
            if call is not None:
                self.write_call(call, arrival, CLIENT_GONE, _call_detail(call, CLIENT_GONE, None))
            return _reset(request)
        try:
            status, reason, upstream_headers, data = fetch.result()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.refuse()
            if call is not None:
                status = 504 if isinstance(exc, TimeoutError) else 502
                self.write_call(call, arrival, status, _call_detail(call, status, None, exc))
            return _reset(request)
        out = web.StreamResponse(status=status, reason=reason)
        for k, v in upstream_headers:
            if k.lower() not in _HOP_HEADERS:
                out.headers.add(k, v)
        answered = status
        try:
            await out.prepare(request)
            await out.write(data)
            await out.write_eof()
        except ConnectionResetError:
            answered = CLIENT_GONE  # the engine answered; the caller had gone
        if call is not None and not (call == GENERATE and 200 <= status < 300):
            self.write_call(call, arrival, answered, _call_detail(call, status, data))
        return out

    async def _fetch(self, request: web.BaseRequest, raw: bytes,
                     headers: dict[str, str]) -> tuple[int, str | None, list[tuple[str, str]], bytes]:
        assert self._http is not None
        async with self._http.request(request.method, self.backend + request.path_qs, data=raw or None,
                                      headers=headers) as upstream:
            data = await upstream.read()
            return upstream.status, upstream.reason, list(upstream.headers.items()), data

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

    def _record(self, body: dict[str, Any], shape: dict[str, Any], kind: str, arrival: Arrival, status: int,
                answer: Any, error: str | None, reader_left: bool = False) -> None:
        if self._writer is None:
            return
        told = body.get("kv_transfer_params")
        back = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        self._seq += 1
        request_id = (str(answer.get("id")) if isinstance(answer, dict) and answer.get("id")
                      else f"relay-{self.name}-{self._seq}")
        self._writer.write(leg_line(
            self.name, self.spec.role, self.connector, arrival.engine_id, arrival.generation, kind,
            request_id, prompt_text(body), bool(body.get("stream")), status, error,
            time.monotonic() - arrival.started, reader_left, told, back, leg=shape, tag=tag_of_openai(body),
            caller=arrival.caller))


def leg_line(engine: str, role: str, connector: str, engine_id: str | None, generation: int, kind: str,
             request_id: str, prompt: str, stream: bool, status: int, error: str | None, duration_s: float,
             reader_left: bool, told: Any, answered: Any, *, leg: dict[str, Any] | None, tag: str | None,
             caller: str) -> dict[str, Any]:
    """One line of a relay's legs file (CONTRACTS.md §13), from either surface."""
    return {
        "ts": time.time(), "engine": engine, "role": role, "connector": connector,
        "engine_id": engine_id, "generation": generation, "kind": kind, "request_id": request_id,
        "prompt": prompt, "stream": stream, "status": status, "error": error,
        "duration_s": round(duration_s, 6), "reader_left": reader_left,
        "told": told if isinstance(told, dict) else None,
        "answered": answered if isinstance(answered, dict) else None,
        "leg": leg, "tag": tag, "caller": caller,
    }


def _call_detail(call: str, status: int, data: bytes | None,
                 exc: BaseException | None = None) -> dict[str, Any]:
    """What a call line tells beyond its status: whether a health check found the engine healthy; a refused
    completion's error (its body told no request, tag or shape)."""
    if call == HEALTH:
        return {"healthy": 200 <= status < 300 and exc is None}
    if call == GENERATE:
        error = (f"{type(exc).__name__}: {exc}" if exc is not None
                 else _error_text(_json_or_none(data or b"")) or f"HTTP {status}")
        return {"request_id": None, "tag": None, "leg": None, "error": error}
    return {}


async def _caller_left(request: web.BaseRequest) -> None:
    """Returns once the caller's connection is gone (aiohttp does not cancel a handler when it goes)."""
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(CALLER_POLL_S)


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
