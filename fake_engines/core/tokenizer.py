"""The one real tokenizer the fakes (and a gateway pointed at ``data_dir()``) use: byte-level BPE.

Files in ``fake_engines/data/`` are built by ``fake_engines/build_tokenizer.py`` and committed.
"""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ZIP_MEMBERS = ("tokenizer.json", "tokenizer_config.json", "config.json")
# fixed timestamp so the zip (and its sha256) is the same on every build
_ZIP_DATE = (2024, 1, 1, 0, 0, 0)


def data_dir() -> Path:
    """Folder holding tokenizer.json, tokenizer_config.json and config.json (a gateway's model_path)."""
    return Path(__file__).resolve().parent.parent / "data"


@lru_cache(maxsize=1)
def load_tokenizer() -> Tokenizer:
    """The shipped tokenizer, loaded once per process."""
    return Tokenizer.from_file(str(data_dir() / "tokenizer.json"))


def encode(text: str) -> list[int]:
    """Token ids of ``text``; special tokens written in the text become their single ids, nothing is added."""
    return list(_encode(text))


@lru_cache(maxsize=8192)
def _encode(text: str) -> tuple[int, ...]:
    # A prompt is tokenized by each engine that serves it and by the harness checking the answer: once is
    # enough (a simulation serves hundreds of thousands).
    if not text.isascii():
        return _encode_whole(text)
    ids: list[int] = []
    for n, segment in enumerate(_SPECIAL_SPLIT.split(text)):
        if n % 2:
            ids.append(token_id(segment))
        else:
            for piece in _ASCII_PRE_TOKEN.findall(segment):
                ids.extend(_encode_piece(piece))
    return tuple(ids)


def _encode_whole(text: str) -> tuple[int, ...]:
    return tuple(load_tokenizer().encode(text, add_special_tokens=False).ids)


# ASCII text is tokenized piece by piece, each piece once per process: the byte-level BPE never merges
# across the pieces its pre-tokenizer cuts (GPT-2's pattern, here for ASCII: \p{L} is [A-Za-z], \p{N} [0-9])
# or across the special tokens, which are matched first and verbatim. test_engine_core_tokenizer.py holds the
# two ways equal. Prompts repeat their words: a piece is looked up, not tokenized again.
_ASCII_PRE_TOKEN = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+", re.ASCII
)
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")


@lru_cache(maxsize=65536)
def _encode_piece(piece: str) -> tuple[int, ...]:
    if piece.isdigit() and piece.isascii() and (len(piece) == 1 or piece[0] != "0"):
        n = int(piece)  # str(n) == piece
        return _number_block(n // _NUMBER_BLOCK)[n % _NUMBER_BLOCK]
    return _encode_whole(piece)


# Every prompt's tag holds a new request number, in order: numbers are tokenized a block at a time, which
# keeps the tokenizer warm (one call at a time costs ten times as much inside a simulation).
_NUMBER_BLOCK = 256


@lru_cache(maxsize=64)
def _number_block(k: int) -> tuple[tuple[int, ...], ...]:
    """Token ids of each number from ``k * _NUMBER_BLOCK`` on, ``_NUMBER_BLOCK`` of them."""
    return tuple(_encode_whole(str(n)) for n in range(k * _NUMBER_BLOCK, (k + 1) * _NUMBER_BLOCK))


def decode(ids: Sequence[int]) -> str:
    """Text of ``ids``, special tokens kept, so ``decode(encode(t)) == t``."""
    seq = ids if isinstance(ids, list | tuple) else list(ids)
    if set(map(type, seq)) <= {int}:
        pieces = _ascii_pieces()
        try:
            # The byte-level decoder maps each token to its bytes: ASCII ones simply join (a call into the
            # tokenizer costs more than the text; a simulation decodes every answer).
            return "".join([pieces[t] for t in seq])
        except KeyError:
            pass
    return str(load_tokenizer().decode(list(seq), skip_special_tokens=False))


@lru_cache(maxsize=1)
def _ascii_pieces() -> dict[int, str]:
    """The text of each ordinary (not added) token that decodes to ASCII, by id."""
    tok = load_tokenizer()
    added = set(tok.get_added_tokens_decoder())
    pieces = {}
    for tid in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([tid], skip_special_tokens=False)
        if tid not in added and text.isascii():
            pieces[tid] = text
    return pieces


def vocab_size() -> int:
    return int(load_tokenizer().get_vocab_size(with_added_tokens=True))


def token_id(token: str) -> int:
    """Id of a vocabulary token (e.g. ``EOS_TOKEN``); KeyError when absent."""
    tid = load_tokenizer().token_to_id(token)
    if tid is None:
        raise KeyError(token)
    return int(tid)


def eos_token_id() -> int:
    return token_id(EOS_TOKEN)


@lru_cache(maxsize=1)
def tokenizer_zip_bytes() -> tuple[bytes, str]:
    """(zip of tokenizer.json, tokenizer_config.json, config.json; hex sha256 of the zip) for GetTokenizer.

    Deterministic: fixed member order and timestamps.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in ZIP_MEMBERS:
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, (data_dir() / name).read_bytes())
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()
