"""The fidelity probes over gRPC: smg's `vllm.grpc.engine.VllmEngine` service, asked of a fake pair and of
vLLM's own gRPC server (`vllm.entrypoints.launchers.grpc_server`, smg-grpc-servicer), NIXL.

These cover the surface a gRPC gateway reads (health, model and server info, Generate's messages, status
codes, the handoff parameters in `kv_transfer_params_json`, Abort). What an engine does with its KV when
its peer dies, restarts or freezes does not depend on the transport: the HTTP probes cover it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from fake_engines.core.tokenizer import encode
from harness.fidelity.observe import (
    ANSWER_BUDGET_S,
    GrpcAnswer,
    ProbeResult,
    grpc_outcome,
    json_type,
    key_types,
)
from harness.fidelity.probes import NIXL_PARAM_KEYS, PROMPT, run_each
from pdchaos.proto import vllm_engine_pb2 as pb
from pdchaos.proto import vllm_engine_pb2_grpc as pbg


class GrpcPair(Protocol):
    def grpc_target(self, role: str) -> str: ...

    def engine_id(self, role: str) -> str | None: ...


Stubs = Callable[[str], pbg.VllmEngineStub]


@dataclass
class GrpcProbe:
    name: str
    question: str
    run: Callable[[Stubs, GrpcPair, ProbeResult], Awaitable[None]]


def tokenized(prompt: str = PROMPT) -> pb.TokenizedInput:
    return pb.TokenizedInput(original_text=prompt, input_ids=encode(prompt))


def generate_request(max_tokens: int = 4, stream: bool = False, kv: dict[str, Any] | None = None,
                     request_id: str | None = None) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=request_id or f"fid-{uuid.uuid4().hex[:12]}", tokenized=tokenized(),
                             sampling_params=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
                             stream=stream)
    if kv is not None:
        req.kv_transfer_params_json = json.dumps(kv)
    return req


def near_context_request(ctx: int, room: int, max_tokens: int) -> pb.GenerateRequest:
    """A prompt of `ctx - room` copies of one ordinary token."""
    tok = encode(PROMPT)[0]
    return pb.GenerateRequest(request_id=f"fid-ctx-{uuid.uuid4().hex[:8]}",
                              tokenized=pb.TokenizedInput(input_ids=[tok] * (ctx - room)),
                              sampling_params=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0))


async def generate(stub: pbg.VllmEngineStub, req: pb.GenerateRequest,
                   budget_s: float = ANSWER_BUDGET_S) -> GrpcAnswer:
    """One Generate call with a deadline; whatever happens comes back as a GrpcAnswer (no exception)."""
    start = time.monotonic()
    messages: list[Any] = []
    try:
        async for m in stub.Generate(req, timeout=budget_s):
            messages.append(m)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return GrpcAnswer("DEADLINE_EXCEEDED", messages, None, exc.details() or "")
        return GrpcAnswer(exc.code().name, messages, time.monotonic() - start, exc.details() or "")
    return GrpcAnswer("OK", messages, time.monotonic() - start)


async def unary(call: Callable[..., Awaitable[Any]], req: Any) -> tuple[GrpcAnswer, Any]:
    start = time.monotonic()
    try:
        reply = await call(req, timeout=ANSWER_BUDGET_S)
    except grpc.aio.AioRpcError as exc:
        elapsed = None if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else time.monotonic() - start
        return GrpcAnswer(exc.code().name, [], elapsed, exc.details() or ""), None
    return GrpcAnswer("OK", [reply], time.monotonic() - start), reply


def fields_set(msg: Any) -> str:
    return ",".join(sorted(f.name for f, _ in msg.ListFields())) if msg is not None else "none"


def message_kinds(a: GrpcAnswer) -> str:
    """The Generate stream's shape: `complete`, or `chunk x N, complete` (N: one or more)."""
    kinds = [m.WhichOneof("response") for m in a.messages]
    if not kinds:
        return "no messages"
    chunks = kinds.count("chunk")
    tail = kinds[-1]
    parts = ["chunks" if chunks > 1 else "one chunk"] if chunks else []
    return ", ".join([*parts, f"ends with {tail}"])


def complete_of(a: GrpcAnswer) -> Any:
    last = a.messages[-1] if a.messages else None
    return last.complete if last is not None and last.WhichOneof("response") == "complete" else None


def params_of(complete: Any) -> dict[str, Any] | None:
    if complete is None or not complete.kv_transfer_params_json:
        return None
    try:
        got = json.loads(complete.kv_transfer_params_json)
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


