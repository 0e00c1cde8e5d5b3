"""The fake model's tokenizer as the surfaces use it to read prompts (all from the core)."""

from __future__ import annotations

from collections.abc import Sequence

from fake_engines.core import tokenizer

tokenize = tokenizer.encode


def decode_prompt_ids(ids: Sequence[int]) -> str:
    """Prompt text of a tokenized request; ValueError on ids outside the vocabulary."""
    size = tokenizer.vocab_size()
    if any(not 0 <= int(t) < size for t in ids):
        raise ValueError(f"token id out of range [0, {size})")
    return tokenizer.decode(list(ids))
