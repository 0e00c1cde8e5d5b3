"""Tiny in-process engines on loopback for the router's tests and benchmark (not the fake engines).

They answer instantly, record every generate request exactly as received (so tests can assert the handoff
parameters of each leg), and can be told to fail, hang or change identity. HTTP: OpenAI-compatible app plus a
Mooncake bootstrap `/query` server. gRPC: a `VllmEngine` servicer that serves a byte-level tokenizer zip.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from pdchaos.ports import LOOPBACK
from pdchaos.proto import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc
from pdchaos.waiting import wait_true


def byte_level_tokenizer() -> Tokenizer:
    """A lossless tokenizer: one token per byte (no merges), byte-level pre-tokenizer and decoder."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def tokenizer_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("tokenizer.json", byte_level_tokenizer().to_str())
        zf.writestr("tokenizer_config.json", json.dumps({"chat_template": ""}))
        zf.writestr("config.json", json.dumps({"model_type": "stub"}))
    return buf.getvalue()


def write_model_dir(path: Path) -> Path:
    """The stub's tokenizer files as a local model folder (for `StubState.model_dir`)."""
    path.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(tokenizer_zip())) as zf:
        zf.extractall(path)
    return path


_FOREVER = 3600.0


@dataclass
class StubState:
    """Behaviour knobs and records shared by both transports."""

    name: str
    role: str  # prefill | decode
    connector: str  # mooncake | nixl | none
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    model: str = "pdchaos-fake"
    healthy: bool = True
    hang_health: bool = False
    hang_generate: bool = False
    hang_server_info: bool = False
    fail_server_info: bool = False
    server_info_delay_s: float = 0.0
    generate_status: int = 200
    generate_error: str = "stub failure"  # a failed generate's message (a decode's "KV load failed: ...")
    output_text: str = ""
    started_at: float = field(default_factory=time.monotonic)
    nixl_port: int = 5600
    # A local folder holding the stub's tokenizer (`write_model_dir`), reported as `GetModelInfo.model_path`
    # as vLLM reports its model folder; None: a path that is no folder (a gateway then tries to fetch it).
    model_dir: str | None = None
    received: list[dict[str, Any]] = field(default_factory=list)
    probes: int = 0
    server_info_calls: int = 0
    _seq: int = 0

    async def hold_while_hung(self) -> None:
        """A wedged generate: no answer until a test clears hang_generate (or forever)."""
        while self.hang_generate:
            await asyncio.sleep(0.02)

    async def answer_server_info(self) -> bool:
        """Count a metadata read and wait as told (forever when hung); False when it is to fail."""
        self.server_info_calls += 1
        await asyncio.sleep(self.server_info_delay_s)
        if self.hang_server_info:
            await asyncio.sleep(_FOREVER)
        return not self.fail_server_info

    def restart(self, engine_id: str | None = None) -> None:
        """A new identity as a restart gives one: new id, uptime from zero."""
        self.engine_id = engine_id or uuid.uuid4().hex
        self.started_at = time.monotonic()

    def answer_text(self) -> str:
        return self.output_text or f" answer from {self.name}"

    def prefill_kv_params(self, request_id: str) -> dict[str, Any] | None:
        if self.connector != "nixl" or self.role != "prefill":
            return None
        self._seq += 1
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_block_ids": [self._seq, self._seq + 1],
            "remote_host": LOOPBACK,
            "remote_port": self.nixl_port,
            "tp_size": 1,
        }


