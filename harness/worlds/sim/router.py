"""The simulated reference router: the reference router's own core (`reference_router.core`) in virtual time.

The health loop runs the core's tick (`start_tick`, `on_probe_done`, `on_reread_done`, `on_identity_done`)
every `tick_period_s`, each probe and metadata read crossing the simulated network under the deadline the
core gives; a request runs the core's `DispatchFlow`, its legs calls to the engines. What the client sees
follows the real shells per transport (the same statuses, error codes, 200 streams that end with an error
chunk). Router events are stamped with the virtual wall clock; dispatch events are not kept (the session
drops them: the engines' records say more).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec, assert_never

import simpy

from fake_engines.core.calls import GRPC_HEALTH, HEALTH, ROUTER
from fake_engines.core.gen_request import (
    MAX_MODEL_LEN,
    GenRequest,
    GenResult,
    RequestError,
    gen_request_from_openai,
)
from fake_engines.core.generator import answer_text
from fake_engines.core.request_flow import Reject
from harness.router_metrics import CounterTally
from harness.routers.reference import reference_config
from harness.scenario import RouterSettings, mistaken_body
from harness.scenario.links import LinkRef
from harness.session.requests import RequestPlan
from harness.topology import registration_body
from harness.value_checks import error_body_problem
from harness.worlds.sim.cell import CellView
from harness.worlds.sim.engine import SimEngine, StreamMarks
from harness.worlds.sim.network import HOP_S, CallResult, Reply, SimNetwork, wait, wait_event
from pdchaos.openai_request import context_problem, max_tokens_of
from pdchaos.sse import error_text
from pdchaos.stop_strings import cut_at_stop, stop_strings
from reference_router.core import (
    ID_READ_POLL_S,
    Answer,
    AwaitIdRead,
    Backoff,
    Delivery,
    DispatchFlow,
    DuplicateWorkerError,
    Effects,
    ErrorAnswer,
    IdentityStart,
    LegDone,
    LegError,
    LegResult,
    MetadataRead,
    Prepare,
    ProbeStart,
    ReadOutcome,
    RunLeg,
    Status,
    StopCutter,
    Transport,
    Worker,
    WorkerRegistry,
    abandon_identity_check,
    dispatch_serialized,
    make_worker_spec,
    on_identity_done,
    on_probe_done,
    on_reread_done,
    parse_bootstrap_query,
    set_draining,
    spec_from_json,
    start_tick,
    tick_period_s,
    worker_api_dict,
)
from reference_router.core.worker_urls import url_problem

# Bytes of a stream's first message (headers, a token's chunk): what its trip to the router is timed by.
STREAM_CHUNK_BYTES = 128


_P = ParamSpec("_P")


def _answered_as_the_server(
    call: Callable[Concatenate[Any, _P], tuple[int, Any]],
) -> Callable[Concatenate[Any, _P], tuple[int, Any]]:
    """A worker API call as the reference router's server answers it: a failure its handler did not expect
    (a bug of the core, e.g. a type it forgot to check) is a 500 with the exception named, as the server's
    error middleware sends, not a crash of the world."""

    @functools.wraps(call)
    def answered(self: Any, *args: _P.args, **kwargs: _P.kwargs) -> tuple[int, Any]:
        try:
            return call(self, *args, **kwargs)
        except Exception as exc:  # the server answers every failure
            return 500, ErrorAnswer(500, "internal_error", f"{exc.__class__.__name__}: {exc}").body()

    return answered


@dataclass(frozen=True)
class ClientAnswer:
    """What the client got: HTTP status, the text when it is a good answer, the error it read, and when the
    first and the last byte of the answer arrived (seconds after sending)."""

    status: int
    text: str | None = None
    error: str | None = None
    ttft_s: float = 0.0
    latency_s: float = 0.0
    body_problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.text is not None


class SimRouter:
    def __init__(
        self,
        cell: CellView,
        settings: RouterSettings,
        registered: tuple[str, ...],
        new_uuid: Callable[[], uuid.UUID],
    ) -> None:
        self.cell = cell
        self.env: simpy.Environment = cell.env
        self.net: SimNetwork = cell.net
        self.settings = settings
        router_cfg = replace(reference_config(settings), seed=cell.seed)
        self.cfg = router_cfg.health()
        self.transport = cell.topology.transport
        # What the engines see of this router's probes: `GET /health`, or the gRPC `HealthCheck`.
        self._probe_call = GRPC_HEALTH if self.transport == "grpc" else HEALTH
        self.connector = cell.topology.connector
        self.new_uuid = new_uuid
        self.registry = WorkerRegistry(self.cfg.bugs)
        self.events: list[dict[str, Any]] = []
        self.counters = CounterTally()  # the counters the core's increments add up to (its /metrics)
        self.policies = router_cfg.policies()
        self.limits = router_cfg.limits()
        self.breaker = router_cfg.breaker()
        # Bug wedged_stalls_all only: one request at a time (core.dispatch_serialized).
        serialized = dispatch_serialized(router_cfg.bugs)
        self._one_at_a_time = simpy.Resource(self.env, capacity=1) if serialized else None
        self._probes: dict[str, simpy.Process] = {}
        self.paused_until: float | None = None
        self._loop: simpy.Process | None = None
        for name in registered:
            self._add(self._spec(name))

    # ------------------------------------------------------------------ workers

    def _spec(self, name: str) -> Any:
        spec = self.cell.topology.engine(name)
        boot = spec.bootstrap_port if spec.role == "prefill" and self.connector == "mooncake" else None
        regular = spec.role == "regular"
        told = None if regular else self.settings.told_connector(self.connector, self.transport)
        return make_worker_spec(spec.url(self.transport), spec.role, connector=told, bootstrap_port=boot)

    def _add(self, spec: Any) -> Worker:
        worker = self.registry.add(spec)
        self._emit(
            "status_change",
            worker=worker.id,
            url=spec.url,
            role=spec.role.value,
            **{"from": None, "to": worker.status.value},
        )
        return worker

    def _emit(self, type_: str, **fields: Any) -> None:
        self.events.append({"ts": self.cell.wall(self.env.now), "type": type_, **fields})

    def record(self, effects: Effects) -> None:
        for ev in effects.events:
            self._emit(ev.type, **ev.fields)
        for m in effects.metrics:
            self.counters.inc(m.name, m.labels, m.amount)

    def _api(self, worker: Worker) -> dict[str, Any]:
        """The worker API record, as this router's switches show it."""
        return worker_api_dict(worker, self.registry.bugs)

    def workers(self) -> list[dict[str, Any]]:
        return [self._api(w) for w in self.registry.all()]

    def engine_of(self, worker: Worker) -> SimEngine | None:
        return self.cell.engine_at_url(worker.spec.url)

    @_answered_as_the_server
    def add_worker(self, name: str, mistake: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        """POST /workers for engine `name`, with `mistake`'s fields laid over the body."""
        body = registration_body(self.cell.topology.engine(name), self.connector, self.transport)
        body = mistaken_body(body, mistake)
        # As the server: a url it refuses before it reads the rest (credentials, a host not loopback).
        refused = url_problem(body.get("url"), None)
        if refused is not None:
            return 400, ErrorAnswer(400, "invalid_worker", refused).body()
        try:
            worker = self._add(spec_from_json(body))
        except DuplicateWorkerError as exc:
            return 409, ErrorAnswer(409, "duplicate_worker", str(exc)).body()
        except ValueError as exc:
            return 400, ErrorAnswer(400, "invalid_worker", str(exc)).body()
        return 201, self._api(worker)

    def _worker_of(self, name: str) -> Worker | None:
        url = self.cell.topology.engine(name).url(self.transport)
        return next((w for w in self.registry.all() if w.spec.url == url), None)

    @_answered_as_the_server
    def patch_worker(self, name: str, body: dict[str, Any]) -> tuple[int, Any]:
        worker = self._worker_of(name)
        if worker is None:
            return 404, ErrorAnswer(404, "worker_not_found", f"no worker for {name}").body()
        try:
            self.registry.update(worker.id, body)
        except ValueError as exc:
            return 400, ErrorAnswer(400, "invalid_update", str(exc)).body()
        return 200, self._api(worker)

    @_answered_as_the_server
    def remove_worker(self, name: str) -> tuple[int, Any]:
        worker = self._worker_of(name)
        if worker is None:
            return 404, ErrorAnswer(404, "worker_not_found", f"no worker for {name}").body()
        before = set_draining(worker)
        if before is not Status.DRAINING:
            self._emit(
                "status_change",
                worker=worker.id,
                url=worker.spec.url,
                **{"from": before.value, "to": Status.DRAINING.value},
            )
        answer = self._api(worker)
        self._maybe_remove(worker)
        return 200, answer

    def _maybe_remove(self, worker: Worker) -> None:
        """A Draining worker goes once its last in-flight request ended."""
        if worker.runtime.status is not Status.DRAINING or worker.runtime.in_flight_requests > 0:
            return
        if self.registry.remove(worker.id) is None:
            return
        proc = self._probes.pop(worker.id, None)
        if proc is not None and proc.is_alive:
            proc.interrupt("removed")
        self._emit(
            "status_change",
            worker=worker.id,
            url=worker.spec.url,
            **{"from": Status.DRAINING.value, "to": "removed"},
        )

    # ------------------------------------------------------------------ health loop

    def start(self) -> None:
        self._loop = self.env.process(self._health_loop())

    def stop(self) -> None:
        for proc in [self._loop, *self._probes.values()]:
            if proc is not None and proc.is_alive:
                proc.interrupt("router stopped")
        self._probes.clear()

    def pause(self, seconds: float) -> None:
        """Stop the router's process for `seconds` (SIGSTOP, then SIGCONT): see `_awake`."""
        self.paused_until = max(self.paused_until or 0.0, self.env.now + seconds)

    def _awake(self, deadline: float | None = None, io: bool = False) -> Generator[Any, Any, None]:
        """Wait out a pause of the router's process, as its event loop does when it resumes: first what came
        on its sockets meanwhile (`io`: an answer, a refused connect, a client's request), then its overdue
        timers (a sleep, a timeout), those in the order they fell due (each waits here from its own time on,
        and a timer steps back behind the sockets). A client's deadline still ends its request."""
        if self.paused_until is None or self.env.now >= self.paused_until:
            return
        yield from wait(self.env, self.paused_until - self.env.now, deadline)
        if not io:
            yield self.env.timeout(0)

    def _health_loop(self) -> Generator[Any, Any, None]:
        period = tick_period_s(self.cfg)
        try:
            while True:
                plan = start_tick(self.registry.all(), self.env.now, self.cfg)
                for w in plan.expired:
                    proc = self._probes.pop(w.id, None)
                    if proc is not None and proc.is_alive:
                        proc.interrupt("probe expired")
                self.record(plan.effects)
                for p in plan.probes:
                    self._probes[p.worker.id] = self.env.process(self._probe(p))
                for i in plan.identity:
                    self.env.process(self._identity(i))
                yield self.env.timeout(period)
                yield from self._awake()
        except simpy.Interrupt:
            return

    def _probe(self, start: ProbeStart) -> Generator[Any, Any, None]:
        worker, token = start.worker, start.token
        try:
            t0 = self.env.now
            engine = self.engine_of(worker)
            probe = self._probe_call
            result = yield from self._call(
                engine, "serve", lambda e, d: e.health(d, ROUTER, probe), 128, start.timeout_s
            )
            ok = result.ok and bool(result.value)
            done = on_probe_done(worker, token, ok, self.env.now - t0, self.env.now, self.cfg)
            self.record(done.effects)
            if not done.reread_due:
                return
            read = yield from self._read_metadata(worker, done.reread_timeout_s)
            self.record(on_reread_done(worker, token, read, self.env.now, self.cfg).effects)
        except simpy.Interrupt:
            return

    def _identity(self, start: IdentityStart) -> Generator[Any, Any, None]:
        worker = start.worker
        try:
            read = yield from self._read_metadata(worker, start.timeout_s)
            self.record(on_identity_done(worker, start.token, read, self.env.now).effects)
        except simpy.Interrupt:
            pass
        finally:
            abandon_identity_check(worker, start.token, self.env.now)

    def _read_metadata(self, worker: Worker, timeout_s: float | None) -> Generator[Any, Any, MetadataRead]:
        """GetServerInfo (then GetModelInfo to tell a partial read), or an HTTP prefill's bootstrap `/query`;
        as the real prober, never raising for worker trouble."""
        t0 = self.env.now
        engine = self.engine_of(worker)
        if worker.spec.transport is Transport.GRPC:
            res = yield from self._call(engine, "serve", lambda e, d: e.server_info(d), 128, timeout_s)
            if res.error == "timeout":
                read = MetadataRead(ReadOutcome.TIMEOUT)
            elif not res.ok:
                read = MetadataRead(ReadOutcome.ERROR)
            elif res.value[0] == "error":
                left = None if timeout_s is None else max(0.0, timeout_s - (self.env.now - t0))
                more = yield from self._call(engine, "serve", lambda e, d: e.model_info(d), 128, left)
                read = MetadataRead(ReadOutcome.PARTIAL if more.ok else ReadOutcome.ERROR)
                if more.error == "timeout" and timeout_s is not None:
                    read = MetadataRead(ReadOutcome.TIMEOUT)
            else:
                info = res.value[1]
                read = MetadataRead(
                    ReadOutcome.COMPLETE,
                    engine_id=info["kv_engine_id"] or None,
                    connector=info["kv_connector"],
                    kv_role=info["kv_role"] or None,
                    dp_size=info["data_parallel_size"] or None,
                    uptime_s=info["uptime_seconds"] if info["uptime_seconds"] > 0 else None,
                )
        elif worker.spec.bootstrap_port is None:
            yield self.env.timeout(0)
            read = MetadataRead(ReadOutcome.COMPLETE)
        else:
            res = yield from self._call(
                engine, "bootstrap", lambda e, d: e.bootstrap_query(d), 128, timeout_s
            )
            if res.error == "timeout":
                read = MetadataRead(ReadOutcome.TIMEOUT)
            elif not res.ok:
                read = MetadataRead(ReadOutcome.ERROR)
            else:
                read = parse_bootstrap_query(res.value)
        return MetadataRead(
            read.outcome,
            read.engine_id,
            read.connector,
            read.kv_role,
            read.dp_size,
            read.uptime_s,
            duration_s=self.env.now - t0,
        )

    def _call(
        self,
        engine: SimEngine | None,
        link: str,
        handler: Callable[[SimEngine, float | None], Generator[Any, Any, Reply]],
        nbytes: int,
        timeout_s: float | None,
        outer: float | None = None,
    ) -> Generator[Any, Any, CallResult]:
        if engine is None:
            yield from wait(self.env, HOP_S, outer)
            yield from self._awake(outer, io=True)
            return CallResult(error="refused")
        result = yield from self.net.call(
            LinkRef(engine.name, link), engine, lambda d: handler(engine, d), nbytes, timeout_s, outer
        )
        if self.paused_until is not None:  # a router never paused has nothing to wait out
            yield from self._awake(outer, io=result.error != "timeout")
        return result

    # ------------------------------------------------------------------ requests

    def handle(self, plan: RequestPlan, client_deadline: float) -> Generator[Any, Any, ClientAnswer]:
        """One client request through the router, from the client's side (times are since it was sent). The
        client's deadline passing raises Deadline out of it (the client hung up: nothing more is done)."""
        t0 = self.env.now
        if self.paused_until is not None:  # a paused router accepts it once it resumes
            yield from self._awake(client_deadline, io=True)
        if self._one_at_a_time is None:
            return (yield from self._handle(plan, client_deadline, t0))
        with self._one_at_a_time.request() as turn:
            yield from wait_event(self.env, turn, client_deadline)
            return (yield from self._handle(plan, client_deadline, t0))

    def _handle(
        self, plan: RequestPlan, client_deadline: float, t0: float
    ) -> Generator[Any, Any, ClientAnswer]:
        flow = DispatchFlow(dict(plan.body), self.registry, self.policies, self.limits,
                            pd=self.cell.topology.shape.pd, new_uuid=self.new_uuid, breaker=self.breaker,
                            bugs=self.cfg.bugs)
        try:
            return (yield from self._run(flow, plan, client_deadline, t0))
        finally:
            idle, effects = flow.close()
            self._remove_idle(idle)
            self.record(effects)

    def _over_budget(self, plan: RequestPlan, workers: tuple[Worker, ...]) -> ErrorAnswer | None:
        """The server's check before any leg: the request's completion budget fits the smallest context its
        workers report (each engine's max_model_len)."""
        contexts = [MAX_MODEL_LEN for w in workers if self.engine_of(w) is not None]
        if not contexts:
            return None
        problem = context_problem(None, max_tokens_of(plan.body, plan.chat), min(contexts))
        return None if problem is None else ErrorAnswer(400, "invalid_request", problem)

    def _run(
        self, flow: DispatchFlow, plan: RequestPlan, client_deadline: float, t0: float
    ) -> Generator[Any, Any, ClientAnswer]:
        """Do what the request's flow says, step by step, until it answers."""
        relayed: ClientAnswer | None = None
        step = flow.start(self.env.now)
        while True:
            self.record(step.effects)
            self._remove_idle(step.idle)
            match step:
                case Prepare():  # nothing to tokenize: the simulated engines take the text
                    step = flow.on_prepared(self._over_budget(plan, step.workers), self.env.now)
                case AwaitIdRead():
                    waited = 0.0
                    while not flow.id_read_settled() and waited < step.timeout_s:
                        yield from wait(self.env, ID_READ_POLL_S, client_deadline)
                        yield from self._awake(client_deadline)
                        waited += ID_READ_POLL_S
                    step = flow.on_id_read_waited(self.env.now)
                case RunLeg(final=False):
                    result = yield from self._prefill_leg(step, plan.chat, f"{flow.request_id}-p",
                                                          client_deadline)
                    step = flow.on_leg_done(result, self.env.now)
                case RunLeg():
                    result, after_headers, relayed = yield from self._final_leg(
                        flow, step, plan, t0, client_deadline
                    )
                    step = flow.on_leg_done(result, self.env.now, after_headers=after_headers)
                case Backoff():
                    yield from wait(self.env, step.seconds, client_deadline)
                    yield from self._awake(client_deadline)
                    step = flow.on_backoff_done(self.env.now)
                case Answer():
                    if step.error is None:
                        assert relayed is not None
                        return relayed
                    if step.before_legs:
                        yield from wait(self.env, 2 * HOP_S, client_deadline)
                    answer = _error_answer(step.error, self.env.now - t0)
                    if step.as_200:  # bug error_as_200: a 200 completion with finish_reason "error"
                        return ClientAnswer(200, "", None, ttft_s=answer.ttft_s, latency_s=answer.latency_s)
                    return answer
                case _:
                    assert_never(step)

    def _remove_idle(self, workers: tuple[Worker, ...]) -> None:
        for w in workers:
            self._maybe_remove(w)

    def _final_leg(
        self, flow: DispatchFlow, leg: RunLeg, plan: RequestPlan, t0: float, client_deadline: float
    ) -> Generator[Any, Any, tuple[LegResult, bool, ClientAnswer | None]]:
        """The leg whose answer the client sees: how it ended for the flow, whether the client already had
        its 200 when it failed, and what the client got (None: an error not answered yet)."""
        engine = self.engine_of(leg.worker)
        marks = StreamMarks(self._reach(engine)) if leg.body.get("stream") else None
        result = yield from self._call_generate(
            engine, leg.body, plan.chat, leg.timeout_s, flow.request_id, client_deadline, marks
        )
        now = self.env.now
        if isinstance(result, Reply) and isinstance(result.value, GenResult):
            gen: GenResult = result.value
            first = _first_token(marks, now)
            text = gen.text if self.transport == "http" else grpc_text(gen.token_ids, leg.body)
            return LegDone(), False, ClientAnswer(200, text, None, ttft_s=first - t0, latency_s=now - t0)
        error = result if isinstance(result, LegError) else _rejected(result.value, self.transport)
        if marks is not None and self.transport == "http" and isinstance(result, Reply):
            # The engine had answered 200 and streams the error as a chunk; the router relays it as is.
            err = result.value
            return LegDone(), False, ClientAnswer(200, None, err.message, ttft_s=now - t0, latency_s=now - t0)
        if marks is not None and isinstance(result, LegError) and self._answer_started(marks):
            # The client already has its 200 (HTTP: the engine's headers, relayed; gRPC: the router's, sent
            # with the first token): the stream ends with an error chunk.
            if self.transport == "http":
                error = _broken_stream(error, engine, leg.timeout_s)
            relayed = ClientAnswer(200, None, error.message, ttft_s=_first_token(marks, now) - t0,
                                   latency_s=now - t0)
            return error, True, relayed
        return error, False, None

    def _reach(self, engine: SimEngine | None) -> Callable[[float], float | None]:
        """When a stream's small message the engine sends at a time reaches the router (None: never)."""
        ref = LinkRef(engine.name if engine is not None else "", "serve")
        return lambda at: self.net.transit(ref, "downstream", STREAM_CHUNK_BYTES, at).arrive

    def _answer_started(self, marks: StreamMarks) -> bool:
        """Whether the router had answered 200 before the leg failed: over HTTP it relays the engine's
        headers, which go out as generation starts; over gRPC it answers with the first token."""
        reached = marks.started_reached if self.transport == "http" else marks.first_token_reached
        return reached is not None and reached <= self.env.now

    def _prefill_leg(
        self, leg: RunLeg, chat: bool, grpc_id: str, client_deadline: float
    ) -> Generator[Any, Any, LegResult]:
        engine = self.engine_of(leg.worker)
        result = yield from self._call_generate(
            engine, leg.body, chat, leg.timeout_s, grpc_id, client_deadline, None
        )
        if isinstance(result, LegError):
            return result
        if isinstance(result.value, GenResult):
            return LegDone(result.value.kv_transfer_params)
        return _rejected(result.value, self.transport)

    def _call_generate(
        self,
        engine: SimEngine | None,
        body: dict[str, Any],
        chat: bool,
        timeout_s: float,
        grpc_id: str,
        client_deadline: float,
        marks: StreamMarks | None,
    ) -> Generator[Any, Any, Reply | LegError]:
        """A generation leg: the engine's reply (a result or its rejection), or how the call failed; a
        streamed one (`marks`) reports its progress there."""
        rid = (
            grpc_id if self.transport == "grpc" else f"{'chatcmpl' if chat else 'cmpl'}-{self.new_uuid().hex}"
        )
        grpc = self.transport == "grpc"
        try:
            served = engine.config.model if engine is not None else None
            req, _stream = gen_request_from_openai(body, chat, rid, None, grpc=grpc, served_model=served)
        except RequestError as exc:
            # The engine's surface refuses it: the leg still goes there (and is in its records).
            refused = exc
            res = yield from self._call(
                engine, "serve", lambda e, d: e.refuse(body, chat, refused, d, grpc), 256, timeout_s,
                client_deadline,
            )
            if res.ok:
                # Refused before any answer began (an HTTP stream's headers included): its status relayed.
                return _rejected(res.value, self.transport)
        else:
            nbytes = 256 + 4 * len(req.prompt_text)
            res = yield from self._call(
                engine, "serve", lambda e, d: e.generate(req, d, marks), nbytes, timeout_s, client_deadline
            )
        if res.ok:
            return Reply(res.value)
        return _transport_leg_error(res, engine, self.transport, timeout_s)


def _transport_leg_error(
    res: CallResult, engine: SimEngine | None, transport: str, timeout_s: float
) -> LegError:
    """A leg whose call failed, as the real shells classify it (only a refused connect is NOT_SENT)."""
    where = engine.name if engine is not None else "worker"
    if res.error == "timeout":
        return LegError(504, "upstream_timeout", f"{where} timed out after {timeout_s:g}s")
    if res.error == "refused":
        what = "failed to connect" if transport == "grpc" else "ClientConnectorError: connection refused"
        return LegError(502, "upstream_error", f"{where}: {what}", Delivery.NOT_SENT)
    return LegError(502, "upstream_error", f"{where}: connection {res.error}")


def _first_token(marks: StreamMarks | None, now: float) -> float:
    """When the client's first token came: a stream's, as it reached the router (a link fault that went in
    the meantime can make a later message look faster, but a connection delivers in order); else `now`."""
    reached = marks.first_token_reached if marks is not None else None
    return now if reached is None else min(reached, now)


def _broken_stream(error: LegError, engine: SimEngine | None, timeout_s: float) -> LegError:
    """An HTTP leg that failed after its headers, as the real relay names it (upstream_http.HttpStream)."""
    where = engine.name if engine is not None else "worker"
    if error.status == 504:
        return replace(error, message=f"{where} stream overran {timeout_s:g}s")
    return replace(error, message=f"{where} stream broke: {error.message.removeprefix(where + ': ')}")


def _rejected(reject: Reject, transport: str) -> LegError:
    """An engine's error answer as the router relays it. HTTP: a 4xx relayed, the rest 502, answered.
    gRPC: the engine's status becomes a code and back (deadline -> 504, invalid argument -> 400 answered,
    the rest 502; not-found/conflict/exhausted keep their status for the breaker as client errors)."""
    status, message = reject.status, reject.message
    if transport == "grpc":
        if status == 504:
            return LegError(504, "upstream_timeout", f"overran its deadline: {message}")
        if status == 400:
            return LegError(
                400, "invalid_request", message, Delivery.ANSWERED, worker_status=400, worker_message=message
            )
        client = status if status in (404, 409, 429) else None
        # As upstream_grpc.grpc_delivery: an engine's UNAVAILABLE or CANCELLED reads as a broken transport.
        delivery = Delivery.MAYBE_SENT if status in (499, 503) else Delivery.ANSWERED
        return LegError(
            502, "upstream_error", message, delivery, worker_status=client, worker_message=message
        )
    relayed = status if 400 <= status < 500 else 502
    return LegError(
        relayed,
        "upstream_error",
        f"answered {status}: {message}",
        Delivery.ANSWERED,
        worker_status=status,
        worker_message=message,
    )


def _error_answer(answer: ErrorAnswer, elapsed: float) -> ClientAnswer:
    """The answer as the client reads the body the reference router's shell sends (`ErrorAnswer.body`)."""
    body = answer.body()
    return ClientAnswer(answer.status, None, error_text(body, b""), ttft_s=elapsed, latency_s=elapsed,
                        body_problem=error_body_problem(body))


def grpc_text(token_ids: Sequence[int], body: Mapping[str, Any]) -> str:
    """The text the router makes of a gRPC leg's token ids (the engine returns no text), cut where a client's
    stop string begins. Streamed, each token goes through the router's own StopCutter as the asyncio router
    sends it (output tokens are whole words, so each decodes alone)."""
    stops = stop_strings(body)
    # The router decodes with special tokens left out (an ending end of sequence), as the asyncio one does.
    if not body.get("stream") or not stops:
        return cut_at_stop(answer_text(token_ids), stops)
    cutter = StopCutter(stops)
    return "".join(cutter.push(answer_text([t])) for t in token_ids) + cutter.flush()


__all__ = ["ClientAnswer", "GenRequest", "SimRouter"]

