"""OpenAI-compatible HTTP surface, shaped like vLLM's (`/v1/completions`, `/v1/chat/completions`, ...).

Every call it answers leaves an engine call record (`core.calls`), or, for a served leg, its handoff record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from fake_engines.core import calls
from fake_engines.core.gen_request import (
    MAX_MODEL_LEN,
    GenRequest,
    GenResult,
    RequestError,
    gen_request_from_openai,
    max_tokens_problem,
)
from fake_engines.core.request_fields import IGNORED_FIELDS_LOG, ignored_fields
from fake_engines.engine import Arrival, Engine

log = logging.getLogger(__name__)

VERSION = "0.11.0+pdchaos"

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, err_type: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": err_type or _ERROR_TYPES.get(status, "APIError"),
            "param": None,
            "code": status,
        }
    }


def error_response(status: int, message: str, err_type: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, err_type), status=status)


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, f"malformed JSON body: {exc}") from exc
    except RecursionError:
        raise RequestError(400, "malformed JSON body: nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


Answer = Callable[[], Awaitable[tuple[web.Response, dict[str, Any] | None]]]


# How often an open call looks whether its caller hung up: the resolution of a let-go call's duration.
LEAVING_POLL_S = 0.01


def client_gone(request: web.Request) -> bool:
    """Whether the caller hung up: aiohttp lets a handler run on after that (no handler cancellation), so
    whatever it answers goes nowhere."""
    transport = request.transport
    return transport is None or transport.is_closing()


class RecordedCalls:
    """The calls one aiohttp app answers for an engine, each recorded once however it ends.

    A caller that gives up does not cancel its handler (aiohttp's default): the handler records when it
    ends, as CLIENT_GONE. One parked on a wedge would outlive the app, so the app's cleanup cancels the
    handlers still open (their records are written before the engine's records file closes)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._open: set[asyncio.Task[Any]] = set()

    def install(self, app: web.Application) -> None:
        app.on_cleanup.append(self._cut_open)

    @contextmanager
    def open(self) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None  # aiohttp runs every handler in a task
        self._open.add(task)
        try:
            yield
        finally:
            self._open.discard(task)

    async def _cut_open(self, app: web.Application) -> None:
        tasks = [t for t in self._open if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    async def answer(self, request: web.Request, call: str, answer: Answer) -> web.Response:
        """Answer with `answer()` (it passes its fault gate itself: the call arrived before) and record
        the call: the status answered, CLIENT_GONE when the caller is gone first or the handler is
        cancelled. A call the caller left is timed to when it left (how long the caller held it), not to
        when the handler got round to ending."""
        arrival = self.engine.arrival(request.headers.get(calls.CALLER_HEADER))
        status, detail = 500, None
        left: list[float] = []
        watch = asyncio.ensure_future(self._note_leaving(request, left))
        with self.open():
            try:
                resp, detail = await answer()
                status = resp.status
                return resp
            except asyncio.CancelledError:
                status = calls.CLIENT_GONE
                raise
            finally:
                watch.cancel()
                if client_gone(request):
                    status = calls.CLIENT_GONE
                ended = left[0] if left and status == calls.CLIENT_GONE else None
                self.engine.record_call(arrival, call, status, detail, ended=ended)

    async def _note_leaving(self, request: web.Request, left: list[float]) -> None:
        """Note (in `left`) when the caller hangs up while the handler still runs."""
        while not client_gone(request):
            await asyncio.sleep(LEAVING_POLL_S)
        left.append(self.engine.now())


@dataclass
class _LegCall:
    """What a generation call has told so far, for the record of a leg the engine never got (`handed`:
    given to `Engine.generate`, which records it from then on)."""

    arrival: Arrival
    request_id: str | None = None
    tag: str | None = None
    shape: dict[str, Any] | None = None
    handed: bool = False


class HttpSurface:
    """Builds the aiohttp app around one Engine (the app is rebuilt on every restart)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.recorded = RecordedCalls(engine)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        self.recorded.install(app)
        return app

    async def health(self, request: web.Request) -> web.Response:
        async def answer() -> tuple[web.Response, dict[str, Any]]:
            await self.engine.faults.gate("health")
            state = self.engine.state
            if not state.healthy:
                text = "engine dead" if state.dead else "shutting down"
                return web.Response(status=503, text=text), {"healthy": False}
            return web.Response(status=200), {"healthy": True}

        return await self.recorded.answer(request, calls.HEALTH, answer)

    async def models(self, request: web.Request) -> web.Response:
        return await self._metadata(request, calls.MODELS, self._models)

    async def version(self, request: web.Request) -> web.Response:
        return await self._metadata(request, calls.VERSION, lambda: web.json_response({"version": VERSION}))

    async def metrics(self, request: web.Request) -> web.Response:
        return await self._metadata(request, calls.METRICS, self._metrics)

    async def _metadata(
        self, request: web.Request, call: str, respond: Callable[[], web.Response]
    ) -> web.Response:
        """A metadata call: past the metadata fault gate, `respond()`, with no detail to record."""

        async def answer() -> tuple[web.Response, None]:
            await self.engine.faults.gate("metadata")
            return respond(), None

        return await self.recorded.answer(request, call, answer)

    def _models(self) -> web.Response:
        name = self.engine.config.model
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": name,
                        "parent": None,
                        "max_model_len": MAX_MODEL_LEN,
                        "permission": [],
                    }
                ],
            }
        )

    def _metrics(self) -> web.Response:
        e = self.engine.state
        label = f'model_name="{e.config.model}"'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{label}}} {e.active}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{label}}} 0",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{label}}} {e.prompt_tokens_total}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{label}}} {e.generation_tokens_total}",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{{{label}}} {e.served}",
            "# TYPE pdchaos_engine_generation gauge",
            f"pdchaos_engine_generation {e.identity.generation}",
            "# TYPE pdchaos_handoff_total counter",
        ]
        lines += [f'pdchaos_handoff_total{{outcome="{k}"}} {v}' for k, v in sorted(e.outcome_counts.items())]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # -- generation -----------------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def _request_id(self, body: dict[str, Any], chat: bool, header_id: str | None) -> str:
        # Like vLLM: a caller's X-Request-Id (or body request_id) names the request, else a fresh id.
        rid = body.get("request_id") or header_id
        return rid if isinstance(rid, str) and rid else f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        leg = _LegCall(self.engine.arrival(request.headers.get(calls.CALLER_HEADER)))
        status, error = 500, "internal error"
        with self.recorded.open():
            try:
                return await self._serve_leg(request, chat, leg)
            except RequestError as exc:
                status, error = exc.status, exc.message
                return error_response(exc.status, exc.message, exc.err_type)
            except (asyncio.CancelledError, ConnectionError) as exc:
                status, error = calls.CLIENT_GONE, f"caller gone: {type(exc).__name__}"
                raise
            finally:
                if not leg.handed:
                    if client_gone(request):
                        status = calls.CLIENT_GONE
                    self.engine.refuse_leg(
                        leg.arrival, status, error, request_id=leg.request_id, tag=leg.tag, leg=leg.shape
                    )

    async def _serve_leg(self, request: web.Request, chat: bool, leg: _LegCall) -> web.StreamResponse:
        """Refusals before the engine gets the leg raise RequestError (real 400/404 statuses, not error
        chunks); from `Engine.generate` on, the engine records the leg."""
        body = _parse_body(await request.read())
        leg.shape, leg.tag = calls.leg_of_openai(body, chat), calls.tag_of_openai(body)
        extra = ignored_fields(body, chat)
        if extra:
            log.warning(IGNORED_FIELDS_LOG, set(extra))
        rid = leg.request_id = self._request_id(body, chat, request.headers.get("X-Request-Id"))
        req, stream = gen_request_from_openai(body, chat, rid, self.engine.config.seed,
                                              served_model=self.engine.config.model)
        problem = max_tokens_problem(req.max_tokens)
        if problem is not None:
            raise RequestError(400, problem)
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, req, chat, include_usage, leg)
        leg.handed = True
        try:
            result = await self.engine.generate(req, leg.arrival)
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.err_type)
        await asyncio.sleep(result.itl_s * max(0, len(result.token_ids) - 1))
        return web.json_response(self._full_body(result, chat))

    def _full_body(self, r: GenResult, chat: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": r.finish_reason,
            "stop_reason": None,
        }
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": r.text,
                "tool_calls": [],
                "reasoning_content": None,
            }
        else:
            choice["text"] = r.text
            choice["prompt_logprobs"] = None
        return {
            "id": r.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.engine.config.model,
            "choices": [choice],
            "usage": _usage(r),
            "prompt_logprobs": None,
            "kv_transfer_params": r.kv_transfer_params,
        }

    async def _stream(
        self, request: web.Request, req: GenRequest, chat: bool, include_usage: bool, leg: _LegCall
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        def chunk(delta: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                d: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
                if delta is not None:
                    d["content"] = delta
                c["delta"] = d
            else:
                c["text"] = delta or ""
                c["stop_reason"] = None
            return {
                "id": req.request_id,
                "object": obj,
                "created": created,
                "model": self.engine.config.model,
                "choices": [c],
            }

        async def send(data: dict[str, Any] | str) -> None:
            text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
            await resp.write(f"data: {text}\n\n".encode())

        leg.handed = True
        try:
            result = await self.engine.generate(req, leg.arrival)
        except RequestError as exc:
            await send(error_body(exc.status, exc.message, exc.err_type))
            await send("[DONE]")
            await resp.write_eof()
            return resp
        if chat:
            await send(chunk(None, None, first=True))
        pieces = result.token_texts()
        for i, piece in enumerate(pieces):
            if i > 0 and result.itl_s > 0:
                await asyncio.sleep(result.itl_s)
            last = i == len(pieces) - 1
            await send(chunk(piece, result.finish_reason if last else None))
        if include_usage:
            usage_chunk = chunk(None, None)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = _usage(result)
            await send(usage_chunk)
        await send("[DONE]")
        await resp.write_eof()
        return resp


def _usage(r: GenResult) -> dict[str, Any]:
    n = len(r.token_ids)
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": r.prompt_tokens + n,
        "prompt_tokens_details": None,
    }
