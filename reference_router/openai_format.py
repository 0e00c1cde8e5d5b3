"""OpenAI request parsing and response shapes for answers the router builds itself (gRPC decode legs)."""

from __future__ import annotations

import json
import time
from typing import Any

from pdchaos.openai_request import context_problem, max_tokens_of, request_problem, text_too_long

from .errors import RouterError
from .tokenizer import TextCodec

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def validate_body(endpoint: str, body: Any) -> dict[str, Any]:
    """The checks every request passes before any worker is chosen (the rules the fake engines apply too:
    `pdchaos.openai_request`); RouterError 400 otherwise."""
    problem = request_problem(body, chat=endpoint == CHAT)
    if problem is not None:
        raise RouterError(400, "invalid_request", problem)
    return body


def check_budget(endpoint: str, body: dict[str, Any], prompt_tokens: int | None, context: int | None) -> None:
    """The request must fit the model's context (vLLM's 400), checked once before any leg runs; `context`
    None: no engine reported one, the engines judge for themselves."""
    if context is None:
        return
    problem = context_problem(prompt_tokens, max_tokens_of(body, endpoint == CHAT), context)
    if problem is not None:
        raise RouterError(400, "invalid_request", problem)


def prompt_of(endpoint: str, body: dict[str, Any], codec: TextCodec) -> tuple[str, list[int]]:
    """(text, token ids) of a request, for a tokenized gRPC leg. A text that cannot fit the model's context
    is refused before it is tokenized; token ids must be in the engine's vocabulary."""
    if endpoint == CHAT:
        try:
            text = codec.render_chat(body["messages"])
        except ValueError as exc:
            raise RouterError(400, "invalid_request", str(exc)) from exc
        return text, _encode(codec, text)
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, _encode(codec, prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        size = codec.vocab_size
        if not all(0 <= t < size for t in prompt):
            raise RouterError(400, "invalid_request", f"prompt token id out of the vocabulary [0, {size})")
        return codec.decode(prompt), list(prompt)
    raise RouterError(400, "invalid_request", "gRPC workers take one prompt (a string or token ids)")


def _encode(codec: TextCodec, text: str) -> list[int]:
    if codec.context_length is not None:
        too_long = text_too_long(text, codec.context_length, codec.max_token_chars)
        if too_long is not None:
            raise RouterError(400, "invalid_request", too_long)
    return codec.encode(text)


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
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _stream_chunk(endpoint: str, request_id: str, model: str, **fields: Any) -> bytes:
    """One SSE chunk of a streamed answer: the header every chunk carries, then `fields`."""
    return sse({
        "id": request_id,
        "object": "chat.completion.chunk" if endpoint == CHAT else "text_completion",
        "created": int(time.time()),
        "model": model,
        **fields,
    })


def stream_event(endpoint: str, request_id: str, model: str, delta: str, finish_reason: str | None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if endpoint == CHAT:
        choice["delta"] = {"content": delta} if delta or finish_reason is None else {}
    else:
        choice["text"] = delta
    return _stream_chunk(endpoint, request_id, model, choices=[choice])


def usage_event(
    endpoint: str, request_id: str, model: str, prompt_tokens: int, completion_tokens: int
) -> bytes:
    """The last chunk of a stream whose client asked `stream_options.include_usage`: no choices, the usage."""
    usage = _usage(prompt_tokens, completion_tokens)
    return _stream_chunk(endpoint, request_id, model, choices=[], usage=usage)


def wants_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
