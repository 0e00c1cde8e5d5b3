"""gRPC legs and probes to `vllm.grpc.engine.VllmEngine` workers (grpc.aio), each under a deadline."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import grpc

from pdchaos.openai_request import max_tokens_of
from pdchaos.proto import vllm_engine_pb2, vllm_engine_pb2_grpc

from .core import Delivery
from .errors import UpstreamError
from .tokenizer import TextCodec, TokenizerError, fetch_codec

# gRPC's default reconnect backoff grows to 120 s: an engine back after a long outage would look dead to the
# probes (calls fail fast while the channel waits) for up to that long. Cap it at the scaled probe cadence
# (0.3 s): a probe just after a link heals must see the engine, not the channel's own backoff.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
]
_OLD_CHANNEL_GRACE_S = 120.0
# grpc core's wording for a call that failed because no connection could be made (refused, unreachable).
_CONNECT_FAILED = "failed to connect to all addresses"
_RESET_STREAM = "RST_STREAM"
_TRANSPORT_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
})
_SAMPLING_FLOATS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                    "repetition_penalty")


class GrpcWorker:
    """One channel per worker address; the tokenizer is fetched once per engine and cached."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self.stub = vllm_engine_pb2_grpc.VllmEngineStub(self._channel)
        self._codec: TextCodec | None = None
        self._codec_lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()
        await self._channel.close(grace=None)

    async def _fresh_if_failing(self) -> None:
        """A channel in TRANSIENT_FAILURE fails every call until its reconnect backoff ends, so a probe of an
        engine that is back would still fail. The probe gets a new channel instead: it connects at once."""
        if self._channel.get_state(try_to_connect=False) is not grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return
        old = self._channel
        self._channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        self.stub = vllm_engine_pb2_grpc.VllmEngineStub(self._channel)
        # Closing cancels the old channel's calls: give any still running their own deadlines to end first.
        task = asyncio.get_running_loop().create_task(old.close(grace=_OLD_CHANNEL_GRACE_S))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def health(self, timeout_s: float) -> bool:
        await self._fresh_if_failing()
        resp = await self.stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=timeout_s)
        return bool(resp.healthy)

    async def server_info(self, timeout_s: float | None) -> vllm_engine_pb2.GetServerInfoResponse:
        return await self.stub.GetServerInfo(vllm_engine_pb2.GetServerInfoRequest(), timeout=timeout_s)

    async def codec(self, timeout_s: float) -> TextCodec:
        if self._codec is not None:
            return self._codec
        async with asyncio.timeout(timeout_s):
            async with self._codec_lock:
                if self._codec is None:
                    try:
                        self._codec = await fetch_codec(self.stub, timeout_s)
                    except grpc.aio.AioRpcError as exc:
                        raise UpstreamError(
                            f"{self.target} tokenizer: {exc.code().name}", 503, "tokenizer_unavailable"
                        ) from exc
                    except TokenizerError as exc:
                        raise UpstreamError(f"{self.target}: {exc}", 503, "tokenizer_unavailable") from exc
                    except asyncio.CancelledError:
                        if we_are_cancelled():
                            raise
                        raise UpstreamError(f"{self.target}: tokenizer call cancelled", 502) from None
        return self._codec

    @property
    def known_codec(self) -> TextCodec | None:
        """The codec if it was fetched already (never fetches)."""
        return self._codec

    async def generate(
        self, request: vllm_engine_pb2.GenerateRequest, timeout_s: float
    ) -> AsyncGenerator[vllm_engine_pb2.GenerateResponse, None]:
        call = self.stub.Generate(request, timeout=timeout_s)
        try:
            async for msg in call:
                yield msg
        except grpc.aio.AioRpcError as exc:
            raise grpc_error(self.target, exc) from exc
        except asyncio.CancelledError:
            if we_are_cancelled():
                raise
            # The call itself was cancelled (its channel closed under it): a failed leg, not a cancelled task.
            raise UpstreamError(f"{self.target}: call cancelled", 502) from None
        finally:
            call.cancel()

    async def generate_complete(
        self, request: vllm_engine_pb2.GenerateRequest, timeout_s: float
    ) -> vllm_engine_pb2.GenerateComplete:
        """Run a non-streaming leg; the engine's complete message is the answer."""
        complete: vllm_engine_pb2.GenerateComplete | None = None
        ids: list[int] = []
        async for msg in self.generate(request, timeout_s):
            if msg.HasField("complete"):
                complete = msg.complete
            elif msg.HasField("chunk"):
                ids.extend(msg.chunk.token_ids)
        if complete is None:
            raise UpstreamError(f"{self.target} ended Generate without a complete message")
        if not complete.output_ids and ids:
            complete.output_ids.extend(ids)
        if complete.finish_reason == "error":
            raise UpstreamError(f"{self.target} finished with error", 502)
        return complete


