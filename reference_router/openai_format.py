"""OpenAI request parsing and response shapes for answers the router builds itself (gRPC decode legs)."""

from __future__ import annotations

import json
import time
from typing import Any

from .errors import RouterError
from .tokenizer import TextCodec

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def validate_body(endpoint: str, body: Any) -> dict[str, Any]:
    """The checks every request passes before any worker is chosen; RouterError 400 otherwise."""
    if not isinstance(body, dict):
        raise RouterError(400, "invalid_request", "request body must be a JSON object")
    if endpoint == CHAT:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise RouterError(400, "invalid_request", "messages must be a non-empty list of objects")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, (str, list)) or (isinstance(prompt, list) and not prompt):
            raise RouterError(400, "invalid_request", "prompt must be a string or a non-empty list")
    for key in ("max_tokens", "n", "max_completion_tokens"):
        val = body.get(key)
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            raise RouterError(400, "invalid_request", f"{key} must be a positive integer")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise RouterError(400, "invalid_request", "stream must be a boolean")
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise RouterError(400, "invalid_request", "kv_transfer_params must be an object")
    return body


def prompt_of(endpoint: str, body: dict[str, Any], codec: TextCodec) -> tuple[str, list[int]]:
    """(text, token ids) of a request, for a tokenized gRPC leg."""
    if endpoint == CHAT:
        try:
            text = codec.render_chat(body["messages"])
        except ValueError as exc:
            raise RouterError(400, "invalid_request", str(exc)) from exc
        return text, codec.encode(text)
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, codec.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return codec.decode(prompt), list(prompt)
    raise RouterError(400, "invalid_request", "gRPC workers take one prompt (a string or token ids)")


def completion_response(
    endpoint: str, request_id: str, model: str, text: str, finish_reason: str | None,
    prompt_tokens: int, completion_tokens: int,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason or "stop", "logprobs": None}
    if endpoint == CHAT:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": request_id,
        "object": "chat.completion" if endpoint == CHAT else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_event(endpoint: str, request_id: str, model: str, delta: str, finish_reason: str | None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if endpoint == CHAT:
        choice["delta"] = {"content": delta} if delta or finish_reason is None else {}
    else:
        choice["text"] = delta
    chunk = {
        "id": request_id,
        "object": "chat.completion.chunk" if endpoint == CHAT else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    return sse(chunk)


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
