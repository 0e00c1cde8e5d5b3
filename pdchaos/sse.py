"""Server-sent events as OpenAI-compatible servers stream them: `data: {json}` lines, `data: [DONE]` last.

One reader for every client in the project (the harness's load, the tests, the benches): `parse_sse` splits a
body into chunks, `stream_text` joins the generated text and names the first error chunk.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


@dataclass
class SseBody:
    """The `data:` payloads of an SSE body: decoded chunks, `[DONE]` seen or not, undecodable payloads."""

    chunks: list[Any] = field(default_factory=list)
    done: bool = False
    bad: list[str] = field(default_factory=list)
    payloads: list[str] = field(default_factory=list)


def parse_sse(body: str | bytes | Iterable[str]) -> SseBody:
    """Parse an SSE body (text, bytes or lines). Lines that are not `data:` lines are ignored."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    lines = body.splitlines() if isinstance(body, str) else body
    out = SseBody()
    for raw in lines:
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        out.payloads.append(payload)
        if payload == DONE:
            out.done = True
            continue
        try:
            out.chunks.append(json.loads(payload))
        except json.JSONDecodeError:
            out.bad.append(payload)
    return out


def choice_text(obj: Any, chat: bool, streaming: bool) -> str | None:
    """The text of the first choice of a completion (chunk): `text`, or the chat `delta`/`message` content."""
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    if not chat:
        t = c.get("text")
        return t if isinstance(t, str) else None
    part = c.get("delta" if streaming else "message")
    if isinstance(part, dict):
        t = part.get("content")
        return t if isinstance(t, str) else None
    return None


def error_message(obj: Any) -> str | None:
    """The message of an `{"error": ...}` chunk or body (None when it is not one)."""
    if not isinstance(obj, dict) or obj.get("error") is None:
        return None
    err = obj["error"]
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)


def stream_text(body: str | bytes | Iterable[str], chat: bool) -> tuple[str, str | None, bool]:
    """(joined text, first error, saw `[DONE]`) of a streamed completion."""
    parsed = parse_sse(body)
    text: list[str] = []
    error: str | None = None
    if parsed.bad:
        error = f"bad SSE chunk: {parsed.bad[0][:80]}"
    for chunk in parsed.chunks:
        msg = error_message(chunk)
        if msg is not None:
            error = error or msg
            continue
        piece = choice_text(chunk, chat, streaming=True)
        if piece:
            text.append(piece)
    return "".join(text), error, parsed.done


def error_text(body: Any, raw: bytes) -> str:
    """What a client makes of an error answer: `code: message`, else the start of the raw body."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        e = body["error"]
        code = e.get("code")
        msg = e.get("message")
        return f"{code}: {msg}" if code else str(msg)
    return raw[:200].decode("utf-8", "replace") or "empty body"
