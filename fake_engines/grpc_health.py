"""The standard `grpc.health.v1.Health` service, hand-encoded.

`grpcio-health-checking` is not a dependency; the two messages are tiny (one string field in, one enum
field out), so they are encoded here by hand and served through a generic handler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

SERVICE = "grpc.health.v1.Health"

UNKNOWN = 0
SERVING = 1
NOT_SERVING = 2
SERVICE_UNKNOWN = 3


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _write_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_request(buf: bytes) -> str:
    """`HealthCheckRequest.service` (field 1); unknown fields are skipped as protobuf requires."""
    service = ""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field_no, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(buf, pos)
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            data = buf[pos : pos + length]
            if len(data) != length:
                raise ValueError("truncated field")
            pos += length
            if field_no == 1:
                service = data.decode("utf-8")
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return service


def encode_request(service: str) -> bytes:
    data = service.encode("utf-8")
    return (b"\x0a" + _write_varint(len(data)) + data) if data else b""


def encode_response(status: int) -> bytes:
    """`HealthCheckResponse.status` (field 1, enum); proto3 omits the default 0."""
    return (b"\x08" + _write_varint(status)) if status else b""


def decode_response(buf: bytes) -> int:
    pos = 0
    status = UNKNOWN
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        if key == 0x08:
            status, pos = _read_varint(buf, pos)
        else:
            raise ValueError("unexpected field in HealthCheckResponse")
    return status


StatusFn = Callable[[str], Awaitable[int]]


@dataclass(frozen=True)
class HealthCall:
    """One Check, or the start of one Watch (up to its first answer), as it ended: for a server that
    records its calls. `wall` and `at` (the loop clock) are when it arrived; `code` OK, NOT_FOUND (an
    unknown service's Check), CANCELLED (its caller went first) or INTERNAL; `status` the health status
    answered (None when none was)."""

    service: str
    watch: bool
    wall: float
    at: float
    code: grpc.StatusCode
    status: int | None


CallSink = Callable[[grpc.aio.ServicerContext, HealthCall], None]


class _Call:
    """Tells `on_call` once how a Check or a Watch's start ended."""

    def __init__(self, on_call: CallSink | None, context: grpc.aio.ServicerContext, service: str,
                 watch: bool) -> None:
        self._on_call, self._context, self._service, self._watch = on_call, context, service, watch
        self._wall, self._at = time.time(), asyncio.get_running_loop().time()
        self._told = False

    def tell(self, code: grpc.StatusCode, status: int | None = None) -> None:
        if self._on_call is not None and not self._told:
            self._told = True
            call = HealthCall(self._service, self._watch, self._wall, self._at, code, status)
            self._on_call(self._context, call)


def health_handler(
    status_of: StatusFn, watch_interval_s: float = 0.5, on_call: CallSink | None = None
) -> grpc.GenericRpcHandler:
    """A generic handler serving Check and Watch; `status_of(service)` decides (and may wedge); `on_call`
    hears of every Check and of every Watch's start (`HealthCall`)."""

    async def check(service: str, context: grpc.aio.ServicerContext) -> int:
        call = _Call(on_call, context, service, watch=False)
        try:
            status = await status_of(service)
            if status == SERVICE_UNKNOWN:
                call.tell(grpc.StatusCode.NOT_FOUND)
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
            call.tell(grpc.StatusCode.OK, status)
            return status
        except asyncio.CancelledError:
            call.tell(grpc.StatusCode.CANCELLED)
            raise
        finally:
            call.tell(grpc.StatusCode.INTERNAL)

    async def watch(service: str, context: grpc.aio.ServicerContext) -> AsyncIterator[int]:
        call = _Call(on_call, context, service, watch=True)
        last: int | None = None
        try:
            while True:
                status = await status_of(service)
                call.tell(grpc.StatusCode.OK, status)
                if status != last:
                    yield status
                    last = status
                await asyncio.sleep(watch_interval_s)
        except (asyncio.CancelledError, GeneratorExit):
            call.tell(grpc.StatusCode.CANCELLED)
            raise
        finally:
            call.tell(grpc.StatusCode.INTERNAL)

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                check, request_deserializer=decode_request, response_serializer=encode_response
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                watch, request_deserializer=decode_request, response_serializer=encode_response
            ),
        },
    )