# gRPC codes an engine answers for the caller's mistake (the HTTP 4xx it stands for): a circuit breaker
# must not count them against the worker. Every other code may be the worker's own failure.
_CLIENT_ERROR_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
}


def we_are_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def grpc_error(target: str, exc: grpc.aio.AioRpcError) -> UpstreamError:
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return UpstreamError(f"{target} overran its deadline", 504, "upstream_timeout")
    details = exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return UpstreamError(f"{target}: {details}", 400, "invalid_request", delivery=Delivery.ANSWERED,
                             worker_status=400, worker_message=details)
    return UpstreamError(f"{target}: {code.name}: {details}", 502, delivery=grpc_delivery(code, details),
                         worker_status=_CLIENT_ERROR_CODES.get(code), worker_message=details)


def grpc_delivery(code: grpc.StatusCode, details: str) -> Delivery:
    """How far a call that ended with `code` got. UNAVAILABLE also ends calls whose connection broke
    mid-flight; only a channel that could not connect proves the engine never saw the call. A reset stream
    or a cancelled call may have reached it; any other status is the engine's own answer."""
    if code == grpc.StatusCode.UNAVAILABLE and _CONNECT_FAILED in details:
        return Delivery.NOT_SENT
    if code in _TRANSPORT_CODES or _RESET_STREAM in details:
        return Delivery.MAYBE_SENT
    return Delivery.ANSWERED


def build_generate_request(
    body: dict[str, Any],
    input_ids: list[int],
    text: str,
    kv_transfer_params: dict[str, Any] | None,
    request_id: str | None = None,
    chat: bool = False,
) -> vllm_engine_pb2.GenerateRequest:
    """An OpenAI body (already sanitised for its leg and checked: `pdchaos.openai_request`) as a tokenized
    Generate request. `chat`: a chat body, whose completion budget is `max_completion_tokens` first."""
    sp = vllm_engine_pb2.SamplingParams()
    for name in _SAMPLING_FLOATS:
        if body.get(name) is not None:
            setattr(sp, name, float(body[name]))
    if body.get("top_k") is not None:
        sp.top_k = max(0, int(body["top_k"]))
    # The budget the router checked against the context, read the same way (one rule for both).
    max_tokens = max_tokens_of(body, chat)
    if max_tokens is not None:
        sp.max_tokens = int(max_tokens)
    if body.get("min_tokens") is not None:
        sp.min_tokens = int(body["min_tokens"])
    stop = body.get("stop")
    if isinstance(stop, str):
        sp.stop.append(stop)
    elif isinstance(stop, list):
        sp.stop.extend(str(s) for s in stop)
    if body.get("ignore_eos"):
        sp.ignore_eos = True
    sp.n = int(body.get("n") or 1)
    if body.get("seed") is not None:
        sp.seed = int(body["seed"])
    sp.skip_special_tokens = True
    req = vllm_engine_pb2.GenerateRequest(
        request_id=request_id or f"cmpl-{uuid.uuid4().hex}",
        tokenized=vllm_engine_pb2.TokenizedInput(original_text=text, input_ids=input_ids),
        sampling_params=sp,
        stream=bool(body.get("stream")),
    )
    if kv_transfer_params is not None:
        req.kv_transfer_params_json = json.dumps(kv_transfer_params)
    return req


def complete_kv_params(complete: vllm_engine_pb2.GenerateComplete) -> dict[str, Any] | None:
    if not complete.HasField("kv_transfer_params_json") or not complete.kv_transfer_params_json:
        return None
    try:
        parsed = json.loads(complete.kv_transfer_params_json)
    except json.JSONDecodeError as exc:
        raise UpstreamError(f"prefill returned bad kv_transfer_params_json: {exc}") from exc
    return parsed if isinstance(parsed, dict) else None
