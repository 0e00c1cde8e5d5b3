"""Deterministic output: a function of the KV the decode holds, the seed and the position.

For a local run or a correct handoff the KV digest is the prompt's digest, so the harness can compute the
expected text (``expected_completion``). A decode handed another request's KV generates from that KV's digest:
different text.
Output tokens come from a fixed list of ordinary word tokens, so every output decodes to plain words.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from fake_engines.core import tokenizer
from fake_engines.core.chat import render_chat
from pdchaos.stop_strings import cut_at_stop

FINISH_REASON = "length"
# vLLM's finish reason for an output a stop string ended.
STOP_REASON = "stop"
DEFAULT_MAX_TOKENS = 16


def prompt_digest(token_ids: Sequence[int]) -> str:
    """Hex sha256 of the token ids (comma-joined decimal), first 16 chars."""
    return _digest(tuple(token_ids))


@lru_cache(maxsize=8192)
def _digest(ids: tuple[int, ...]) -> str:
    # The prefill, the decode and the harness each digest the same prompt: compute it once.
    return hashlib.sha256(",".join(map(str, map(int, ids))).encode()).hexdigest()[:16]


def output_digest(token_ids: Sequence[int]) -> str:
    """Same hash as ``prompt_digest``, applied to the generated ids (the record's ``output_digest``)."""
    return prompt_digest(token_ids)


@lru_cache(maxsize=1)
def word_token_ids() -> tuple[int, ...]:
    """Vocabulary tokens that decode to a space plus 3+ lowercase ASCII letters, in id order."""
    tok = tokenizer.load_tokenizer()
    words = []
    for tid in range(tok.get_vocab_size(with_added_tokens=False)):
        text = tok.decode([tid], skip_special_tokens=False)
        body = text[1:]
        if text.startswith(" ") and len(body) >= 3 and body.isascii() and body.isalpha() and body.islower():
            words.append(tid)
    if len(words) < 64:
        raise RuntimeError(f"tokenizer has too few word tokens ({len(words)})")
    return tuple(words)


def generate_ids(kv_digest: str, max_tokens: int, seed: int | None = None) -> list[int]:
    """``max_tokens`` word-token ids determined by (kv_digest, seed, position). ``seed`` None means 0: the
    harness must be able to predict unseeded requests too."""
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    return list(_generate_ids(kv_digest, max_tokens, 0 if seed is None else int(seed)))


@lru_cache(maxsize=8192)
def _generate_ids(kv_digest: str, max_tokens: int, s: int) -> tuple[int, ...]:
    # The decode generates it and the harness predicts it: compute it once.
    words = word_token_ids()
    out = []
    for i in range(max_tokens):
        h = hashlib.sha256(f"{kv_digest}:{s}:{i}".encode()).digest()
        out.append(words[int.from_bytes(h[:8], "big") % len(words)])
    return tuple(out)


def stop_at(ids: Sequence[int], stops: Sequence[str]) -> tuple[list[int], str | None]:
    """vLLM's stop strings as the engine generates (`pdchaos.stop_strings`): the output ends with the first
    token whose text completes one of `stops`, cut where it begins. (the ids kept, the text), or (every id,
    None) when no stop string occurs."""
    if not stops:
        return list(ids), None
    text = ""
    for i, piece in enumerate(token_pieces(ids)):
        text += piece
        cut = cut_at_stop(text, stops)
        if len(cut) < len(text):
            return list(ids[: i + 1]), cut
    return list(ids), None


def token_pieces(ids: Sequence[int]) -> list[str]:
    """Text of each id on its own (for streaming); joined they equal ``decode(ids)`` for word tokens."""
    return [tokenizer.decode([t]) for t in ids]


def generate_text(kv_digest: str, max_tokens: int, seed: int | None = None) -> str:
    return tokenizer.decode(generate_ids(kv_digest, max_tokens, seed))


def expected_completion(
    prompt: str, max_tokens: int, seed: int | None = None, stop: Sequence[str] = ()
) -> str:
    """What a correct handoff (or a local run) returns for a ``/v1/completions`` text prompt."""
    ids = generate_ids(prompt_digest(tokenizer.encode(prompt)), max_tokens, seed)
    _, stopped = stop_at(ids, stop)
    return tokenizer.decode(ids) if stopped is None else stopped


def expected_chat_completion(
    messages: Sequence[Mapping[str, Any]], max_tokens: int, seed: int | None = None, stop: Sequence[str] = ()
) -> str:
    """What a correct handoff returns for ``/v1/chat/completions`` (prompt rendered by ``render_chat``)."""
    return expected_completion(render_chat(messages), max_tokens, seed, stop)
