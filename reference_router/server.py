"""The router's aiohttp application: OpenAI endpoints, health/readiness/metrics/events and the worker API.

A thin shell: worker state and every decision live in `core`; dispatch and health checking in their own
modules. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pdchaos.aiohttp_errors import answer_parser_errors_as_json

from .config import RouterConfig, initial_specs
from .core import (
    DuplicateWorkerError,
    Role,
    Status,
    Worker,
    WorkerRegistry,
    set_draining,
    spec_from_json,
    worker_api_dict,
)
from .core.worker_urls import url_problem
from .dispatch import DEFAULT_MODEL, Dispatcher
from .errors import RouterError
from .events import EventLog
from .health_loop import HealthLoop
from .metrics import Metrics
from .openai_format import CHAT, COMPLETIONS, validate_body
from .prober import Prober
from .transports import Transports
from .upstream_grpc import we_are_cancelled

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI-style JSON error; the router keeps serving."""
    try:
        return await handler(request)
    except RouterError as exc:
        return exc.response()
    except web.HTTPRequestEntityTooLarge as exc:
        return RouterError(413, "request_too_large", f"request body too large: {exc.text}").response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return RouterError(exc.status, code, exc.reason).response()
    except asyncio.CancelledError:
        if we_are_cancelled():
            raise
        # Something under the handler was cancelled, not the handler: still an answer, never a dropped socket.
        return RouterError(502, "upstream_error", "an upstream call was cancelled").response()
    except ConnectionResetError:
        raise
    except Exception as exc:
        log.exception("unhandled error on %s", request.path)
        return RouterError(500, "internal_error", f"{exc.__class__.__name__}: {exc}").response()


class RouterServer:
    def __init__(self, cfg: RouterConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.events = EventLog(cfg.events_file)
        self.metrics = Metrics()
        self.registry = WorkerRegistry(cfg.bugs)
        self.transports = Transports()
        self.health = HealthLoop(
            self.registry, cfg.health(), Prober(self.transports), self.events, self.metrics, clock
        )
        self.dispatcher = Dispatcher(
            self.registry, self.transports, cfg, self.events, self.metrics, self._maybe_remove, clock
        )
        self.metrics.gauge("pdchaos_router_workers", self._worker_gauge)
        self.metrics.gauge("pdchaos_router_probes_in_flight", lambda: [({}, self.health.probes_in_flight())])
        self.app = self._build_app()
        self._runner: web.AppRunner | None = None
        self.port = 0
        for spec in initial_specs(cfg):
            self._add(spec)

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes, middlewares=[_errors])
        r = app.router
        r.add_post(COMPLETIONS, self._completions)
        r.add_post(CHAT, self._chat)
        r.add_get("/v1/models", self._models)
        r.add_get("/v1/models/{model:.+}", self._model)
        r.add_get("/health", self._health)
        r.add_get("/readiness", self._readiness)
        r.add_get("/metrics", self._metrics)
        r.add_get("/events", self._events)
        r.add_get("/workers", self._list_workers)
        r.add_post("/workers", self._add_worker)
        r.add_get("/workers/{id}", self._get_worker)
        r.add_patch("/workers/{id}", self._patch_worker)
        r.add_delete("/workers/{id}", self._delete_worker)
        return app

    async def start(self) -> int:
        # A client that hangs up cancels its handler, so its upstream legs are abandoned at once.
        self._runner = web.AppRunner(
            self.app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        # aiohttp answers its own parse errors (unknown method, oversized headers) in plain text.
        answer_parser_errors_as_json(self._runner, lambda status, message: RouterError(
            status, "http_error", message).body())
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self.health.start()
        return self.port

    async def stop(self) -> None:
        await self.health.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.dispatcher.contexts.close()
        await self.transports.close()
        self.events.close()

    # ---- workers -------------------------------------------------------------------------------------------

    def _add(self, spec: Any) -> Worker:
        worker = self.registry.add(spec)
        self.events.emit("status_change", worker=worker.id, url=spec.url, role=spec.role.value,
                         **{"from": None, "to": worker.status.value})
        return worker

    def _maybe_remove(self, worker: Worker) -> None:
        """Remove a Draining worker once its last in-flight request ended."""
        if worker.runtime.status is not Status.DRAINING or worker.runtime.in_flight_requests > 0:
            return
        if self.registry.remove(worker.id) is None:
            return
        self.health.forget(worker.id)
        self.events.emit("status_change", worker=worker.id, url=worker.spec.url,
                         **{"from": Status.DRAINING.value, "to": "removed"})
        if not any(w.spec.url == worker.spec.url for w in self.registry.all()):
            task = asyncio.get_running_loop().create_task(self.transports.forget(worker))
            task.add_done_callback(lambda _t: None)

    def _worker_gauge(self) -> list[tuple[dict[str, str], float]]:
        counts = Counter((w.role.value, w.status.value) for w in self.registry.all())
        return [({"role": r, "status": s}, float(n)) for (r, s), n in sorted(counts.items())]

    def _check_key(self, request: web.Request) -> None:
        key = self.cfg.api_key
        if not key:
            return
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise RouterError(401, "unauthorized", "missing or wrong API key", "authentication_error")

    def _api(self, worker: Worker) -> dict[str, Any]:
        """The worker API record, as this router's switches show it."""
        return worker_api_dict(worker, self.registry.bugs)

    def _worker_or_404(self, request: web.Request) -> Worker:
        worker = self.registry.get(request.match_info["id"])
        if worker is None:
            raise RouterError(404, "worker_not_found", f"no worker {request.match_info['id']!r}")
        return worker

    async def _list_workers(self, request: web.Request) -> web.Response:
        self._check_key(request)
        return web.json_response({"workers": [self._api(w) for w in self.registry.all()]})

    async def _add_worker(self, request: web.Request) -> web.Response:
        self._check_key(request)
        body = await _json_body(request)
        if isinstance(body, dict):
            refused = url_problem(body.get("url"), self.port, self.cfg.allowed_worker_hosts)
            if refused is not None:
                raise RouterError(400, "invalid_worker", refused)
        try:
            spec = spec_from_json(body)
        except ValueError as exc:
            raise RouterError(400, "invalid_worker", str(exc)) from exc
        if (spec.role is Role.REGULAR) == self.cfg.pd:
            mode = "PD" if self.cfg.pd else "regular"
            raise RouterError(400, "invalid_worker", f"role {spec.role.value} does not fit {mode} mode")
        try:
            worker = self._add(spec)
        except DuplicateWorkerError as exc:
            raise RouterError(409, "duplicate_worker", str(exc)) from exc
        return web.json_response(self._api(worker), status=201)

    async def _get_worker(self, request: web.Request) -> web.Response:
        self._check_key(request)
        return web.json_response(self._api(self._worker_or_404(request)))

    async def _patch_worker(self, request: web.Request) -> web.Response:
        self._check_key(request)
        worker = self._worker_or_404(request)
        body = await _json_body(request)
        try:
            self.registry.update(worker.id, body)
        except ValueError as exc:
            raise RouterError(400, "invalid_update", str(exc)) from exc
        return web.json_response(self._api(worker))

    async def _delete_worker(self, request: web.Request) -> web.Response:
        self._check_key(request)
        worker = self._worker_or_404(request)
        before = set_draining(worker)
        if before is not Status.DRAINING:
            self.events.emit("status_change", worker=worker.id, url=worker.spec.url,
                             **{"from": before.value, "to": Status.DRAINING.value})
        answer = self._api(worker)
        self._maybe_remove(worker)
        return web.json_response(answer)

    # ---- inference -----------------------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, COMPLETIONS)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, CHAT)

    async def _infer(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        status = 500
        try:
            body = validate_body(endpoint, await _json_body(request))
            model = body.get("model")
            if self.cfg.model and model is not None and model != self.cfg.model:
                raise RouterError(404, "model_not_found", f"model {model!r} is not served here")
            resp = await self.dispatcher.handle(request, endpoint, body)
            status = resp.status
            return resp
        except RouterError as exc:
            status = exc.status
            raise
        finally:
            self.metrics.inc("pdchaos_router_requests_total", endpoint=endpoint, status=str(status))

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.cfg.model or DEFAULT_MODEL, "object": "model", "owned_by": "pdchaos"}

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: web.Request) -> web.Response:
        """`GET /v1/models/{id}` (the `openai` client's `models.retrieve`)."""
        card, name = self._model_card(), request.match_info["model"]
        if name != card["id"]:
            raise RouterError(404, "model_not_found", f"model {name!r} is not served here")
        return web.json_response(card)

    # ---- operations ----------------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def legs_ready(self) -> dict[str, bool]:
        roles = (Role.PREFILL, Role.DECODE) if self.cfg.pd else (Role.REGULAR,)
        return {r.value: bool(self.registry.ready(r)) for r in roles}

    async def _readiness(self, request: web.Request) -> web.Response:
        legs = self.legs_ready()
        ok = all(legs.values())
        return web.json_response({"ready": ok, "legs": legs}, status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def _events(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError as exc:
            raise RouterError(400, "invalid_request", "since must be an integer") from exc
        events, nxt = self.events.since(max(0, since))
        return web.json_response({"events": events, "next": nxt}, dumps=_dumps)


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise RouterError(400, "invalid_json", "empty request body")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RouterError(400, "invalid_json", f"malformed JSON: {exc}") from exc
    except RecursionError:
        raise RouterError(400, "invalid_json", "malformed JSON: nested too deeply") from None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
