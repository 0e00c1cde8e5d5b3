"""One generation request as both surfaces hand it to the engine, its answer, the error that refuses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from fake_engines.core import tokenizer
from fake_engines.core.calls import leg_of_openai
from fake_engines.core.chat import render_chat
from fake_engines.core.generator import DEFAULT_MAX_TOKENS, token_pieces
from pdchaos.openai_request import context_problem, request_problem, text_too_long
from pdchaos.stop_strings import stop_strings

# The context length the fakes report (`/v1/models` max_model_len, GetModelInfo max_context_length) and
# hold every request to: prompt plus completion, like vLLM's max_model_len.
MAX_MODEL_LEN = 32768


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
    # The leg as it reached the engine (`core.calls.leg_shape`), for its records; None: not told.
    leg: dict[str, Any] | None = None
    # The request's stop strings (vLLM's `stop`): the output ends where one of them begins.
    stop: tuple[str, ...] = ()
    # vLLM's end of sequence: masked below `min_tokens`; with `ignore_eos`, sampled without stopping.
    min_tokens: int = 0
    ignore_eos: bool = False


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
        """Per-token text pieces; joined they equal `text` (output tokens are whole words). A stop string
        cuts the last piece where it begins (that piece may be empty: it still carries the finish)."""
        out, left = [], len(self.text)
        for piece in token_pieces(self.token_ids):
            out.append(piece[:left])
            left = max(0, left - len(piece))
        return out


def parse_kv_params(raw: Any) -> dict[str, Any] | None:
    """A request's `kv_transfer_params` field: absent/null -> None; anything but an object -> 400."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RequestError(400, "kv_transfer_params must be an object")
    return raw


def max_tokens_problem(max_tokens: int) -> str | None:
    """Why `max_tokens` cannot be served (the 400 message), or None. Bounded by the context too: the
    generator's work grows with it, and an unbounded one holds the engine's loop forever."""
    if max_tokens < 1:
        return "max_tokens must be at least 1"
    return context_problem(None, max_tokens, MAX_MODEL_LEN)


def budget_problem(prompt_ids: list[int], max_tokens: int) -> str | None:
    """The prompt plus the completion must fit the model's context (vLLM's 400)."""
    if max_tokens < 1:
        return "max_tokens must be at least 1"
    return context_problem(len(prompt_ids), max_tokens, MAX_MODEL_LEN)


@lru_cache(maxsize=1)
def _max_token_chars() -> int:
    """A bound on the text one token of the shipped tokenizer stands for (byte-level vocabulary entries
    spell one character per byte, so an entry is never shorter than its text)."""
    return max((len(t) for t in tokenizer.load_tokenizer().get_vocab(with_added_tokens=True)), default=1)


def encode_bounded(text: str) -> list[int]:
    """Token ids of a prompt text; RequestError 400 for text that is not valid Unicode or that cannot fit
    the context (refused before tokenizing it: megabytes take seconds)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(400, "prompt is not valid Unicode text (a lone surrogate)") from None
    too_long = text_too_long(text, MAX_MODEL_LEN, _max_token_chars())
    if too_long is not None:
        raise RequestError(400, too_long)
    return tokenizer.encode(text)


def _int_field(body: dict[str, Any], key: str, default: int | None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(400, f"{key} must be an integer")
    return v


def decode_prompt_ids(ids: list[int]) -> str:
    """Prompt text of a tokenized request; ValueError on ids outside the vocabulary."""
    size = tokenizer.vocab_size()
    if any(not 0 <= int(t) < size for t in ids):
        raise ValueError(f"token id out of range [0, {size})")
    return tokenizer.decode(list(ids))


def prompt_of(body: dict[str, Any]) -> tuple[str, list[int]]:
    """A completion's prompt (text, or token ids; batches of one) as text and token ids; 400 otherwise."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt, encode_bounded(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        try:
            return decode_prompt_ids(prompt), [int(t) for t in prompt]
        except ValueError as exc:
            raise RequestError(400, str(exc)) from exc
    raise RequestError(400, "prompt must be a string or a non-empty list of token ids (batches of one)")


def model_problem(body: dict[str, Any], served: str) -> RequestError | None:
    """A body naming a model the engine does not serve: vLLM's 404 NotFoundError (serving.py `_check_model`,
    before any other check)."""
    model = body.get("model")
    if model is not None and model != served:
        return RequestError(404, f"The model `{model}` does not exist.", "NotFoundError")
    return None


def gen_request_from_openai(
    body: dict[str, Any], chat: bool, request_id: str, default_seed: int | None, *, grpc: bool = False,
    served_model: str | None = None,
) -> tuple[GenRequest, bool]:
    """An OpenAI completion or chat body as the engine's request, and whether it streams (400s as
    RequestError). `request_id`: the name the caller gave (else a fresh one, the shell's choice); `grpc`:
    the body came as a router's Generate request (its leg shape, `core.calls.leg_of_openai`; no model name
    travels); `served_model`: the model the engine serves over HTTP (another is a 404)."""
    if served_model is not None and not grpc:
        wrong = model_problem(body, served_model)
        if wrong is not None:
            raise wrong
    problem = request_problem(body, chat)
    if problem is not None:
        raise RequestError(400, problem)
    if chat:
        try:
            text = render_chat(body.get("messages"))  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise RequestError(400, f"bad messages: {exc}") from exc
        ids = encode_bounded(text)
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        text, ids = prompt_of(body)
        max_key = "max_tokens"
    max_tokens = _int_field(body, max_key, DEFAULT_MAX_TOKENS)
    seed = _int_field(body, "seed", default_seed)
    # The shared check allowed only a boolean or null here.
    stream = bool(body.get("stream"))
    kv = parse_kv_params(body.get("kv_transfer_params"))
    budget = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    problem = budget_problem(ids, budget)
    if problem is not None:
        raise RequestError(400, problem)
    leg = leg_of_openai(body, chat, grpc=grpc)
    low = _int_field(body, "min_tokens", 0) or 0
    return GenRequest(request_id, text, ids, budget, seed, kv, leg, stop_strings(body), low,
                      bool(body.get("ignore_eos"))), stream
