"""The asyncio shell of dispatch: performs the legs a core DispatchFlow asks for and streams the answer.

Every decision lives in `core.dispatch_flow` (which workers, the id-read wait, the sanitised prefill leg and
its KV params, retry or fail on a prefill's failure and with which answer, the decode's params, the dispatch
record, the circuit breakers, releasing the workers). This module tokenizes for gRPC workers, runs each leg
over HTTP or gRPC within the deadline the flow gives, relays the decode's answer (streaming or not) and
records the effects each step returns. Every upstream call runs under a deadline, so a wedged worker costs
its own requests only (bug #12).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, assert_never

from aiohttp import web

from pdchaos.stop_strings import cut_at_stop, stop_strings
from pdchaos.waiting import poll_until

from .client_stream import CLIENT_WRITE_TIMEOUT_S, ClientStream
from .config import RouterConfig
from .core import (
    ID_READ_POLL_S,
    Answer,
    AwaitIdRead,
    Backoff,
    DispatchFlow,
    DispatchStep,
    Effects,
    ErrorAnswer,
    LegDone,
    LegResult,
    Prepare,
    RunLeg,
    StopCutter,
    Transport,
    Worker,
    WorkerRegistry,
    dispatch_serialized,
)
from .emit import emit
from .errors import RouterError, UpstreamError
from .events import EventLog
from .metrics import Metrics
from .model_limits import HttpContextLengths
from .openai_format import (
    CHAT,
    SSE_DONE,
    check_budget,
    completion_response,
    prompt_of,
    sse,
    stream_event,
    usage_event,
    wants_usage,
)
from .transports import Transports
from .upstream_grpc import build_generate_request, complete_kv_params
from .upstream_http import open_stream, post_json

log = logging.getLogger(__name__)

DEFAULT_MODEL = "pdchaos-fake"

Prompt = tuple[str, list[int]]


def _generate_request(body: dict[str, Any], prompt: Prompt, request_id: str, endpoint: str) -> Any:
    """A leg's body as a gRPC Generate request over the request's tokenized prompt."""
    return build_generate_request(body, prompt[1], prompt[0], body.get("kv_transfer_params"), request_id,
                                  chat=endpoint == CHAT)


class Dispatcher:
    def __init__(
        self,
        registry: WorkerRegistry,
        transports: Transports,
        cfg: RouterConfig,
        events: EventLog,
        metrics: Metrics,
        on_idle_draining: Callable[[Worker], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.t = transports
        self.cfg = cfg
        self.events = events
        self.metrics = metrics
        self._on_idle_draining = on_idle_draining
        self.clock = clock
        self.policies = cfg.policies()
        self.limits = cfg.limits()
        self.breaker = cfg.breaker()
        self.contexts = HttpContextLengths(lambda: self.t.session, cfg.probe_timeout_s, clock)
        # Bug wedged_stalls_all only: one request at a time (core.dispatch_serialized).
        self._one_at_a_time = asyncio.Lock() if dispatch_serialized(cfg.bugs) else None
        self.client_write_timeout_s = CLIENT_WRITE_TIMEOUT_S

    def _record(self, effects: Effects) -> None:
        emit(effects, self.events, self.metrics, log)

    def _idle(self, workers: tuple[Worker, ...]) -> None:
        for w in workers:
            self._on_idle_draining(w)

    async def handle(self, request: web.Request, endpoint: str, body: dict[str, Any]) -> web.StreamResponse:
        if self._one_at_a_time is None:
            return await self._handle(request, endpoint, body)
        async with self._one_at_a_time:
            return await self._handle(request, endpoint, body)

    async def _handle(self, request: web.Request, endpoint: str, body: dict[str, Any]) -> web.StreamResponse:
        flow = DispatchFlow(body, self.registry, self.policies, self.limits, pd=self.cfg.pd,
                            breaker=self.breaker, bugs=self.cfg.bugs)
        try:
            return await self._run(request, endpoint, body, flow)
        finally:
            idle, effects = flow.close()
            self._idle(idle)
            self._record(effects)

    async def _run(
        self, request: web.Request, endpoint: str, body: dict[str, Any], flow: DispatchFlow
    ) -> web.StreamResponse:
        """Do what the request's flow says, step by step, until it answers."""
        prompt: Prompt | None = None
        relayed: web.StreamResponse | None = None
        step = flow.start(self.clock())
        while True:
            self._record(step.effects)
            self._idle(step.idle)
            match step:
                case Prepare():
                    prompt, problem = await self._prepare(endpoint, body, step.workers)
                    step = flow.on_prepared(problem, self.clock())
                case AwaitIdRead():
                    await poll_until(flow.id_read_settled, step.timeout_s, ID_READ_POLL_S, clock=self.clock)
                    step = flow.on_id_read_waited(self.clock())
                case RunLeg(final=False):
                    result = await self._prefill_leg(step, endpoint, prompt, flow.request_id)
                    step = flow.on_leg_done(result, self.clock())
                case RunLeg():
                    relayed, step = await self._final_leg(request, flow, step, endpoint, prompt)
                case Backoff():
                    await asyncio.sleep(step.seconds)
                    step = flow.on_backoff_done(self.clock())
                case Answer():
                    if step.error is None:
                        assert relayed is not None
                        return relayed
                    if not step.as_200:
                        raise RouterError.from_answer(step.error)
                    return await self._error_as_200(request, endpoint, flow.request_id, body, step.error)
                case _:
                    assert_never(step)

    async def _prepare(
        self, endpoint: str, body: dict[str, Any], workers: tuple[Worker, ...]
    ) -> tuple[Prompt | None, ErrorAnswer | None]:
        """Tokenize once for the request's workers and check it fits their contexts, before any leg."""
        try:
            prompt = await self._prompt(endpoint, body, *workers)
            self._check_budget(endpoint, body, prompt, *workers)
        except RouterError as exc:
            return None, ErrorAnswer(exc.status, exc.code, exc.message, exc.type)
        return prompt, None

    def _check_budget(
        self, endpoint: str, body: dict[str, Any], prompt: Prompt | None, *workers: Worker
    ) -> None:
        """Refuse (400) a request that cannot fit the smallest context its workers report, before any leg."""
        lengths = [n for n in (self._context_of(w) for w in workers) if n is not None]
        check_budget(endpoint, body, None if prompt is None else len(prompt[1]), min(lengths, default=None))

    def _context_of(self, worker: Worker) -> int | None:
        if worker.spec.transport is Transport.GRPC:
            codec = self.t.grpc(worker).known_codec
            return None if codec is None else codec.context_length
        return self.contexts.get(worker)

    async def _prompt(self, endpoint: str, body: dict[str, Any], *workers: Worker) -> Prompt | None:
        """Tokenize once (with the first gRPC worker's tokenizer that can be had) so both legs see the same
        ids. A worker whose tokenizer cannot be fetched falls back to the next one: that worker's own leg then
        fails (or is retried) as a leg, with its dispatch record."""
        grpc_workers = [w for w in workers if w.spec.transport is Transport.GRPC]
        for i, w in enumerate(grpc_workers):
            try:
                codec = await self.t.grpc(w).codec(self.cfg.request_timeout_s)
            except TimeoutError as exc:
                raise RouterError(504, "upstream_timeout", f"tokenizer of {w.id} timed out") from exc
            except UpstreamError as exc:
                if i + 1 < len(grpc_workers):
                    continue
                raise exc.to_router_error("tokenizer") from exc
            return prompt_of(endpoint, body, codec)
        return None

    async def _prefill_leg(
        self, leg: RunLeg, endpoint: str, prompt: Prompt | None, request_id: str
    ) -> LegResult:
        """Run one prefill leg: the kv_transfer_params its answer carried, or how it failed."""
        worker, leg_body = leg.worker, leg.body
        try:
            if worker.spec.transport is Transport.GRPC:
                assert prompt is not None
                req = _generate_request(leg_body, prompt, f"{request_id}-p", endpoint)
                complete = await self.t.grpc(worker).generate_complete(req, leg.timeout_s)
                return LegDone(complete_kv_params(complete))
            payload = await post_json(self.t.session, f"{worker.spec.url}{endpoint}", leg_body, leg.timeout_s)
        except UpstreamError as exc:
            return exc.leg_error()
        params = payload.get("kv_transfer_params")
        return LegDone(params if isinstance(params, dict) else None)

    async def _final_leg(
        self, request: web.Request, flow: DispatchFlow, leg: RunLeg, endpoint: str, prompt: Prompt | None
    ) -> tuple[web.StreamResponse | None, DispatchStep]:
        """The leg whose answer the client sees (decode, or the only leg in regular mode): the answer relayed
        (None: it failed before any of it went out) and the flow's next step."""
        worker, leg_body = leg.worker, leg.body
        stream = bool(leg_body.get("stream"))
        try:
            if worker.spec.transport is Transport.GRPC:
                assert prompt is not None
                if stream:
                    return await self._grpc_stream(request, flow, leg, endpoint, prompt)
                answer = await self._grpc_complete(leg, endpoint, prompt, flow.request_id)
                return web.json_response(answer), flow.on_leg_done(LegDone(), self.clock())
            url = f"{worker.spec.url}{endpoint}"
            if stream:
                return await self._http_stream(request, flow, leg, url)
            payload = await post_json(self.t.session, url, leg_body, leg.timeout_s)
            return web.json_response(payload), flow.on_leg_done(LegDone(), self.clock())
        except UpstreamError as exc:
            return None, flow.on_leg_done(exc.leg_error(), self.clock())

    def _model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) and model else (self.cfg.model or DEFAULT_MODEL)

    async def _grpc_complete(
        self, leg: RunLeg, endpoint: str, prompt: Prompt, request_id: str
    ) -> dict[str, Any]:
        client = self.t.grpc(leg.worker)
        body = leg.body
        req = _generate_request(body, prompt, request_id, endpoint)
        complete = await client.generate_complete(req, leg.timeout_s)
        codec = await client.codec(self.cfg.request_timeout_s)
        text = cut_at_stop(codec.decode_output(list(complete.output_ids)), stop_strings(body))
        return completion_response(
            endpoint, request_id, self._model(body), text, complete.finish_reason,
            complete.prompt_tokens or len(prompt[1]), complete.completion_tokens or len(complete.output_ids),
        )

    async def _grpc_stream(
        self, request: web.Request, flow: DispatchFlow, leg: RunLeg, endpoint: str, prompt: Prompt
    ) -> tuple[web.StreamResponse, DispatchStep]:
        client = self.t.grpc(leg.worker)
        codec = await client.codec(self.cfg.request_timeout_s)
        body, request_id = leg.body, flow.request_id
        model = self._model(body)
        messages = client.generate(_generate_request(body, prompt, request_id, endpoint), leg.timeout_s)
        # Wait for the first message before answering 200, so an immediate failure is still a clean error.
        first = await anext(messages, None)
        resp = ClientStream(request, self.client_write_timeout_s)
        await resp.prepare()
        decoder = codec.streamer()
        cutter = StopCutter(stop_strings(body))
        finish: str | None = None
        streamed = 0
        used = 0
        try:
            msg = first
            while msg is not None:
                if msg.HasField("chunk"):
                    streamed += len(msg.chunk.token_ids)
                    delta = cutter.push(decoder.push(list(msg.chunk.token_ids)))
                    if delta:
                        await resp.write(stream_event(endpoint, request_id, model, delta, None))
                elif msg.HasField("complete"):
                    # The complete message may repeat every output id already streamed: only the rest is new.
                    rest = list(msg.complete.output_ids)[streamed:]
                    tail = cutter.push(decoder.push(rest) + decoder.flush()) + cutter.flush()
                    if tail:
                        await resp.write(stream_event(endpoint, request_id, model, tail, None))
                    finish = msg.complete.finish_reason or "stop"
                    used = msg.complete.completion_tokens or streamed + len(rest)
                msg = await anext(messages, None)
            await resp.write(stream_event(endpoint, request_id, model, "", finish or "stop"))
            if wants_usage(body):
                await resp.write(usage_event(endpoint, request_id, model, len(prompt[1]), used or streamed))
            step = flow.on_leg_done(LegDone(), self.clock())
        except UpstreamError as exc:
            await resp.write(sse({"error": {"message": str(exc), "type": "server_error", "code": exc.code}}))
            step = flow.on_leg_done(exc.leg_error(), self.clock(), after_headers=True)
        finally:
            with contextlib.suppress(Exception):
                await messages.aclose()
        await resp.write(SSE_DONE)
        return await resp.write_eof(), step

    async def _http_stream(
        self, request: web.Request, flow: DispatchFlow, leg: RunLeg, url: str
    ) -> tuple[web.StreamResponse, DispatchStep]:
        upstream = await open_stream(self.t.session, url, leg.body, leg.timeout_s)
        resp = ClientStream(request, self.client_write_timeout_s)
        await resp.prepare()
        saw_done = False
        tail = b""
        try:
            async for data in upstream.chunks():
                tail = (tail + data)[-64:]
                await resp.write(data)
            saw_done = b"[DONE]" in tail
            step = flow.on_leg_done(LegDone(), self.clock())
        except UpstreamError as exc:
            err = {"error": {"message": str(exc), "type": "server_error", "code": exc.code}}
            await resp.write(b"\n" + sse(err))
            step = flow.on_leg_done(exc.leg_error(), self.clock(), after_headers=True)
        finally:
            upstream.close()
        if not saw_done:
            await resp.write(SSE_DONE)
        return await resp.write_eof(), step

    async def _error_as_200(
        self, request: web.Request, endpoint: str, request_id: str, body: dict[str, Any], error: ErrorAnswer
    ) -> web.StreamResponse:
        """Bug error_as_200: an error answered as a 200 completion with finish_reason "error" and no
        content."""
        log.warning("answering %s %s as 200 (bug error_as_200)", error.status, error.message)
        model = self._model(body)
        if not body.get("stream"):
            return web.json_response(completion_response(endpoint, request_id, model, "", "error", 0, 0))
        resp = ClientStream(request, self.client_write_timeout_s)
        await resp.prepare()
        await resp.write(stream_event(endpoint, request_id, model, "", "error"))
        await resp.write(SSE_DONE)
        return await resp.write_eof()
