"""The fake model as the shell sees it: tokenizer, deterministic output and KV payload (all from the core)."""

from __future__ import annotations

from collections.abc import Sequence

from fake_engines.core import generator, tokenizer
from fake_engines.core.wire import fake_kv_bytes

prompt_digest = generator.prompt_digest
output_digest = generator.output_digest
tokenize = tokenizer.encode
detokenize = tokenizer.decode
token_pieces = generator.token_pieces


def complete(kv_digest: str, max_tokens: int, seed: int | None) -> tuple[str, list[int], str]:
    """(text, token ids, finish_reason) generated from the KV identified by `kv_digest`."""
    ids = generator.generate_ids(kv_digest, max_tokens, seed)
    return tokenizer.decode(ids), ids, generator.FINISH_REASON


def kv_payload(digest: str | None, n_tokens: int) -> bytes:
    return fake_kv_bytes(digest or "", n_tokens)


def decode_prompt_ids(ids: Sequence[int]) -> str:
    """Prompt text of a tokenized request; ValueError on ids outside the vocabulary."""
    size = tokenizer.vocab_size()
    if any(not 0 <= int(t) < size for t in ids):
        raise ValueError(f"token id out of range [0, {size})")
    return tokenizer.decode(list(ids))