# -- the probes ---------------------------------------------------------------------------------------------


async def _health(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    for role in ("prefill", "decode"):
        a, reply = await unary(stubs(role).HealthCheck, pb.HealthCheckRequest())
        r.add(f"{role} HealthCheck", grpc_outcome(a))
        r.add(f"{role} healthy", str(reply.healthy).lower() if reply is not None else "none")
        r.add(f"{role} message", reply.message if reply is not None else "none", False)


async def _model_info(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    a, info = await unary(stubs("decode").GetModelInfo, pb.GetModelInfoRequest())
    r.add("status", grpc_outcome(a))
    r.add("served_model_name", info.served_model_name if info is not None else "none")
    r.add("is_generation", str(info.is_generation).lower() if info is not None else "none")
    r.add("max_context_length set", str(bool(info and info.max_context_length)).lower())
    r.add("eos_token_ids set", str(bool(info and list(info.eos_token_ids))).lower())
    r.add("fields set", fields_set(info), False)


async def _server_info(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    a, info = await unary(stubs("prefill").GetServerInfo, pb.GetServerInfoRequest())
    r.add("status", grpc_outcome(a))
    r.add("kv_connector", info.kv_connector if info is not None else "none")
    r.add("kv_role", info.kv_role if info is not None else "none")
    known = pair.engine_id("prefill")
    r.add("kv_engine_id is the prefill's id",
          str(info is not None and info.kv_engine_id == known).lower() if known else "unknown")
    r.add("server_type", (info.server_type or "unset") if info is not None else "none", False)
    r.add("fields set", fields_set(info), False)


async def _generate(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    req = generate_request(max_tokens=4)
    a = await generate(stubs("decode"), req)
    r.add("status", grpc_outcome(a))
    r.add("messages", message_kinds(a))
    c = complete_of(a)
    r.add("finish_reason", c.finish_reason if c is not None else "none")
    r.add("output_ids in complete", str(len(c.output_ids)) if c is not None else "none")
    same_prompt = c is not None and c.prompt_tokens == len(req.tokenized.input_ids)
    r.add("counts", f"prompt {'= input' if same_prompt else 'differs'}, "
          f"completion {c.completion_tokens if c is not None else '?'}")
    r.add("complete fields", fields_set(c), False)


async def _generate_stream(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    a = await generate(stubs("decode"), generate_request(max_tokens=4, stream=True))
    r.add("status", grpc_outcome(a))
    r.add("messages", message_kinds(a))
    chunk_ids = [t for m in a.messages if m.WhichOneof("response") == "chunk" for t in m.chunk.token_ids]
    r.add("tokens in chunks", str(len(chunk_ids)))
    c = complete_of(a)
    r.add("finish_reason", c.finish_reason if c is not None else "none")
    # smg builds a streamed answer's text from the chunks: a complete that repeated every token would
    # double it.
    r.add("output_ids in the streamed complete", str(len(c.output_ids)) if c is not None else "none")


async def _errors(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    stub = stubs("decode")
    no_input = pb.GenerateRequest(request_id="fid-no-input",
                                  sampling_params=pb.SamplingParams(max_tokens=2))
    r.add("no input", grpc_outcome(await generate(stub, no_input)))
    bad_kv = generate_request(max_tokens=2)
    bad_kv.kv_transfer_params_json = "{not json"
    r.add("malformed kv_transfer_params_json", grpc_outcome(await generate(stub, bad_kv)))
    # A prompt 4 tokens short of the model's context, asking for 50: where the HTTP server answers 400,
    # the gRPC servicer has no such check and the engine stops at the context's end.
    _, info = await unary(stub.GetModelInfo, pb.GetModelInfoRequest())
    ctx = int(info.max_context_length) if info is not None else 0
    if ctx > 8:
        near = near_context_request(ctx, room=4, max_tokens=50)
        a = await generate(stub, near)
        r.add("max_tokens past the context", grpc_outcome(a))
        c = complete_of(a)
        ends = f"{c.finish_reason}, {c.completion_tokens} of 50 tokens (room for 4)" if c else "none"
        r.add("past the context: how it ends", ends)
        near.stream = True
        r.add("max_tokens past the context, streamed", grpc_outcome(await generate(stub, near)))
        r.add("prompt as long as the context",
              grpc_outcome(await generate(stub, near_context_request(ctx, room=0, max_tokens=2))))
    else:
        r.add("max_tokens past the context", "GetModelInfo gave no context length")
    out_of_vocab = pb.GenerateRequest(request_id="fid-vocab",
                                      tokenized=pb.TokenizedInput(input_ids=[4_000_000]),
                                      sampling_params=pb.SamplingParams(max_tokens=2))
    r.add("token id past the vocabulary", grpc_outcome(await generate(stub, out_of_vocab)))


async def _handoff(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    rid = f"fid-pre-{uuid.uuid4().hex[:8]}"
    pre = await generate(stubs("prefill"), generate_request(
        max_tokens=1, kv={"do_remote_decode": True, "do_remote_prefill": False}, request_id=rid))
    r.add("prefill status", grpc_outcome(pre))
    c = complete_of(pre)
    params = params_of(c)
    r.add("prefill kv_transfer_params_json", key_types(params, NIXL_PARAM_KEYS))
    typed = c.kv_transfer_params if c is not None and c.HasField("kv_transfer_params") else None
    r.add("typed kv_transfer_params", "remote_host, remote_port" if typed is not None and typed.remote_port
          else "unset")
    if params is None:
        return
    known = pair.engine_id("prefill")
    r.add("remote_engine_id is the prefill's id",
          str(params.get("remote_engine_id") == known).lower() if known else "unknown")
    rr = str(params.get("remote_request_id"))
    r.add("remote_request_id", "the request id" if rr == rid else
          "the request id + a suffix" if rr.startswith(rid) else "another id", False)
    r.add("remote_block_ids shape", json_type(params.get("remote_block_ids")), False)
    dec = await generate(stubs("decode"), generate_request(max_tokens=4, kv=params))
    r.add("decode status", grpc_outcome(dec))
    dc = complete_of(dec)
    r.add("decode completion tokens", str(dc.completion_tokens) if dc is not None else "none")


async def _abort(stubs: Stubs, pair: GrpcPair, r: ProbeResult) -> None:
    stub = stubs("decode")
    rid = f"fid-abort-{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    kinds: list[str] = []
    ended = "OK"
    aborted = False
    call = stub.Generate(generate_request(max_tokens=400, stream=True, request_id=rid),
                         timeout=ANSWER_BUDGET_S)
    try:
        async for m in call:
            kinds.append(m.WhichOneof("response") or "none")
            if not aborted:
                aborted = True
                await stub.Abort(pb.AbortRequest(request_ids=[rid]), timeout=ANSWER_BUDGET_S)
            elif m.WhichOneof("response") == "complete":
                kinds[-1] = f"complete ({m.complete.finish_reason})"
    except grpc.aio.AioRpcError as exc:
        ended = exc.code().name
    r.add("stream after Abort", f"{ended}; last message {kinds[-1] if kinds else 'none'}"
          if time.monotonic() - start < ANSWER_BUDGET_S else f"no end in {ANSWER_BUDGET_S:g} s")
    r.add("tokens before the end", "all 400" if kinds.count("chunk") >= 400 else "fewer than asked", False)
    after = await generate(stub, generate_request(max_tokens=2))
    r.add("next Generate", grpc_outcome(after))


GRPC_PROBES: tuple[GrpcProbe, ...] = (
    GrpcProbe("grpc_health", "HealthCheck on each engine", _health),
    GrpcProbe("grpc_model_info", "GetModelInfo", _model_info),
    GrpcProbe("grpc_server_info", "GetServerInfo of the prefill (KV connector, role, engine id)",
              _server_info),
    GrpcProbe("grpc_generate", "Generate, not streamed", _generate),
    GrpcProbe("grpc_generate_stream", "Generate, streamed (chunks, then complete)", _generate_stream),
    GrpcProbe("grpc_errors", "status codes for bad requests", _errors),
    GrpcProbe("grpc_handoff", "prefill leg's kv_transfer_params_json, then the decode leg with it",
              _handoff),
    GrpcProbe("grpc_abort", "Abort of a streaming request after its first message; the next Generate",
              _abort),
)


async def run_grpc_probes(pair: GrpcPair, names: list[str] | None = None,
                          say: Callable[[str], None] = lambda _line: None) -> list[ProbeResult]:
    channels = {role: grpc.aio.insecure_channel(pair.grpc_target(role)) for role in ("prefill", "decode")}
    stubs = {role: pbg.VllmEngineStub(ch) for role, ch in channels.items()}
    try:
        return await run_each(GRPC_PROBES, names, lambda p, r: p.run(stubs.__getitem__, pair, r), say)
    finally:
        for ch in channels.values():
            await ch.close()
