"""PD dispatch: choose both workers, run the sanitised prefill leg, then the decode leg with the handoff.

Sequential by design: a prefill failure is answered at once, never after the decode's deadline (bug #9). Every
upstream call runs under the request timeout, so a wedged worker costs its own requests only (bug #12). No
Ready worker for a leg is a prompt 503 `no_available_workers` (bug #8). The KV params come from the core
(`plan_handoff`, `sanitize_prefill_body`, `decode_body`). A prefill leg that never reached its worker
(connection refused) runs again on another Ready prefill within the request's deadline, and that worker is
probed at once (`core.retry`); the decode leg is never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .config import RouterConfig
from .core import (
    Connector,
    Delivery,
    HandoffPlan,
    ProbeStage,
    Role,
    Transport,
    Worker,
    WorkerRegistry,
    avoid_suspects,
    decide_retry,
    decode_body,
    make_policy,
    mark_suspect,
    plan_handoff,
    sanitize_prefill_body,
)
from .errors import RouterError, UpstreamError
from .events import EventLog
from .metrics import Metrics
from .openai_format import SSE_DONE, completion_response, prompt_of, sse, stream_event
from .transports import Transports
from .upstream_grpc import build_generate_request, complete_kv_params
from .upstream_http import open_stream, post_json

log = logging.getLogger(__name__)

DEFAULT_MODEL = "pdchaos-fake"


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
        seed = cfg.seed
        # One policy instance per leg: a shared round-robin cursor would skew both legs (bug #10).
        self.prefill_policy = make_policy(cfg.prefill_policy, seed)
        self.decode_policy = make_policy(cfg.decode_policy, None if seed is None else seed + 1)
        self.regular_policy = make_policy(cfg.decode_policy, None if seed is None else seed + 2)

    def _pick(self, role: Role) -> Worker:
        policy = {Role.PREFILL: self.prefill_policy, Role.DECODE: self.decode_policy}.get(
            role, self.regular_policy
        )
        candidates = self.registry.ready(role)
        if role is Role.PREFILL:
            # A prefill whose engine-id re-read is still running may be about to learn a new id (it came back
            # from NotReady/Failed, or its id is unconfirmed): prefer one whose id is settled.
            settled = [w for w in candidates if not _id_read_pending(w)]
            candidates = settled or candidates
        # A worker a request could not reach moments ago is probed at once; until then, prefer the others.
        candidates = avoid_suspects(candidates)
        worker = policy.select(candidates, self.clock())
        if worker is None:
            msg = f"no Ready {role.value} worker"
            raise RouterError(503, "no_available_workers", msg, "service_unavailable")
        return worker

    async def _await_id_read(self, worker: Worker) -> None:
        """A worker turns Ready at the probe that promotes it, before the engine-id re-read that follows ends.
        A request in that window would mint the id from before the outage (the dead engine's: a transfer
        timeout) or none at all; wait for the read instead. Bounded by the read's own deadline."""
        if not _id_read_pending(worker):
            return
        deadline = self.clock() + self.cfg.probe_timeout_s
        while _id_read_pending(worker) and self.clock() < deadline:
            await asyncio.sleep(0.005)

    def _hold(self, worker: Worker) -> None:
        worker.runtime.in_flight_requests += 1

    def _release(self, worker: Worker) -> None:
        worker.runtime.in_flight_requests -= 1
        if worker.runtime.in_flight_requests <= 0:
            worker.runtime.in_flight_requests = 0
            self._on_idle_draining(worker)

    async def handle(self, request: web.Request, endpoint: str, body: dict[str, Any]) -> web.StreamResponse:
        request_id = f"req-{uuid.uuid4().hex}"
        if not self.cfg.pd:
            worker = self._pick(Role.REGULAR)
            self._hold(worker)
            try:
                return await self._final_leg(request, worker, endpoint, dict(body), None, request_id)
            finally:
                self._release(worker)
        deadline = self.clock() + self.cfg.request_timeout_s
        prefill = self._pick(Role.PREFILL)
        decode = self._pick(Role.DECODE)
        # Both workers count the request until it ends: a Mooncake decode pulls from the prefill after the
        # prefill leg answered, so a draining prefill must outlive it.
        self._hold(prefill)
        self._hold(decode)
        try:
            prompt = await self._prompt(endpoint, body, prefill, decode)
            retried_from: list[str] = []
            while True:
                record, plan = await self._plan(prefill, decode, request_id, retried_from)
                try:
                    returned = await self._prefill_leg(
                        prefill, endpoint, body, plan, prompt, request_id, deadline - self.clock()
                    )
                    break
                except UpstreamError as exc:
                    nxt = self._retry_prefill(prefill, exc, retried_from, deadline)
                    if nxt is None:
                        self._dispatched(record, exc.status, "prefill_failed", str(exc))
                        raise exc.to_router_error("prefill") from exc
                    retried_from.append(prefill.id)
                    self._release(prefill)
                    prefill = nxt
                    self._hold(prefill)
            decode_params = plan.decode_params(returned)
            if plan.connector is Connector.NIXL and decode_params is None:
                problem = HandoffPlan.nixl_relay_problem(returned)
                if problem:
                    self._mint_skipped(problem, request_id, prefill)
            return await self._final_leg(
                request, decode, endpoint, decode_body(body, decode_params), prompt, request_id, record
            )
        finally:
            self._release(prefill)
            self._release(decode)

    async def _plan(
        self, prefill: Worker, decode: Worker, request_id: str, retried_from: list[str]
    ) -> tuple[dict[str, Any], HandoffPlan]:
        """The handoff for this prefill, and the dispatch record that tells it (with the prefills tried
        before it for this request, when any)."""
        await self._await_id_read(prefill)
        plan = plan_handoff(prefill)
        record: dict[str, Any] = {
            "request_id": request_id, "prefill": prefill.id, "decode": decode.id,
            "prefill_url": prefill.spec.url, "decode_url": decode.spec.url,
            "connector": plan.connector.value if plan.connector else None,
            "transfer_id": plan.transfer_id, "remote_engine_id": plan.remote_engine_id,
        }
        if retried_from:
            record["retried_from"] = list(retried_from)
        if plan.mint_skipped:
            self._mint_skipped(plan.mint_skipped, request_id, prefill)
        return record, plan

    def _retry_prefill(
        self, failed: Worker, exc: UpstreamError, retried_from: list[str], deadline: float
    ) -> Worker | None:
        """The prefill to run the failed leg on next, or None when the failure is final (core.retry)."""
        now = self.clock()
        if exc.delivery is Delivery.NOT_SENT and mark_suspect(failed, now):
            self.events.emit("worker_suspect", worker=failed.id, url=failed.spec.url, error=str(exc))
        decision = decide_retry(
            exc.delivery, [*retried_from, failed.id], self.registry.ready(Role.PREFILL), now, deadline
        )
        if not decision.retry:
            if exc.delivery is Delivery.NOT_SENT:
                self.metrics.inc("pdchaos_router_leg_retries_total", leg="prefill", outcome=decision.reason)
            return None
        nxt = self.prefill_policy.select(avoid_suspects(list(decision.candidates)), now)
        if nxt is None:  # a policy always picks from a non-empty list; kept for the type checker
            return None
        self.metrics.inc("pdchaos_router_leg_retries_total", leg="prefill", outcome="retried")
        log.warning("prefill leg to %s never reached it (%s): retrying on %s", failed.id, exc, nxt.id)
        return nxt

    def _mint_skipped(self, reason: str, request_id: str, prefill: Worker) -> None:
        self.metrics.inc("pdchaos_router_mint_skipped_total", reason=reason)
        self.events.emit("mint_skipped", reason=reason, request_id=request_id, worker=prefill.id,
                         url=prefill.spec.url)
        log.warning("no KV handoff for %s via %s: %s (decode recomputes)", request_id, prefill.id, reason)

    def _dispatched(
        self, record: dict[str, Any], status: int, outcome: str, error: str | None = None
    ) -> None:
        self.metrics.inc("pdchaos_router_dispatches_total", connector=str(record.get("connector")),
                         outcome=outcome)
        self.events.emit("dispatch", **record, status=status, outcome=outcome, error=error)

    async def _prompt(
        self, endpoint: str, body: dict[str, Any], *workers: Worker
    ) -> tuple[str, list[int]] | None:
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
        self, worker: Worker, endpoint: str, body: dict[str, Any], plan: HandoffPlan,
        prompt: tuple[str, list[int]] | None, request_id: str, timeout: float,
    ) -> dict[str, Any] | None:
        """Run the prefill leg within `timeout` (what is left of the request's deadline); returns the
        kv_transfer_params its answer carried (None when none)."""
        leg_body = sanitize_prefill_body(body, plan.prefill_params)
        timeout = max(timeout, 0.001)
        if worker.spec.transport is Transport.GRPC:
            assert prompt is not None
            req = build_generate_request(
                leg_body, prompt[1], prompt[0], leg_body.get("kv_transfer_params"), f"{request_id}-p"
            )
            req.sampling_params.ignore_eos = True
            complete = await self.t.grpc(worker).generate_complete(req, timeout)
            return complete_kv_params(complete)
        payload = await post_json(self.t.session, f"{worker.spec.url}{endpoint}", leg_body, timeout)
        params = payload.get("kv_transfer_params")
        return params if isinstance(params, dict) else None

    async def _final_leg(
        self, request: web.Request, worker: Worker, endpoint: str, leg_body: dict[str, Any],
        prompt: tuple[str, list[int]] | None, request_id: str, record: dict[str, Any] | None = None,
    ) -> web.StreamResponse:
        """The leg whose answer the client sees (decode, or the only leg in regular mode)."""
        record = record or {"request_id": request_id, "prefill": None, "decode": worker.id,
                            "decode_url": worker.spec.url, "connector": None, "transfer_id": None,
                            "remote_engine_id": None}
        stream = bool(leg_body.get("stream"))
        try:
            if worker.spec.transport is Transport.GRPC:
                if prompt is None:
                    prompt = await self._prompt(endpoint, leg_body, worker)
                assert prompt is not None
                if stream:
                    return await self._grpc_stream(
                        request, worker, endpoint, leg_body, prompt, request_id, record
                    )
                answer = await self._grpc_complete(worker, endpoint, leg_body, prompt, request_id)
                self._dispatched(record, 200, "ok")
                return web.json_response(answer)
            url = f"{worker.spec.url}{endpoint}"
            if stream:
                return await self._http_stream(request, url, leg_body, record)
            payload = await post_json(self.t.session, url, leg_body, self.cfg.request_timeout_s)
            self._dispatched(record, 200, "ok")
            return web.json_response(payload)
        except UpstreamError as exc:
            self._dispatched(record, exc.status, "decode_failed", str(exc))
            raise exc.to_router_error("decode") from exc

    def _model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) and model else (self.cfg.model or DEFAULT_MODEL)

    async def _grpc_complete(
        self, worker: Worker, endpoint: str, body: dict[str, Any], prompt: tuple[str, list[int]],
        request_id: str,
    ) -> dict[str, Any]:
        client = self.t.grpc(worker)
        req = build_generate_request(body, prompt[1], prompt[0], body.get("kv_transfer_params"), request_id)
        complete = await client.generate_complete(req, self.cfg.request_timeout_s)
        codec = await client.codec(self.cfg.request_timeout_s)
        text = codec.decode(list(complete.output_ids))
        return completion_response(
            endpoint, request_id, self._model(body), text, complete.finish_reason,
            complete.prompt_tokens or len(prompt[1]), complete.completion_tokens or len(complete.output_ids),
        )

    async def _grpc_stream(
        self, request: web.Request, worker: Worker, endpoint: str, body: dict[str, Any],
        prompt: tuple[str, list[int]], request_id: str, record: dict[str, Any],
    ) -> web.StreamResponse:
        client = self.t.grpc(worker)
        codec = await client.codec(self.cfg.request_timeout_s)
        req = build_generate_request(body, prompt[1], prompt[0], body.get("kv_transfer_params"), request_id)
        model = self._model(body)
        messages = client.generate(req, self.cfg.request_timeout_s)
        # Wait for the first message before answering 200, so an immediate failure is still a clean error.
        first = await anext(messages, None)
        resp = _sse_response()
        await resp.prepare(request)
        decoder = codec.streamer()
        finish: str | None = None
        streamed = 0
        try:
            msg = first
            while msg is not None:
                if msg.HasField("chunk"):
                    streamed += len(msg.chunk.token_ids)
                    delta = decoder.push(list(msg.chunk.token_ids))
                    if delta:
                        await resp.write(stream_event(endpoint, request_id, model, delta, None))
                elif msg.HasField("complete"):
                    # The complete message may repeat every output id already streamed: only the rest is new.
                    rest = list(msg.complete.output_ids)[streamed:]
                    tail = decoder.push(rest) + decoder.flush()
                    if tail:
                        await resp.write(stream_event(endpoint, request_id, model, tail, None))
                    finish = msg.complete.finish_reason or "stop"
                msg = await anext(messages, None)
            await resp.write(stream_event(endpoint, request_id, model, "", finish or "stop"))
            self._dispatched(record, 200, "ok")
        except UpstreamError as exc:
            await resp.write(sse({"error": {"message": str(exc), "type": "server_error", "code": exc.code}}))
            self._dispatched(record, 200, "decode_stream_failed", str(exc))
        finally:
            with contextlib.suppress(Exception):
                await messages.aclose()
        await resp.write(SSE_DONE)
        await resp.write_eof()
        return resp

    async def _http_stream(
        self, request: web.Request, url: str, body: dict[str, Any], record: dict[str, Any]
    ) -> web.StreamResponse:
        upstream = await open_stream(self.t.session, url, body, self.cfg.request_timeout_s)
        resp = _sse_response()
        await resp.prepare(request)
        saw_done = False
        tail = b""
        try:
            async for data in upstream.chunks():
                tail = (tail + data)[-64:]
                await resp.write(data)
            saw_done = b"[DONE]" in tail
            self._dispatched(record, 200, "ok")
        except UpstreamError as exc:
            err = {"error": {"message": str(exc), "type": "server_error", "code": exc.code}}
            await resp.write(b"\n" + sse(err))
            self._dispatched(record, 200, "decode_stream_failed", str(exc))
        finally:
            upstream.close()
        if not saw_done:
            await resp.write(SSE_DONE)
        await resp.write_eof()
        return resp


def _id_read_pending(worker: Worker) -> bool:
    """An engine-id re-read is running for a worker whose id the router mints (Mooncake, or not known yet)."""
    return (worker.runtime.probe_stage is ProbeStage.REREAD
            and worker.connector in (None, Connector.MOONCAKE))


def _sse_response() -> web.StreamResponse:
    return web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )

