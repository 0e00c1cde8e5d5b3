"""OpenAI-compatible HTTP surface, shaped like vLLM's (`/v1/completions`, `/v1/chat/completions`, ...)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

from fake_engines.core.gen_request import (
    MAX_MODEL_LEN,
    GenRequest,
    GenResult,
    RequestError,
    gen_request_from_openai,
    max_tokens_problem,
)
from fake_engines.engine import Engine

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


class HttpSurface:
    """Builds the aiohttp app around one Engine (the app is rebuilt on every restart)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    async def health(self, request: web.Request) -> web.Response:
        await self.engine.faults.gate("health")
        if not self.engine.state.healthy:
            return web.Response(status=503, text="engine dead" if self.engine.state.dead else "shutting down")
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        await self.engine.faults.gate("metadata")
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

    async def version(self, request: web.Request) -> web.Response:
        await self.engine.faults.gate("metadata")
        return web.json_response({"version": VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        await self.engine.faults.gate("metadata")
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

    def _gen_request(
        self, body: dict[str, Any], chat: bool, header_id: str | None = None
    ) -> tuple[GenRequest, bool]:
        prefix = "chatcmpl" if chat else "cmpl"
        # Like vLLM: a caller's X-Request-Id (or body request_id) names the request, else a fresh id.
        rid = body.get("request_id") or header_id
        rid = rid if isinstance(rid, str) and rid else f"{prefix}-{uuid.uuid4().hex}"
        return gen_request_from_openai(body, chat, rid, self.engine.config.seed)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = _parse_body(await request.read())
            model = body.get("model")
            if model is not None and model != self.engine.config.model:
                # vLLM answers a model it does not serve with 404 NotFoundError (serving.py `_check_model`).
                raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError")
            req, stream = self._gen_request(body, chat, request.headers.get("X-Request-Id"))
            # Refused before the stream starts, so it gets a real 400 status rather than an error chunk.
            problem = max_tokens_problem(req.max_tokens)
            if problem is not None:
                raise RequestError(400, problem)
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.err_type)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) if stream else False
        if not stream:
            try:
                result = await self.engine.generate(req)
            except RequestError as exc:
                return error_response(exc.status, exc.message, exc.err_type)
            await asyncio.sleep(result.itl_s * max(0, len(result.token_ids) - 1))
            return web.json_response(self._full_body(result, chat))
        return await self._stream(request, req, chat, include_usage)

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
        self, request: web.Request, req: GenRequest, chat: bool, include_usage: bool
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

        try:
            result = await self.engine.generate(req)
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
