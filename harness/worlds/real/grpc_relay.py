"""A recording relay on a real engine's gRPC port: smg's `VllmEngine` service passes through unchanged to
the engine behind it, and each `Generate` leg leaves a line in the legs file, as the HTTP relay's do
(`harness.worlds.real.relay`), so `harness.vllm.provenance` gives the checkers the same evidence over gRPC.

- kind: from the request's `kv_transfer_params_json` (`do_remote_decode`: prefill, `do_remote_prefill`:
  decode).
- status: 200 when the engine took the leg (an error after its first message is the leg's `error`, as an SSE
  error chunk is over HTTP), 0 when the engine could not be reached or went away before answering, else the
  HTTP twin of the status code the engine refused it with (`http_status`); 499 when the router cancelled
  the call before its first message (`reader_left`).
- prompt: the request's original text, else its token ids decoded with the model's tokenizer (the fakes'),
  so the checkers find the `[pdchaos:...]` tag.
- leg: the leg's shape (`fake_engines.core.calls.leg_shape`, from the sampling parameters); caller: the
  call's `x-pdchaos-caller` metadata (none: the router).

HealthCheck, GetServerInfo, GetModelInfo, GetLoads, GetTokenizer and Abort leave engine call lines
(CONTRACTS.md §1) in the same file, as does the standard `grpc.health.v1.Health` service, which vLLM's gRPC
server registers beside VllmEngine (a gateway may probe it) and the relay forwards as opaque bytes (a Watch
is recorded once, at its first answer). Other RPCs pass through unrecorded.

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

from fake_engines import grpc_health
from fake_engines.core.calls import (
    ABORT,
    CALLER_METADATA,
    CLIENT_GONE,
    GRPC_HEALTH,
    GRPC_HEALTH_V1,
    LOADS,
    MODEL_INFO,
    SERVER_INFO,
    TOKENIZER,
    leg_shape,
)
from fake_engines.core.records import find_tag
from fake_engines.core.tokenizer import decode as decode_tokens
from harness.topology import EngineSpec
from harness.worlds.real.relay import LEG_TIMEOUT_S, Arrival, RelayBase, leg_kind, leg_line
from pdchaos.proto import vllm_engine_pb2_grpc as pbg

UNARY_TIMEOUT_S = 30.0
_UNARY = ("HealthCheck", "GetModelInfo", "GetServerInfo", "GetLoads", "Abort", "FlushCache", "StartProfile",
          "StopProfile", "Embed")
_STREAMS = ("GetTokenizer", "SubscribeKvEvents")
# The RPCs that are engine calls (CONTRACTS.md §1); the rest are nothing a router's contract is judged on.
_CALLS = {"HealthCheck": GRPC_HEALTH, "GetServerInfo": SERVER_INFO, "GetModelInfo": MODEL_INFO,
          "GetLoads": LOADS, "GetTokenizer": TOKENIZER, "Abort": ABORT}

# The HTTP status a gRPC status code stands for (grpc-gateway's table; CANCELLED is nginx's 499).
_HTTP_OF = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: CLIENT_GONE,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP twin of a gRPC status code (500 for UNKNOWN, INTERNAL, DATA_LOSS and the like)."""
    return _HTTP_OF.get(code, 500)


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


def generate_shape(request: Any) -> dict[str, Any]:
    """A Generate request's leg shape, as `leg_of_openai(body, chat, grpc=True)` gives it for the OpenAI body
    a router made the request of."""
    sp = request.sampling_params
    return leg_shape(
        stream=request.stream, max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
        min_tokens=sp.min_tokens, n=sp.n, ignore_eos=sp.ignore_eos, kv_transfer_params=_params(request))


