"""gRPC surface: `vllm.grpc.engine.VllmEngine` (smg-grpc-proto) plus `grpc.health.v1.Health`.

Every RPC it answers leaves an engine call record (`core.calls`), or, for a served leg, its handoff record.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from fake_engines import grpc_health
from fake_engines.config import CONNECTOR_NAMES, KV_ROLES
from fake_engines.core import calls, tokenizer
from fake_engines.core.gen_request import (
    MAX_MODEL_LEN,
    GenRequest,
    RequestError,
    budget_problem,
    decode_prompt_ids,
    encode_bounded,
    parse_kv_params,
)
from fake_engines.core.generator import DEFAULT_MAX_TOKENS
from fake_engines.core.kv_store import BLOCK_SIZE
from fake_engines.core.records import find_tag
from fake_engines.engine import Arrival, Engine
from pdchaos.proto import SERVICE_NAME, common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

TOKENIZER_CHUNK_BYTES = 64 * 1024
MAX_CONTEXT = MAX_MODEL_LEN

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


# The other way, for call records: the HTTP twin of the status an RPC ended with.
_HTTP_STATUSES = {code: status for status, code in _CODES.items()} | {grpc.StatusCode.OK: 200}


def status_code_for(http_status: int) -> grpc.StatusCode:
    return _CODES.get(http_status, grpc.StatusCode.INTERNAL)


def http_status_for(code: grpc.StatusCode | None) -> int:
    """The HTTP twin of a gRPC status (None: none was set, the RPC succeeded)."""
    return 200 if code is None else _HTTP_STATUSES.get(code, 500)


def metadata_caller(context: grpc.aio.ServicerContext) -> str | None:
    """What the caller's `x-pdchaos-caller` metadata says (None when it says nothing)."""
    for key, value in context.invocation_metadata() or ():
        if key == calls.CALLER_METADATA:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def typed_params(params: dict[str, Any] | None) -> Any:
    """The deprecated typed mirror of a prefill's parameters that vLLM's servicer still sets for old
    routers: only when they name a usable host and port (NIXL's do; a Mooncake prefill returns none)."""
    host = (params or {}).get("remote_host")
    port = (params or {}).get("remote_port")
    if isinstance(host, str) and host and isinstance(port, int) and 1 <= port <= 65535:
        return vllm_engine_pb2.KvTransferParams(remote_host=host, remote_port=port)
    return None


class VllmEngineServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    """Answers from one Engine; every RPC passes its surface's fault gate first."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Streams being written, by request id: an Abort ends one between tokens, as vLLM's engine does.
        self._streams: dict[str, asyncio.Event] = {}

    @contextmanager
    def _recorded(self, context: grpc.aio.ServicerContext, call: str) -> Iterator[dict[str, Any]]:
        """Record the RPC run inside once it ends, with the detail it filled in: the HTTP twin of its status,
        CLIENT_GONE when it was cancelled (the caller gone, its deadline past, the server stopping)."""
        arrival = self.engine.arrival(metadata_caller(context))
        detail: dict[str, Any] = {}
        status = 500
        try:
            yield detail
            status = http_status_for(context.code())
        except (asyncio.CancelledError, GeneratorExit):
            status = calls.CLIENT_GONE
            raise
        except grpc.aio.AbortError:
            status = http_status_for(context.code())
            raise
        finally:
            self.engine.record_call(arrival, call, status, detail)

    # -- generation -----------------------------------------------------------------------------------------
    @staticmethod
    def _kv_params(request: Any) -> dict[str, Any] | None:
        if request.HasField("kv_transfer_params_json") and request.kv_transfer_params_json:
            try:
                kv = json.loads(request.kv_transfer_params_json)
            except json.JSONDecodeError as exc:
                raise RequestError(400, f"kv_transfer_params_json is not JSON: {exc}") from exc
            return parse_kv_params(kv)
        if request.HasField("kv_transfer_params"):
            # The deprecated typed form (no engine id): a decode can only recompute from it.
            typed = request.kv_transfer_params
            return {
                "do_remote_prefill": True,
                "remote_host": typed.remote_host,
                "remote_port": typed.remote_port,
            }
        return None

    def _leg_of(self, request: Any) -> dict[str, Any]:
        """The leg's shape as the router sent it (`core.calls.leg_shape`): before any check or clamp."""
        sp = request.sampling_params
        try:
            kv: Any = self._kv_params(request)
        except RequestError:
            kv = request.kv_transfer_params_json  # not an object: kept as sent
        return calls.leg_shape(
            stream=request.stream,
            max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
            min_tokens=sp.min_tokens,
            n=sp.n,
            ignore_eos=sp.ignore_eos,
            kv_transfer_params=kv,
            stop=list(sp.stop),
        )

    def _gen_request(self, request: Any, leg: dict[str, Any]) -> GenRequest:
        which = request.WhichOneof("input")
        if which == "tokenized":
            ids = [int(t) for t in request.tokenized.input_ids]
            if not ids:
                raise RequestError(400, "tokenized.input_ids is empty")
            try:
                text = decode_prompt_ids(ids)
            except ValueError as exc:
                raise RequestError(400, str(exc)) from exc
        elif which == "text":
            text = request.text
            ids = encode_bounded(text)
        else:
            raise RequestError(400, "GenerateRequest needs tokenized or text input")
        sp = request.sampling_params
        max_tokens = sp.max_tokens if sp.HasField("max_tokens") else DEFAULT_MAX_TOKENS
        seed = sp.seed if sp.HasField("seed") else self.engine.config.seed
        kv = self._kv_params(request)
        if max_tokens >= 1 and len(ids) < MAX_MODEL_LEN:
            # Under the gRPC servicer no OpenAI layer refuses a completion past the context (vLLM's HTTP
            # 400): the engine stops where the context ends, finish_reason "length".
            max_tokens = min(int(max_tokens), MAX_MODEL_LEN - len(ids))
        problem = budget_problem(ids, int(max_tokens))
        if problem is not None:
            raise RequestError(400, problem)
        rid = request.request_id or f"grpc-{time.monotonic_ns()}"
        return GenRequest(rid, text, ids, int(max_tokens), seed, kv, leg, tuple(sp.stop), int(sp.min_tokens),
                          bool(sp.ignore_eos))

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        arrival = self.engine.arrival(metadata_caller(context))
        leg = self._leg_of(request)
        try:
            req = self._gen_request(request, leg)
        except RequestError as exc:
            tag = find_tag(request.tokenized.original_text or request.text)
            self.engine.refuse_leg(
                arrival, exc.status, exc.message, request_id=request.request_id or None, tag=tag, leg=leg
            )
            await context.abort(status_code_for(exc.status), exc.message)
            return
        try:
            # From here on the engine records the leg: a handoff record, or a refused one.
            result = await self.engine.generate(req, arrival)
        except RequestError as exc:
            await context.abort(status_code_for(exc.status), exc.message)
            return
        pb = vllm_engine_pb2
        kv_json = json.dumps(result.kv_transfer_params) if result.kv_transfer_params is not None else None
        ids = result.token_ids
        finish = result.finish_reason
        if request.stream:
            # vLLM's DELTA output: every token arrives in a chunk (completion_tokens = the delta's count) and
            # the complete message repeats the last delta; gateways (smg) build text from the chunks only.
            aborted = self._streams.setdefault(req.request_id, asyncio.Event())
            try:
                for i, tid in enumerate(ids):
                    if i > 0 and result.itl_s > 0:
                        await asyncio.sleep(result.itl_s)
                    if aborted.is_set():
                        ids, finish = ids[:i], "abort"
                        break
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateStreamChunk(
                            token_ids=[tid], prompt_tokens=result.prompt_tokens, completion_tokens=1, index=0
                        )
                    )
            finally:
                self._streams.pop(req.request_id, None)
            final = ids[-1:]
        else:
            await asyncio.sleep(result.itl_s * max(0, len(ids) - 1))
            final = ids
        complete = pb.GenerateComplete(
            output_ids=final,
            finish_reason=finish,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=len(ids),
            index=0,
        )
        if kv_json is not None:
            complete.kv_transfer_params_json = kv_json
            typed = typed_params(result.kv_transfer_params)
            if typed is not None:
                complete.kv_transfer_params.CopyFrom(typed)
        yield pb.GenerateResponse(complete=complete)

    async def Abort(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        with self._recorded(context, calls.ABORT) as detail:
            detail["request_ids"] = list(request.request_ids)
            await self.engine.faults.gate("generate")
            self.engine.abort(list(request.request_ids))
            for rid in request.request_ids:
                if rid in self._streams:
                    self._streams[rid].set()
            return vllm_engine_pb2.AbortResponse()

    # -- health and metadata --------------------------------------------------------------------------------
    async def HealthCheck(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # An unhealthy answer is still a successful RPC: its record says 200 with healthy false.
        with self._recorded(context, calls.GRPC_HEALTH) as detail:
            await self.engine.faults.gate("health")
            state = self.engine.state
            detail["healthy"] = state.healthy
            if not state.healthy:
                # vLLM's servicer says "Engine is not alive" for an engine that errored.
                message = "Engine is not alive" if state.dead else "shutting down"
                return vllm_engine_pb2.HealthCheckResponse(healthy=False, message=message)
            # vLLM's servicer's words
            return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="Health")

    async def GetModelInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        with self._recorded(context, calls.MODEL_INFO):
            await self.engine.faults.gate("metadata")
            return self._model_info()

    def _model_info(self) -> Any:
        path = str(tokenizer.data_dir())
        eos = tokenizer.eos_token_id()
        return vllm_engine_pb2.GetModelInfoResponse(
            model_path=path,
            tokenizer_path=path,
            is_generation=True,
            max_context_length=MAX_CONTEXT,
            vocab_size=tokenizer.vocab_size(),
            supports_vision=False,
            served_model_name=self.engine.config.model,
            model_type="pdchaos_fake",
            architectures=["PdchaosFakeForCausalLM"],
            eos_token_ids=[eos],
            pad_token_id=eos,
            bos_token_id=eos,
            max_req_input_len=MAX_CONTEXT,
            default_sampling_params_json="{}",
        )

    async def GetServerInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        with self._recorded(context, calls.SERVER_INFO) as detail:
            await self.engine.faults.gate("server_info")
            if self.engine.state.faults.fail_server_info:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "server info unavailable (injected)")
            info = self._server_info()
            detail["kv_engine_id"] = info.kv_engine_id
            return info

    def _server_info(self) -> Any:
        e = self.engine.state
        cfg = e.config
        return vllm_engine_pb2.GetServerInfoResponse(
            active_requests=e.active,
            is_paused=False,
            last_receive_timestamp=e.last_receive,
            uptime_seconds=e.identity.uptime_s(self.engine.now()),
            server_type="vllm-grpc",
            kv_connector=CONNECTOR_NAMES[cfg.connector],
            kv_role=KV_ROLES[cfg.role] if cfg.connector != "none" else "",
            kv_engine_id=e.reported_engine_id() if cfg.connector != "none" else "",
            data_parallel_size=cfg.dp_size,
            kv_cache_dtype="auto",
            block_size=BLOCK_SIZE,
            model_dtype="torch.bfloat16",
            max_num_seqs=256,
        )

    async def GetLoads(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        with self._recorded(context, calls.LOADS):
            await self.engine.faults.gate("metadata")
            return await self._loads(request, context)

    async def _loads(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        e = self.engine.state
        ranks = range(e.config.dp_size)
        if request.HasField("dp_rank"):
            if not 0 <= request.dp_rank < e.config.dp_size:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"dp_rank {request.dp_rank} out of range"
                )
            ranks = range(request.dp_rank, request.dp_rank + 1)
        loads = [
            vllm_engine_pb2.SchedulerLoad(
                dp_rank=r,
                num_running_reqs=e.active if r == 0 else 0,
                num_waiting_reqs=0,
                num_total_reqs=e.active if r == 0 else 0,
                max_total_num_tokens=MAX_CONTEXT * 8,
                max_running_requests=256,
            )
            for r in ranks
        ]
        return vllm_engine_pb2.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            version="pdchaos",
            dp_rank_count=e.config.dp_size,
            loads=loads,
        )

    async def GetTokenizer(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        with self._recorded(context, calls.TOKENIZER):
            await self.engine.faults.gate("metadata")
            data, sha = tokenizer.tokenizer_zip_bytes()
            n = max(1, -(-len(data) // TOKENIZER_CHUNK_BYTES))
            for i in range(n):
                piece = data[i * TOKENIZER_CHUNK_BYTES : (i + 1) * TOKENIZER_CHUNK_BYTES]
                yield common_pb2.GetTokenizerChunk(data=piece, sha256=sha if i == n - 1 else "")

    # -- not offered ----------------------------------------------------------------------------------------
    async def _unimplemented(self, context: grpc.aio.ServicerContext, name: str) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by the fake engine")

    async def Embed(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._unimplemented(context, "Embed")

    async def FlushCache(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._unimplemented(context, "FlushCache")

    async def StartProfile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._unimplemented(context, "StartProfile")

    async def StopProfile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._unimplemented(context, "StopProfile")

    async def SubscribeKvEvents(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await self._unimplemented(context, "SubscribeKvEvents")
        yield  # pragma: no cover - makes this a server-streaming handler


def make_grpc_server(engine: Engine, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server with both services bound to host:port (not yet started)."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(VllmEngineServicer(engine), server)

    async def status_of(service: str) -> int:
        await engine.faults.gate("health")
        if service not in ("", SERVICE_NAME):
            return grpc_health.SERVICE_UNKNOWN
        return grpc_health.SERVING if engine.state.healthy else grpc_health.NOT_SERVING

    def on_call(context: grpc.aio.ServicerContext, call: grpc_health.HealthCall) -> None:
        status = http_status_for(call.code)  # CANCELLED: CLIENT_GONE
        detail: dict[str, Any] = {"service": call.service, "watch": call.watch}
        if call.status is not None:
            detail["healthy"] = call.status == grpc_health.SERVING
        arrival = Arrival(call.wall, call.at, calls.caller_of(metadata_caller(context)))
        engine.record_call(arrival, calls.GRPC_HEALTH_V1, status, detail)

    server.add_generic_rpc_handlers((grpc_health.health_handler(status_of, on_call=on_call),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC port {host}:{port}")
    return server, bound
