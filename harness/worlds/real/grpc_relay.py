"""A recording relay on a real engine's gRPC port: smg's `VllmEngine` service passes through unchanged to
the engine behind it, and each `Generate` leg leaves a line in the legs file, as the HTTP relay's do
(`harness.worlds.real.relay`), so `harness.vllm.provenance` gives the checkers the same evidence over gRPC.

- kind: from the request's `kv_transfer_params_json` (`do_remote_decode`: prefill, `do_remote_prefill`:
  decode).
- status 200 when the call ended OK, 0 when the engine could not be reached, else 500 with the status code
  and details as the error; `reader_left` when the router cancelled the call after it began.
- prompt: the request's original text, else its token ids decoded with the model's tokenizer (the fakes'),
  so the checkers find the `[pdchaos:...]` tag.

Liveness follows the engine: the port refuses while the engine is down (`refuse`: the server stops, calls in
flight are cancelled) and `serve` opens it again once the engine serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from fake_engines.core.tokenizer import decode as decode_tokens
from harness.topology import EngineSpec
from harness.worlds.real.relay import LEG_TIMEOUT_S, RelayBase, leg_kind, leg_line
from pdchaos.proto import vllm_engine_pb2_grpc as pbg

UNARY_TIMEOUT_S = 30.0
_UNARY = ("HealthCheck", "GetModelInfo", "GetServerInfo", "GetLoads", "Abort", "FlushCache", "StartProfile",
          "StopProfile", "Embed")
_STREAMS = ("GetTokenizer", "SubscribeKvEvents")


def _params(request: Any) -> dict[str, Any] | None:
    if not request.kv_transfer_params_json:
        return None
    with contextlib.suppress(ValueError):
        got = json.loads(request.kv_transfer_params_json)
        return got if isinstance(got, dict) else None
    return None


def _prompt(request: Any) -> str:
    which = request.WhichOneof("input")
    if which == "text":
        return str(request.text)
    if which == "tokenized":
        if request.tokenized.original_text:
            return str(request.tokenized.original_text)
        with contextlib.suppress(Exception):
            return decode_tokens(list(request.tokenized.input_ids))
    return ""


class _Forward(pbg.VllmEngineServicer):
    """Every VllmEngine RPC forwarded to the engine; Generate legs recorded."""

    def __init__(self, relay: GrpcRecordingRelay) -> None:
        self.relay = relay
        for name in _UNARY:
            setattr(self, name, self._unary(name))
        for name in _STREAMS:
            setattr(self, name, self._stream(name))

    def _unary(self, name: str) -> Any:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await getattr(self.relay.stub(), name)(request, timeout=UNARY_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
        return call

    def _stream(self, name: str) -> Any:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for m in getattr(self.relay.stub(), name)(request, timeout=LEG_TIMEOUT_S):
                    yield m
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
        return call

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        told = _params(request)
        kind = leg_kind({"kv_transfer_params": told})
        relay = self.relay
        engine_id, started = relay.engine_id, time.monotonic()
        answered: dict[str, Any] | None = None
        status, error, reader_left, began = 200, None, False, False
        try:
            async for m in relay.stub().Generate(request, timeout=LEG_TIMEOUT_S):
                if m.WhichOneof("response") == "complete" and m.complete.kv_transfer_params_json:
                    with contextlib.suppress(ValueError):
                        answered = json.loads(m.complete.kv_transfer_params_json)
                began = True
                yield m
        except grpc.aio.AioRpcError as exc:
            unreachable = exc.code() == grpc.StatusCode.UNAVAILABLE and not began
            status, error = (0 if unreachable else 500), f"{exc.code().name}: {exc.details()}"
            relay.record(kind, engine_id, request, started, status, error, False, told, answered)
            await context.abort(exc.code(), exc.details() or "")
            return
        except asyncio.CancelledError:
            reader_left = True
            if not began:
                status, error = 500, "the router cancelled the call before its first message"
            relay.record(kind, engine_id, request, started, status, error, reader_left, told, answered)
            raise
        relay.record(kind, engine_id, request, started, status, error, reader_left, told, answered)


class GrpcRecordingRelay(RelayBase):
    """One engine's gRPC relay: listens on the engine's gRPC port, forwards to `backend_port`."""

    def __init__(self, name: str, spec: EngineSpec, records: Path, connector: str = "nixl") -> None:
        super().__init__(name, spec, records, connector)
        self._channel: grpc.aio.Channel | None = None
        self._stub: pbg.VllmEngineStub | None = None
        self._server: grpc.aio.Server | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def backend(self) -> str:
        return f"{self.spec.host}:{self.backend_port}"

    def stub(self) -> pbg.VllmEngineStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.backend)
            self._stub = pbg.VllmEngineStub(self._channel)
        return self._stub

    async def open(self) -> None:
        self._open_legs()

    async def serve(self) -> None:
        """Open the engine's gRPC port (the engine serves behind it)."""
        if self._server is not None:
            return
        server = grpc.aio.server()
        pbg.add_VllmEngineServicer_to_server(_Forward(self), server)
        server.add_insecure_port(f"{self.spec.host}:{self.spec.grpc_port}")
        await server.start()
        self._server = server

    def refuse(self) -> None:
        """Close the port and cancel the calls in flight (as a dead engine's port does)."""
        server, self._server = self._server, None
        if server is not None:
            task = asyncio.get_running_loop().create_task(server.stop(0))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        self.refuse()
        for task in list(self._stopping):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5.0)
        if self._channel is not None:
            await self._channel.close()
        if self._writer is not None:
            self._writer.close()

    def record(self, kind: str, engine_id: str | None, request: Any, started: float, status: int,
               error: str | None, reader_left: bool, told: Any, answered: Any) -> None:
        if self._writer is None:
            return
        self._seq += 1
        self._writer.write(leg_line(
            self.name, self.spec.role, self.connector, engine_id, self.generation, kind,
            request.request_id or f"relay-{self.name}-{self._seq}", _prompt(request), bool(request.stream),
            status, error, time.monotonic() - started, reader_left, told, answered))
