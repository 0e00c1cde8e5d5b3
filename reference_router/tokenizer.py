"""Text <-> token ids for gRPC workers, using the tokenizer the engine serves (`tokenizers` library).

Sources, in the order a gateway tries them: `GetModelInfo.model_path` when it is a local folder holding a
`tokenizer.json`, else the `GetTokenizer` zip stream (its SHA-256 is checked against the last chunk).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from pdchaos.proto import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc


class TokenizerError(Exception):
    pass


class TextCodec:
    """A loaded tokenizer plus the chat rendering the router uses for gRPC chat requests, and the model's
    context length when the engine reported one (`GetModelInfo.max_context_length`)."""

    def __init__(
        self, tokenizer: Tokenizer, config: dict[str, Any] | None = None, context_length: int | None = None
    ) -> None:
        self._tok = tokenizer
        self.config = config or {}
        self.context_length = context_length
        self._max_token_chars: int | None = None

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def max_token_chars(self) -> int:
        """A bound on the text one token stands for: a text longer than context x this cannot fit. A
        vocabulary entry is at least as long as its text (byte-level entries spell one character per byte)."""
        if self._max_token_chars is None:
            vocab = self._tok.get_vocab(with_added_tokens=True)
            self._max_token_chars = max((len(t) for t in vocab), default=1)
        return self._max_token_chars

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        # Special tokens kept: text and ids must round-trip exactly (the engines' digests depend on it).
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def decode_output(self, ids: list[int]) -> str:
        """An answer's text: special tokens (an ending end of sequence) left out, as vLLM's default
        `skip_special_tokens` does."""
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    @staticmethod
    def render_chat(messages: list[dict[str, Any]]) -> str:
        """ChatML, whatever the engine's chat_template says: the router carries no template engine (no jinja
        in the dependency set). ChatML is what the pdchaos fake engines ship. ValueError on bad messages."""
        parts = []
        for i, m in enumerate(messages):
            role = m.get("role")
            if not isinstance(role, str) or not role:
                raise ValueError(f"message {i} needs a string role")
            parts.append(f"<|im_start|>{role}\n{_message_text(m.get('content'))}<|im_end|>\n")
        parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def streamer(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)


def _message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            ok = isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            if not ok:
                raise ValueError("only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError("message content must be a string or a list of text parts")


class IncrementalDecoder:
    """Turns a growing list of output ids into text deltas (special tokens left out); holds back a delta
    ending in a partial UTF-8 sequence."""

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._ids: list[int] = []
        self._emitted = ""

    def push(self, ids: list[int]) -> str:
        self._ids.extend(ids)
        text = self._codec.decode_output(self._ids)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self._emitted):] if text.startswith(self._emitted) else text
        self._emitted = text
        return delta

    def flush(self) -> str:
        text = self._codec.decode_output(self._ids)
        delta = text[len(self._emitted):] if text.startswith(self._emitted) else ""
        self._emitted = text
        return delta


def load_from_dir(path: str | Path) -> TextCodec:
    folder = Path(path)
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        raise TokenizerError(f"no tokenizer.json in {folder}")
    config: dict[str, Any] = {}
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        config = json.loads(cfg.read_text(encoding="utf-8"))
    return TextCodec(Tokenizer.from_file(str(tok_file)), config)


def _has_tokenizer(folder: str) -> bool:
    return (Path(folder) / "tokenizer.json").is_file()


def codec_from_zip(blob: bytes) -> TextCodec:
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            names = {Path(n).name: n for n in zf.namelist()}
            if "tokenizer.json" not in names:
                raise TokenizerError("tokenizer zip has no tokenizer.json")
            tok = Tokenizer.from_str(zf.read(names["tokenizer.json"]).decode("utf-8"))
            config: dict[str, Any] = {}
            if "tokenizer_config.json" in names:
                config = json.loads(zf.read(names["tokenizer_config.json"]).decode("utf-8"))
    except zipfile.BadZipFile as exc:
        raise TokenizerError(f"bad tokenizer zip: {exc}") from exc
    return TextCodec(tok, config)


async def fetch_codec(stub: vllm_engine_pb2_grpc.VllmEngineStub, timeout_s: float) -> TextCodec:
    """The engine's tokenizer: local model folder first, else the GetTokenizer zip; bounded by timeout_s.
    The codec carries the context length the engine reports (None when it reports none)."""
    info = await stub.GetModelInfo(vllm_engine_pb2.GetModelInfoRequest(), timeout=timeout_s)
    codec = await _fetch_tokenizer(stub, info, timeout_s)
    codec.context_length = int(info.max_context_length) or None
    return codec


async def _fetch_tokenizer(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, info: vllm_engine_pb2.GetModelInfoResponse, timeout_s: float
) -> TextCodec:
    for candidate in (info.tokenizer_path, info.model_path):
        if candidate and await asyncio.to_thread(_has_tokenizer, candidate):
            return await asyncio.to_thread(load_from_dir, candidate)
    chunks: list[bytes] = []
    digest = ""
    call = stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=timeout_s)
    async for chunk in call:
        chunks.append(chunk.data)
        if chunk.sha256:
            digest = chunk.sha256
    blob = b"".join(chunks)
    if not blob:
        raise TokenizerError("engine sent an empty tokenizer")
    if digest and hashlib.sha256(blob).hexdigest() != digest.lower():
        raise TokenizerError("tokenizer zip failed its SHA-256 check")
    return await asyncio.to_thread(codec_from_zip, blob)
