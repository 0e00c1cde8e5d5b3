"""Side-channel wire format between a decode and a prefill (pure framing; the shell owns the sockets).

Frame: 4-byte big-endian header length, 4-byte big-endian payload length, UTF-8 JSON header, raw payload.
Every header has a ``"type"``: ``pull`` / ``pull_result`` / ``handshake`` / ``handshake_result``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fake_engines.core.kv_store import KvStore

_PREFIX = struct.Struct(">II")
MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


class WireError(ValueError):
    """Malformed or oversized frame: the connection should be dropped."""


@dataclass(frozen=True)
class Frame:
    header: dict[str, Any]
    payload: bytes = b""


def encode_frame(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """Serialise one frame; WireError when it would exceed the size bounds."""
    raw = json.dumps(dict(header), separators=(",", ":"), sort_keys=True).encode("utf-8")
    if len(raw) > MAX_HEADER_BYTES:
        raise WireError(f"header too large: {len(raw)} bytes")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise WireError(f"payload too large: {len(payload)} bytes")
    return _PREFIX.pack(len(raw), len(payload)) + raw + payload


class FrameDecoder:
    """Streaming decoder: feed whatever bytes arrived, get back every frame now complete."""

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Append ``data``; returns complete frames in order. WireError on a bad or oversized frame."""
        self._buf.extend(data)
        frames: list[Frame] = []
        while len(self._buf) >= _PREFIX.size:
            hlen, plen = _PREFIX.unpack_from(self._buf)
            if hlen > MAX_HEADER_BYTES or plen > MAX_PAYLOAD_BYTES:
                raise WireError(f"frame too large: header {hlen}, payload {plen}")
            end = _PREFIX.size + hlen + plen
            if len(self._buf) < end:
                break
            raw = bytes(self._buf[_PREFIX.size : _PREFIX.size + hlen])
            payload = bytes(self._buf[_PREFIX.size + hlen : end])
            del self._buf[:end]
            try:
                header = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise WireError(f"bad frame header: {exc}") from exc
            if not isinstance(header, dict) or not isinstance(header.get("type"), str):
                raise WireError("frame header must be an object with a string 'type'")
            frames.append(Frame(header, payload))
        return frames


@dataclass(frozen=True)
class PullRequest:
    """Decode -> prefill: give me the KV held under ``transfer_key`` (Mooncake transfer_id / NIXL req id)."""

    engine_id: str
    transfer_key: str

    def encode(self) -> bytes:
        return encode_frame({"type": "pull", "engine_id": self.engine_id, "transfer_key": self.transfer_key})


@dataclass(frozen=True)
class PullResponse:
    """Prefill -> decode. The payload carries fake KV bytes whose size scales with ``n_tokens``."""

    ok: bool
    prompt_digest: str | None = None
    n_tokens: int = 0
    error: str | None = None
    engine_id: str | None = None

    def encode(self, payload: bytes = b"") -> bytes:
        return encode_frame(
            {
                "type": "pull_result",
                "ok": self.ok,
                "prompt_digest": self.prompt_digest,
                "n_tokens": self.n_tokens,
                "error": self.error,
                "engine_id": self.engine_id,
            },
            payload,
        )


@dataclass(frozen=True)
class HandshakeRequest:
    """NIXL decode -> prefill: I expect to be talking to ``engine_id``."""

    engine_id: str

    def encode(self) -> bytes:
        return encode_frame({"type": "handshake", "engine_id": self.engine_id})


@dataclass(frozen=True)
class HandshakeResponse:
    """NIXL prefill -> decode: who I really am; ``ok`` false when the expected id is not mine."""

    ok: bool
    engine_id: str
    error: str | None = None

    def encode(self) -> bytes:
        return encode_frame(
            {"type": "handshake_result", "ok": self.ok, "engine_id": self.engine_id, "error": self.error}
        )


Message = PullRequest | PullResponse | HandshakeRequest | HandshakeResponse


def _str(h: Mapping[str, Any], key: str, optional: bool = False) -> Any:
    v = h.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise WireError(f"{h.get('type')}: field {key!r} must be a string")
    return v


def decode_message(frame: Frame) -> Message:
    """Turn a frame into its typed message; WireError on unknown type or bad fields."""
    h = frame.header
    t = h.get("type")
    if t == "pull":
        return PullRequest(_str(h, "engine_id"), _str(h, "transfer_key"))
    if t == "pull_result":
        n = h.get("n_tokens", 0)
        if not isinstance(h.get("ok"), bool) or not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise WireError("pull_result: bad ok/n_tokens")
        return PullResponse(
            h["ok"], _str(h, "prompt_digest", True), n, _str(h, "error", True), _str(h, "engine_id", True)
        )
    if t == "handshake":
        return HandshakeRequest(_str(h, "engine_id"))
    if t == "handshake_result":
        if not isinstance(h.get("ok"), bool):
            raise WireError("handshake_result: bad ok")
        return HandshakeResponse(h["ok"], _str(h, "engine_id"), _str(h, "error", True))
    raise WireError(f"unknown message type {t!r}")


def fake_kv_bytes(prompt_digest: str, n_tokens: int, bytes_per_token: int = 64) -> bytes:
    """Deterministic stand-in KV payload, so bandwidth and slicer toxics have bytes to act on."""
    size = max(0, n_tokens) * max(0, bytes_per_token)
    seed = hashlib.sha256(prompt_digest.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def serve_pull(store: KvStore, request: PullRequest, my_engine_id: str, now: float) -> PullResponse:
    """The prefill's answer to a pull: the held KV (removed from the store) or an error."""
    if request.engine_id != my_engine_id:
        return PullResponse(
            False,
            error=f"engine id mismatch: asked {request.engine_id}, this is {my_engine_id}",
            engine_id=my_engine_id,
        )
    block = store.pull(request.transfer_key, now)
    if block is None:
        return PullResponse(False, error=f"no KV held for {request.transfer_key}", engine_id=my_engine_id)
    return PullResponse(True, block.prompt_digest, block.n_tokens, None, my_engine_id)


def serve_handshake(request: HandshakeRequest, my_engine_id: str) -> HandshakeResponse:
    """The prefill's answer to a NIXL handshake."""
    if request.engine_id != my_engine_id:
        return HandshakeResponse(
            False, my_engine_id, f"engine id mismatch: expected {request.engine_id}, this is {my_engine_id}"
        )
    return HandshakeResponse(True, my_engine_id)


def answer_frame(answer: PullResponse | HandshakeResponse) -> bytes:
    """The bytes a prefill sends back; a granted pull carries fake KV bytes sized by its token count."""
    if isinstance(answer, PullResponse):
        payload = fake_kv_bytes(answer.prompt_digest or "", answer.n_tokens) if answer.ok else b""
        return answer.encode(payload)
    return answer.encode()