def _caller(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == CALLER_METADATA:
            return str(value)
    return None


def _detail(call: str | None, request: Any, reply: Any) -> dict[str, Any]:
    """What a call line tells beyond its status (`reply` None: the call failed)."""
    if call == GRPC_HEALTH:
        return {"healthy": bool(reply is not None and reply.healthy)}
    if call == SERVER_INFO:
        return {} if reply is None else {"kv_engine_id": reply.kv_engine_id}
    if call == ABORT:
        return {"request_ids": list(request.request_ids)}
    return {}


def _health_v1_detail(request: bytes, reply: bytes | None) -> dict[str, Any]:
    service: str | None = None
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        service = grpc_health.decode_request(request)
    healthy = False
    if reply is not None:
        with contextlib.suppress(ValueError):
            healthy = grpc_health.decode_response(reply) == grpc_health.SERVING
    return {"service": service, "healthy": healthy}


class _Forward(pbg.VllmEngineServicer):
    """Every VllmEngine RPC forwarded to the engine; Generate legs and engine calls recorded."""

    def __init__(self, relay: GrpcRecordingRelay) -> None:
        self.relay = relay
        for name in _UNARY:
            setattr(self, name, self._unary(name))
        for name in _STREAMS:
            setattr(self, name, self._stream(name))

    def _unary(self, name: str) -> Any:
        call = _CALLS.get(name)

        async def forward(request: Any, context: grpc.aio.ServicerContext) -> Any:
            relay = self.relay
            arrival = relay.arrival(_caller(context))
            try:
                reply = await getattr(relay.stub(), name)(request, timeout=UNARY_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                relay.note_call(call, arrival, http_status(exc.code()), _detail(call, request, None))
                await context.abort(exc.code(), exc.details() or "")
            except asyncio.CancelledError:
                relay.note_call(call, arrival, relay.cut_status(), _detail(call, request, None))
                raise
            relay.note_call(call, arrival, 200, _detail(call, request, reply))
            return reply
        return forward

    def _stream(self, name: str) -> Any:
        call = _CALLS.get(name)

        async def forward(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            relay = self.relay
            arrival = relay.arrival(_caller(context))
            try:
                async for m in getattr(relay.stub(), name)(request, timeout=LEG_TIMEOUT_S):
                    yield m
            except grpc.aio.AioRpcError as exc:
                relay.note_call(call, arrival, http_status(exc.code()), _detail(call, request, None))
                await context.abort(exc.code(), exc.details() or "")
            except asyncio.CancelledError:
                relay.note_call(call, arrival, relay.cut_status(), _detail(call, request, None))
                raise
            relay.note_call(call, arrival, 200, _detail(call, request, None))
        return forward

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        told = _params(request)
        kind = leg_kind({"kv_transfer_params": told})
        relay = self.relay
        arrival = relay.arrival(_caller(context))
        shape = generate_shape(request)
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
            error = f"{exc.code().name}: {exc.details()}"
            if not began:
                unreachable = exc.code() == grpc.StatusCode.UNAVAILABLE
                status = 0 if unreachable else http_status(exc.code())
            relay.record(kind, arrival, request, shape, status, error, False, told, answered)
            await context.abort(exc.code(), exc.details() or "")
            return
        except asyncio.CancelledError:
            if not relay.serving:
                # The relay cut the call: the engine went away under it (0 when it had not begun, as an
                # engine the relay cannot reach).
                status, error = (200 if began else 0), "the engine went away during the call"
            else:
                reader_left = True
                if not began:
                    status, error = CLIENT_GONE, "the router cancelled the call before its first message"
            relay.record(kind, arrival, request, shape, status, error, reader_left, told, answered)
            raise
        relay.record(kind, arrival, request, shape, status, error, reader_left, told, answered)


def _health_v1(relay: GrpcRecordingRelay) -> grpc.GenericRpcHandler:
    """`grpc.health.v1.Health` forwarded as opaque bytes (no serializers either side)."""
    check_path = f"/{grpc_health.SERVICE}/Check"
    watch_path = f"/{grpc_health.SERVICE}/Watch"

    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        arrival = relay.arrival(_caller(context))
        try:
            reply = await relay.channel().unary_unary(check_path)(request, timeout=UNARY_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            relay.note_call(GRPC_HEALTH_V1, arrival, http_status(exc.code()),
                            _health_v1_detail(request, None))
            await context.abort(exc.code(), exc.details() or "")
        except asyncio.CancelledError:
            relay.note_call(GRPC_HEALTH_V1, arrival, relay.cut_status(),
                            _health_v1_detail(request, None))
            raise
        relay.note_call(GRPC_HEALTH_V1, arrival, 200, _health_v1_detail(request, reply))
        return bytes(reply)

    async def watch(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        arrival = relay.arrival(_caller(context))
        first = True
        try:
            # A watch lasts as long as its caller wants: no deadline of the relay's own.
            async for reply in relay.channel().unary_stream(watch_path)(request):
                if first:
                    first = False
                    relay.note_call(GRPC_HEALTH_V1, arrival, 200,
                                    {**_health_v1_detail(request, reply), "watch": True})
                yield bytes(reply)
        except grpc.aio.AioRpcError as exc:
            if first:
                relay.note_call(GRPC_HEALTH_V1, arrival, http_status(exc.code()),
                                {**_health_v1_detail(request, None), "watch": True})
            await context.abort(exc.code(), exc.details() or "")
        except asyncio.CancelledError:
            if first:
                relay.note_call(GRPC_HEALTH_V1, arrival, relay.cut_status(),
                                {**_health_v1_detail(request, None), "watch": True})
            raise

    return grpc.method_handlers_generic_handler(grpc_health.SERVICE, {
        "Check": grpc.unary_unary_rpc_method_handler(check),
        "Watch": grpc.unary_stream_rpc_method_handler(watch),
    })


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

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.backend)
        return self._channel

    def stub(self) -> pbg.VllmEngineStub:
        if self._stub is None:
            self._stub = pbg.VllmEngineStub(self.channel())
        return self._stub

    async def open(self) -> None:
        self._open_legs()

    async def serve(self) -> None:
        """Open the engine's gRPC port (the engine serves behind it)."""
        if self._server is not None:
            return
        server = grpc.aio.server()
        pbg.add_VllmEngineServicer_to_server(_Forward(self), server)
        server.add_generic_rpc_handlers((_health_v1(self),))
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

    @property
    def serving(self) -> bool:
        """Whether the port is open (False once `refuse` cut the calls in flight)."""
        return self._server is not None

    def cut_status(self) -> int:
        """The status of a call cancelled under the relay: its caller left (499), unless the relay cut it
        because the engine went away (502, as the HTTP relay records an engine it cannot reach)."""
        return CLIENT_GONE if self.serving else 502

    async def close(self) -> None:
        self.refuse()
        for task in list(self._stopping):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5.0)
        if self._channel is not None:
            await self._channel.close()
        if self._writer is not None:
            self._writer.close()

    def note_call(self, call: str | None, arrival: Arrival, status: int, detail: dict[str, Any]) -> None:
        """A call line for an RPC that is an engine call (`call` None: not one, nothing written)."""
        if call is not None:
            self.write_call(call, arrival, status, detail)

    def record(self, kind: str, arrival: Arrival, request: Any, shape: dict[str, Any], status: int,
               error: str | None, reader_left: bool, told: Any, answered: Any) -> None:
        if self._writer is None:
            return
        self._seq += 1
        prompt = _prompt(request)
        self._writer.write(leg_line(
            self.name, self.spec.role, self.connector, arrival.engine_id, arrival.generation, kind,
            request.request_id or f"relay-{self.name}-{self._seq}", prompt, bool(request.stream),
            status, error, time.monotonic() - arrival.started, reader_left, told, answered, leg=shape,
            tag=find_tag(prompt), caller=arrival.caller))
