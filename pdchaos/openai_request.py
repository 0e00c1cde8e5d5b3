"""The checks of an OpenAI completion or chat request that the reference router and the fake engines share.

A client mistake must be a 400 wherever it lands: in the router before any leg runs, or in an engine that
is called directly. One set of rules keeps the two answers the same. Ranges follow vLLM's request
validation (what a real engine would refuse); the context checks follow its wording ("This model's maximum
context length is N tokens...").

`request_problem(body, chat)` -> the 400 message, or None. `context_problem(prompt_tokens, max_tokens,
context)` for the token budget once the prompt is tokenized; `text_too_long(text, context,
max_token_chars)` refuses a text too long for the context before spending time tokenizing it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Deeper JSON than this is nobody's OpenAI request; refusing it keeps every later walk and re-serialization
# far from Python's recursion limit.
MAX_JSON_DEPTH = 32
# Token ids travel as uint32 in the gRPC contract; the vocabulary check itself is the tokenizer owner's.
MAX_TOKEN_ID = 2**32 - 1
# Seeds travel as int32 in the gRPC contract: refuse what cannot be carried, on both transports alike.
SEED_RANGE = (-(2**31), 2**31 - 1)
MAX_STOP_SEQUENCES = 64

_FLOATS: dict[str, tuple[float, float, bool]] = {
    # name: (low, high, low inclusive)
    "temperature": (0.0, math.inf, True),
    "top_p": (0.0, 1.0, False),
    "min_p": (0.0, 1.0, True),
    "frequency_penalty": (-2.0, 2.0, True),
    "presence_penalty": (-2.0, 2.0, True),
    "repetition_penalty": (0.0, math.inf, False),
}
_BOOLS = ("stream", "ignore_eos", "echo", "skip_special_tokens", "include_stop_str_in_output")


_LEAF_TYPES = (int, float, bool, type(None))
_LONE_SURROGATE = "request holds a string that is not valid Unicode (a lone surrogate)"


def structure_problem(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """A parsed JSON value nested deeper than `limit`, else a string anywhere in it (keys too) that is not
    valid Unicode text: a lone surrogate, which JSON's \\ud800 escapes allow and no tokenizer or UTF-8
    encoder takes. One walk, without recursion (every leg of every request takes it: a simulation walks
    millions)."""
    # The answer does not depend on the order of the walk (too deep anywhere wins over bad text anywhere):
    # an object's plain values are looked at in place, not pushed.
    bad_text: str | None = None
    stack: list[tuple[Any, int]] = [(value, 1)]
    push, pop = stack.append, stack.pop
    while stack:
        item, depth = pop()
        if depth > limit:
            return f"JSON nested deeper than {limit} levels"
        cls = type(item)
        if cls in _LEAF_TYPES:
            continue
        if cls is str or isinstance(item, str):
            if bad_text is None and not item.isascii() and not _valid_text(item):
                bad_text = _LONE_SURROGATE
        elif cls is dict or isinstance(item, Mapping):
            inline = depth < limit  # its children are within the limit
            for key, child in item.items():
                if bad_text is None and isinstance(key, str) and not key.isascii() and not _valid_text(key):
                    bad_text = _LONE_SURROGATE
                kind = type(child)
                if inline and kind in _LEAF_TYPES:
                    continue
                if inline and kind is str:
                    if bad_text is None and not child.isascii() and not _valid_text(child):
                        bad_text = _LONE_SURROGATE
                    continue
                push((child, depth + 1))
        elif cls is list or isinstance(item, list):
            for child in item:
                push((child, depth + 1))
    return bad_text


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _token_ids_problem(ids: list[Any], where: str) -> str | None:
    if not ids:
        return f"{where} must not be empty"
    if not all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in ids):
        return f"{where} must hold token ids (integers in [0, {MAX_TOKEN_ID}])"
    return None


def prompt_problem(prompt: Any) -> str | None:
    """A completion's prompt: a string, token ids, or a batch of one of those."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, str | list) for p in prompt):
            return "prompt batches of more than one are not supported"
        return _token_ids_problem(prompt, "prompt")
    return "prompt must be a string or a non-empty list of token ids"


def _is_text_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)


