"""Deterministic output: a function of the KV the decode holds, the seed and the position.

For a local run or a correct handoff the KV digest is the prompt's digest, so the harness can compute the
expected text (``expected_completion``). A decode handed another request's KV generates from that KV's digest:
different text.
Output tokens come from a fixed list of ordinary word tokens, so every output decodes to plain words.
Each answer also has a natural length (`natural_length`): there the model samples its end-of-sequence token,
and the answer ends with finish reason "stop", as vLLM's does, unless `ignore_eos` or `min_tokens` keeps it
going.
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
# Natural lengths run over this many positions: for a seed-0 request, an answer ends by itself before its
# max_tokens N with odds N in 2**20, so a run's answers almost all reach their cap (what every history before
# this model showed). A client that wants a short answer picks its seed (`seed_for_length`).
LENGTH_PERIOD = 1 << 20


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


def natural_length(kv_digest: str, seed: int | None = None) -> int:
    """The position where the model samples end of sequence for the prompt whose KV digest this is (0: the
    answer is empty). The KV sets it and the seed shifts it, as a sampled model's length depends on both."""
    return (_length_bits(kv_digest) - (0 if seed is None else int(seed))) % LENGTH_PERIOD


def seed_for_length(kv_digest: str, length: int) -> int:
    """The seed that gives this prompt an answer of `length` tokens before end of sequence."""
    return (_length_bits(kv_digest) - length) % LENGTH_PERIOD


def _length_bits(kv_digest: str) -> int:
    # The digest's first 20 bits (five hex digits): one period of natural lengths.
    return int(kv_digest[:5], 16)


def generate_ids(
    kv_digest: str, max_tokens: int, seed: int | None = None, *, min_tokens: int = 0, ignore_eos: bool = False
) -> list[int]:
    """The output ids determined by (kv_digest, seed, position): word tokens up to ``max_tokens``, ended early
    by the end-of-sequence id at the answer's natural length (`answer_ids`). ``seed`` None means 0: the
    harness must be able to predict unseeded requests too."""
    return answer_ids(kv_digest, max_tokens, seed, min_tokens=min_tokens, ignore_eos=ignore_eos)[0]


def answer_ids(
    kv_digest: str, max_tokens: int, seed: int | None = None, *, min_tokens: int = 0, ignore_eos: bool = False
) -> tuple[list[int], bool]:
    """(output ids, whether end of sequence ended them). As vLLM: below ``min_tokens`` end of sequence is
    masked (a word is sampled instead); with ``ignore_eos`` its id is sampled and generation goes on; else it
    is the last id, and it ends the answer even at the length cap (vLLM checks it before the cap)."""
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    s = 0 if seed is None else int(seed)
    ids = list(_generate_ids(kv_digest, max_tokens, s))
    end = natural_length(kv_digest, s)
    if end >= max_tokens or end < min_tokens:
        return ids, False
    if ignore_eos:
        ids[end] = _eos_id()
        return ids, False
    return [*ids[:end], _eos_id()], True


@lru_cache(maxsize=1)
def _eos_id() -> int:
    return tokenizer.eos_token_id()


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
    """Text of each id on its own (for streaming); joined they are `answer_text`. End of sequence has no
    text: vLLM skips special tokens in an answer by default."""
    eos = _eos_id()
    return ["" if t == eos else tokenizer.decode([t]) for t in ids]


def answer_text(ids: Sequence[int]) -> str:
    """An answer's text: its word tokens, end of sequence left out (the pieces of `token_pieces`, joined)."""
    eos = _eos_id()
    return tokenizer.decode([t for t in ids if t != eos])


def generate_text(kv_digest: str, max_tokens: int, seed: int | None = None) -> str:
    return answer_text(generate_ids(kv_digest, max_tokens, seed))


def text_digest(prompt: str) -> str:
    """The KV digest of a text prompt as an engine computes it."""
    return prompt_digest(tokenizer.encode(prompt))


def chat_digest(messages: Sequence[Mapping[str, Any]]) -> str:
    """The KV digest of a chat request's prompt (rendered by ``render_chat``)."""
    return text_digest(render_chat(messages))


def expected_completion(
    prompt: str, max_tokens: int, seed: int | None = None, stop: Sequence[str] = ()
) -> str:
    """What a correct handoff (or a local run) returns for a ``/v1/completions`` text prompt."""
    ids = generate_ids(text_digest(prompt), max_tokens, seed)
    _, stopped = stop_at(ids, stop)
    return answer_text(ids) if stopped is None else stopped


def expected_chat_completion(
    messages: Sequence[Mapping[str, Any]], max_tokens: int, seed: int | None = None, stop: Sequence[str] = ()
) -> str:
    """What a correct handoff returns for ``/v1/chat/completions`` (prompt rendered by ``render_chat``)."""
    return expected_completion(render_chat(messages), max_tokens, seed, stop)