class HttpStubEngine:
    """OpenAI-compatible stub on a free loopback port; a Mooncake prefill also serves `/query`."""

    def __init__(self, state: StubState, bootstrap: bool = False) -> None:
        self.state = state
        self._bootstrap = bootstrap
        self._runners: list[web.AppRunner] = []
        self.port = 0
        self.bootstrap_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def start(self) -> HttpStubEngine:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        self.port = await self._serve(app, self.port)
        if self._bootstrap:
            boot = web.Application()
            boot.router.add_get("/query", self._query)
            self.bootstrap_port = await self._serve(boot, self.bootstrap_port or 0)
        return self

    async def _serve(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, LOOPBACK, port)
        await site.start()
        self._runners.append(runner)
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    async def _health(self, request: web.Request) -> web.Response:
        self.state.probes += 1
        if self.state.hang_health:
            await asyncio.sleep(_FOREVER)
        return web.Response(status=200 if self.state.healthy else 503)

    async def _models(self, request: web.Request) -> web.Response:
        # `owned_by: vllm` as vLLM says it: smg tells a vLLM worker from a generic OpenAI server by it.
        return web.json_response(
            {"object": "list", "data": [{"id": self.state.model, "object": "model", "owned_by": "vllm"}]})

    async def _query(self, request: web.Request) -> web.Response:
        if not await self.state.answer_server_info():
            return web.Response(status=500)
        addr = {"0": {"0": f"tcp://{LOOPBACK}:{self.state.nixl_port}"}}
        return web.json_response({"0": {"engine_id": self.state.engine_id, "worker_addr": addr}})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.state.received.append({"path": request.path, "body": body})
        await self.state.hold_while_hung()
        if self.state.generate_status != 200:
            return web.json_response({"error": {"message": self.state.generate_error, "code": "stub"}},
                                     status=self.state.generate_status)
        chat = request.path.endswith("chat/completions")
        rid = f"cmpl-{uuid.uuid4().hex[:12]}"
        text = self.state.answer_text()
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for piece in (text[: len(text) // 2], text[len(text) // 2:]):
                choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                choice.update({"delta": {"content": piece}} if chat else {"text": piece})
                await resp.write(b"data: " + json.dumps({"id": rid, "choices": [choice]}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        choice = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        return web.json_response({
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "model": self.state.model,
            "choices": [choice],
            "kv_transfer_params": self.state.prefill_kv_params(rid),
        })


class _Servicer(vllm_engine_pb2_grpc.VllmEngineServicer):  # type: ignore[misc]
    def __init__(self, state: StubState) -> None:
        self.state = state
        self._tok = byte_level_tokenizer()
        self._zip = tokenizer_zip()

    async def HealthCheck(self, request: Any, context: Any) -> Any:
        self.state.probes += 1
        if self.state.hang_health:
            await asyncio.sleep(_FOREVER)
        return vllm_engine_pb2.HealthCheckResponse(healthy=self.state.healthy, message="stub")

    async def GetServerInfo(self, request: Any, context: Any) -> Any:
        if not await self.state.answer_server_info():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server info failed")
        names = {"mooncake": "MooncakeConnector", "nixl": "NixlConnector"}
        return vllm_engine_pb2.GetServerInfoResponse(
            kv_connector=names.get(self.state.connector, ""),
            kv_role="kv_producer" if self.state.role == "prefill" else "kv_consumer",
            kv_engine_id=self.state.engine_id,
            uptime_seconds=time.monotonic() - self.state.started_at,
            data_parallel_size=1,
            server_type="vllm-grpc",
            block_size=16,
            kv_cache_dtype="auto",
            model_dtype="torch.bfloat16",
        )

    async def GetModelInfo(self, request: Any, context: Any) -> Any:
        path = self.state.model_dir or "stub/not-a-local-folder"
        return vllm_engine_pb2.GetModelInfoResponse(
            model_path=path, tokenizer_path=self.state.model_dir or "", served_model_name=self.state.model,
            is_generation=True, vocab_size=256, max_context_length=4096,
        )

    async def GetTokenizer(self, request: Any, context: Any) -> Any:
        half = len(self._zip) // 2
        yield common_pb2.GetTokenizerChunk(data=self._zip[:half])
        digest = hashlib.sha256(self._zip).hexdigest()
        yield common_pb2.GetTokenizerChunk(data=self._zip[half:], sha256=digest)

    async def Generate(self, request: Any, context: Any) -> Any:
        has_kv = request.HasField("kv_transfer_params_json")
        kv = json.loads(request.kv_transfer_params_json) if has_kv else None
        self.state.received.append({
            "request_id": request.request_id,
            "input_ids": list(request.tokenized.input_ids),
            "text": request.tokenized.original_text,
            "max_tokens": request.sampling_params.max_tokens,
            "stream": request.stream,
            "kv_transfer_params": kv,
        })
        await self.state.hold_while_hung()
        if self.state.generate_status != 200:
            await context.abort(grpc.StatusCode.INTERNAL, self.state.generate_error)
        ids = list(self._tok.encode(self.state.answer_text(), add_special_tokens=False).ids)
        if request.stream:
            half = len(ids) // 2
            for part in (ids[:half], ids[half:]):
                chunk = vllm_engine_pb2.GenerateStreamChunk(token_ids=part)
                yield vllm_engine_pb2.GenerateResponse(chunk=chunk)
        complete = vllm_engine_pb2.GenerateComplete(
            output_ids=[] if request.stream else ids, finish_reason="length",
            prompt_tokens=len(request.tokenized.input_ids), completion_tokens=len(ids),
        )
        params = self.state.prefill_kv_params(request.request_id)
        if params is not None:
            complete.kv_transfer_params_json = json.dumps(params)
        yield vllm_engine_pb2.GenerateResponse(complete=complete)


class GrpcStubEngine:
    """`VllmEngine` stub on a free loopback port."""

    def __init__(self, state: StubState) -> None:
        self.state = state
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def url(self) -> str:
        return f"grpc://{LOOPBACK}:{self.port}"

    async def start(self) -> GrpcStubEngine:
        server = grpc.aio.server()
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(_Servicer(self.state), server)
        self.port = server.add_insecure_port(f"{LOOPBACK}:{self.port}")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None


class InProcessRouter:
    """A RouterServer on a free loopback port in this event loop, with a client session (tests, bench)."""

    def __init__(self, cfg: Any) -> None:
        from .server import RouterServer

        self.server = RouterServer(cfg)
        self.base = ""
        self.session: Any = None

    async def __aenter__(self) -> InProcessRouter:
        import aiohttp

        port = await self.server.start()
        self.base = f"http://{LOOPBACK}:{port}"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        await self.server.stop()

    async def wait_ready(self, timeout_s: float = 5.0) -> None:
        """Until every leg has a Ready worker; TimeoutError past timeout_s."""
        from .core import ProbeStage

        def ready() -> bool:
            # Also wait out the id read that follows a promotion, so tests start from a settled router.
            settled = all(w.runtime.probe_stage is not ProbeStage.REREAD for w in self.server.registry.all())
            return settled and all(self.server.legs_ready().values())

        await wait_true(ready, timeout_s, "router legs ready")

