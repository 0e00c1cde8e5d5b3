"""One generation request as both surfaces hand it to the engine, its answer, the error that refuses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fake_engines.core.generator import token_pieces


class RequestError(Exception):
    """A request the engine answers with an error: HTTP status (mapped to a gRPC code by that surface)."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


@dataclass
class GenRequest:
    """One generation request, normalised from either surface."""

    request_id: str
    prompt_text: str
    prompt_ids: list[int]
    max_tokens: int
    seed: int | None
    kv_params: dict[str, Any] | None


@dataclass
class GenResult:
    """Everything a surface needs to answer; streaming surfaces pace `token_ids` with `itl_s`."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    kv_transfer_params: dict[str, Any] | None
    itl_s: float
    record: dict[str, Any] = field(default_factory=dict)

    def token_texts(self) -> list[str]:
        """Per-token text pieces; joined they equal `text` (output tokens are whole words)."""
        return token_pieces(self.token_ids)


def parse_kv_params(raw: Any) -> dict[str, Any] | None:
    """A request's `kv_transfer_params` field: absent/null -> None; anything but an object -> 400."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RequestError(400, "kv_transfer_params must be an object")
    return raw


def max_tokens_problem(max_tokens: int) -> str | None:
    """Why `max_tokens` cannot be served (the 400 message), or None."""
    return "max_tokens must be at least 1" if max_tokens < 1 else None