def messages_problem(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list of objects"
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            return f"message {i} must be an object"
        role = m.get("role")
        if not isinstance(role, str) or not role:
            return f"message {i} needs a string 'role'"
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(_is_text_part(p) for p in content):
            return f"message {i}: content must be a string or a list of text parts"
    return None


def _sampling_problem(body: Mapping[str, Any]) -> str | None:
    for name, (low, high, low_inclusive) in _FLOATS.items():
        v = body.get(name)
        if v is None:
            continue
        if not _is_number(v):
            return f"{name} must be a number"
        if v < low or (v == low and not low_inclusive) or v > high:
            return f"{name} must be in {'[' if low_inclusive else '('}{low:g}, {high:g}], got {v}"
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or not -1 <= top_k <= MAX_TOKEN_ID):
        return "top_k must be an integer, -1 (off) or more"
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
        return f"seed must be an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]"
    for name in _BOOLS:
        if body.get(name) is not None and not isinstance(body[name], bool):
            return f"{name} must be a boolean"
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            return "stop must be a string or a list of strings"
        if len(stop) > MAX_STOP_SEQUENCES:
            return f"stop takes at most {MAX_STOP_SEQUENCES} sequences"
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and (not isinstance(stop_ids, list) or _token_ids_problem(stop_ids or [0], "x")):
        return "stop_token_ids must be a list of token ids"
    return None


def _lengths_problem(body: Mapping[str, Any], chat: bool) -> str | None:
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is not None and (not _is_int(v) or v < 1):
            return f"{key} must be a positive integer"
        if v is not None and v > MAX_TOKEN_ID:
            # Beyond any context, and beyond what the gRPC contract can carry (uint32).
            return f"{key} {v} is out of range (at most {MAX_TOKEN_ID})"
    min_tokens = body.get("min_tokens")
    if min_tokens is not None:
        if not _is_int(min_tokens) or min_tokens < 0:
            return "min_tokens must be an integer >= 0"
        most = max_tokens_of(body, chat)
        if most is not None and min_tokens > most:
            return "min_tokens must not exceed max_tokens"
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        return "only n=1 is supported"
    return None


def _stream_options_problem(body: Mapping[str, Any]) -> str | None:
    opts = body.get("stream_options")
    if opts is None:
        return None
    if not isinstance(opts, Mapping):
        return "stream_options must be an object"
    if not body.get("stream"):
        return "stream_options can only be given when stream is true"
    for key in ("include_usage", "continuous_usage_stats"):
        if opts.get(key) is not None and not isinstance(opts[key], bool):
            return f"stream_options.{key} must be a boolean"
    return None


def request_problem(body: Any, chat: bool) -> str | None:
    """Why an OpenAI `/v1/completions` (chat=False) or `/v1/chat/completions` body is a client mistake
    (the 400 message), or None. The context budget is checked apart (`context_problem`): it needs the
    prompt's token count."""
    if not isinstance(body, Mapping):
        return "request body must be a JSON object"
    structure = structure_problem(body)
    if structure is not None:
        return structure
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return "model must be a string"
    main = messages_problem(body.get("messages")) if chat else prompt_problem(body.get("prompt"))
    if main is not None:
        return main
    for check in (_lengths_problem(body, chat), _sampling_problem(body), _stream_options_problem(body)):
        if check is not None:
            return check
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, Mapping):
        return "kv_transfer_params must be an object"
    rid = body.get("request_id")
    if rid is not None and not isinstance(rid, str):
        return "request_id must be a string"
    return None


def max_tokens_of(body: Mapping[str, Any], chat: bool) -> int | None:
    """The completion budget a request asks for (None: the server's default). Chat prefers
    `max_completion_tokens`, the newer name."""
    keys = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    for key in keys:
        v = body.get(key)
        if _is_int(v):
            return int(v)
    return None


def context_problem(prompt_tokens: int | None, max_tokens: int | None, context: int) -> str | None:
    """The request does not fit the model's context: vLLM's 400. `prompt_tokens` None: not known yet (the
    prompt has at least one token)."""
    prompt = 1 if prompt_tokens is None else prompt_tokens
    if prompt_tokens is not None and prompt_tokens >= context:
        return (f"This model's maximum context length is {context} tokens. However, your prompt has "
                f"{prompt_tokens} tokens. Please reduce the length of the prompt.")
    if max_tokens is not None and prompt + max_tokens > context:
        said = f"{prompt_tokens} in the prompt" if prompt_tokens is not None else "at least 1 in the prompt"
        return (f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is {context} "
                f"tokens and your request has {said} ({max_tokens} > {context} - {prompt}).")
    return None


def text_too_long(text: str, context: int, max_token_chars: int) -> str | None:
    """A text no tokenizer whose tokens are at most `max_token_chars` long could fit in `context` tokens:
    refused before tokenizing it (tokenizing megabytes holds an event loop for seconds)."""
    if len(text) > context * max(1, max_token_chars):
        return (f"This model's maximum context length is {context} tokens. However, your prompt has more "
                f"than {context} tokens ({len(text)} characters). Please reduce the length of the prompt.")
    return None
