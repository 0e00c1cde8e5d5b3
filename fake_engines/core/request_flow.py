"""One generation request's path through a fake engine, as a sans-IO state machine.

The shell (asyncio server or simpy model) makes a ``RequestFlow`` per request, asks ``next_step()`` what to
do, does what the step names and reports back through the matching ``on_*`` (each returns the next step),
until a ``Reject`` or a ``Finish``. Every ``on_*`` takes ``now`` (the clock of ``WaitUntil`` deadlines and
durations) and ``wall`` (the wall clock stamped on provenance records; virtual in simulation).

    AwaitGate(surface)   pass the surface's fault gate (park while wedged, add its latency) -> on_gate_passed
    QueryBootstrap / Handshake / PullFrom / WaitUntil
                         the decode's KV handoff steps (``core.handoff``) -> on_query_result /
                         on_handshake_result / on_pull_result / on_deadline
    Sleep(seconds)       the time to first token, or one inter-token gap after pulled KV -> on_slept
    Reject(status, ...)  final: answer this error (HTTP status; gRPC maps it)
    Finish(result)       final: answer ``result``, pacing later tokens by ``result.itl_s``

Order of the checks once through the gate (as vLLM-like engines do): an injected failure (``fail_requests``),
a dead engine (503), a stopping one (503), ``max_tokens`` < 1 (400). A shell that gives up on a request calls
``abort()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fake_engines.core.engine_state import EngineState
from fake_engines.core.gen_request import GenRequest, GenResult, RequestError, max_tokens_problem
from fake_engines.core.generator import (
    FINISH_REASON,
    STOP_REASON,
    answer_ids,
    answer_text,
    output_digest,
    prompt_digest,
    stop_at,
)
from fake_engines.core.handoff import (
    Action,
    Done,
    Handshake,
    MooncakeDecodePlan,
    NixlDecodePlan,
    Outcome,
    PullFrom,
    QueryBootstrap,
    RequestKind,
    Step,
    WaitUntil,
    classify_request,
    prefill_transfer_key,
)
from fake_engines.core.records import find_tag
from fake_engines.core.wire import HandshakeResponse, PullResponse

# -- steps -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwaitGate:
    """Pass the fault gate of ``surface`` (wait while it is wedged, then its added latency); then call
    ``on_gate_passed``."""

    surface: str


@dataclass(frozen=True)
class Sleep:
    """Let ``seconds`` pass, then call ``on_slept``. ``what``: ``"ttft"`` (the prefill's cost) or ``"itl"``
    (one inter-token gap: pulled KV skips the prefill)."""

    seconds: float
    what: str


@dataclass(frozen=True)
class Reject:
    """Final: the request is answered with this error. ``record``: the provenance record it left (a decode
    whose KV load failed), else None."""

    status: int
    message: str
    err_type: str
    record: dict[str, Any] | None = None

    def error(self) -> RequestError:
        return RequestError(self.status, self.message, self.err_type)


@dataclass(frozen=True)
class Finish:
    """Final: the request is answered with ``result`` (its provenance record is ``result.record``)."""

    result: GenResult


HandoffStep = QueryBootstrap | Handshake | PullFrom | WaitUntil
FlowStep = AwaitGate | HandoffStep | Sleep | Reject | Finish

GENERATE_SURFACE = "generate"


class RequestFlow:
    """The path of one request through ``state``: fault gate, admission, KV handoff, timing, record.

    Admission counts the request as running (``state.active``) until it ends, whichever way it ends.
    """

    def __init__(self, state: EngineState, req: GenRequest) -> None:
        self.state = state
        self.req = req
        self.prompt_digest = prompt_digest(req.prompt_ids)
        self.tag = find_tag(req.prompt_text)
        connector = state.config.connector
        self.kind = classify_request(req.kv_params) if connector != "none" else RequestKind.LOCAL
        self._step: FlowStep = AwaitGate(GENERATE_SURFACE)
        self._admitted_at: float | None = None
        self._plan: MooncakeDecodePlan | NixlDecodePlan | None = None
        self._plan_ids: dict[str, Any] = {}
        self._handoff: Done | None = None

    # -- where the flow is ----------------------------------------------------------------------------------
    def next_step(self) -> FlowStep:
        """The step to perform now (idempotent)."""
        return self._step

    @property
    def finished(self) -> bool:
        return isinstance(self._step, Reject | Finish)

    @property
    def admitted(self) -> bool:
        """Through the gate and the checks: counted in ``state.active`` until it ends."""
        return self._admitted_at is not None

    # -- results from the shell -----------------------------------------------------------------------------
    def on_gate_passed(self, now: float, wall: float) -> FlowStep:
        """Through the generate gate: admit the request, or reject it."""
        self._expect(AwaitGate)
        s = self.state
        status = s.faults.take_failure()
        if status is not None:
            return self._set(Reject(status, f"injected failure (status {status})", "InternalServerError"))
        if s.dead:
            return self._set(Reject(503, "engine is dead", "ServiceUnavailableError"))
        if s.draining:
            return self._set(Reject(503, "engine is shutting down", "ServiceUnavailableError"))
        problem = max_tokens_problem(self.req.max_tokens)
        if problem is not None:
            return self._set(Reject(400, problem, "BadRequestError"))
        s.active += 1
        s.last_receive = wall
        self._admitted_at = now
        if self.kind != RequestKind.DECODE:
            return self._set(Sleep(s.timing.ttft_s(len(self.req.prompt_ids)), "ttft"))
        self._plan = self._decode_plan(now)
        return self._after_plan(self._plan.next_step(), now, wall)

    def on_query_result(self, answer: Any, now: float, wall: float, error: str | None = None) -> FlowStep:
        """Outcome of a ``QueryBootstrap``: the decoded JSON answer, or None with ``error``."""
        plan = self._plan_at(QueryBootstrap)
        assert isinstance(plan, MooncakeDecodePlan)
        return self._after_plan(plan.on_query_result(answer, now, error=error), now, wall)

    def on_handshake_result(
        self, response: HandshakeResponse | None, now: float, wall: float, error: str | None = None
    ) -> FlowStep:
        """Outcome of a ``Handshake``: the peer's response, or None with ``error``."""
        plan = self._plan_at(Handshake)
        assert isinstance(plan, NixlDecodePlan)
        return self._after_plan(plan.on_handshake_result(response, now, error=error), now, wall)

    def on_pull_result(
        self, response: PullResponse | None, now: float, wall: float, error: str | None = None
    ) -> FlowStep:
        """Outcome of a ``PullFrom``: the prefill's answer, or None with ``error`` (``"timeout"`` when the
        step's timeout ran out)."""
        plan = self._plan_at(PullFrom)
        return self._after_plan(plan.on_pull_result(response, now, error=error), now, wall)

    def on_deadline(self, now: float, wall: float) -> FlowStep:
        """After a ``WaitUntil``: woken at (or after) its deadline."""
        plan = self._plan_at(WaitUntil)
        return self._after_plan(plan.on_deadline(now), now, wall)

    def on_slept(self, now: float, wall: float) -> FlowStep:
        """After the ``Sleep``: generate, hold the KV (prefill), record, finish."""
        self._expect(Sleep)
        req, s = self.req, self.state
        handoff = self._handoff
        if handoff is not None and handoff.action == Action.USE_KV and handoff.kv_digest:
            source = handoff.kv_digest
        else:
            source = self.prompt_digest
        out_ids, eos = answer_ids(
            source, req.max_tokens, req.seed, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos
        )
        out_ids, stopped = stop_at(out_ids, req.stop)
        eos = eos and stopped is None
        out_params: dict[str, Any] | None = None
        if self.kind == RequestKind.DECODE:
            assert handoff is not None
            fields: dict[str, Any] = {
                "kind": "decode",
                "outcome": handoff.outcome.value,
                "error": handoff.error,
                "kv_digest": handoff.kv_digest,
                **self._plan_ids,
            }
        else:
            fields = {"kind": self.kind.value, "outcome": Outcome.COMPUTED.value, "error": None}
            if self.kind == RequestKind.PREFILL:
                ended = "a stop string" if stopped is not None else "end of sequence" if eos else None
                out_params, prefill_fields = self._hold_kv(now, ended_by=ended)
                fields.update(prefill_fields)
        rec = self._record(now, wall, output_digest=output_digest(out_ids), **fields)
        s.count_served(len(req.prompt_ids), len(out_ids))
        result = GenResult(
            req.request_id,
            answer_text(out_ids) if stopped is None else stopped,
            out_ids,
            STOP_REASON if stopped is not None or eos else FINISH_REASON,
            len(req.prompt_ids),
            out_params,
            s.timing.itl_s(),
            rec,
        )
        return self._end(Finish(result))

    def abort(self) -> Reject:
        """The shell gave up on the request (``Abort`` RPC, client gone): it ends now, leaving no record."""
        if isinstance(self._step, Reject):
            return self._step
        return self._end(Reject(499, f"request {self.req.request_id} aborted", "RequestAborted"))

    # -- decisions ------------------------------------------------------------------------------------------
    def _decode_plan(self, now: float) -> MooncakeDecodePlan | NixlDecodePlan:
        s, cfg = self.state, self.state.config
        params = self.req.kv_params or {}
        if cfg.connector == "mooncake":
            plan = MooncakeDecodePlan(
                params,
                self.prompt_digest,
                s.bootstrap_cache,
                cfg.load_failure_policy,
                now,
                cfg.transfer_timeout_s,
                query_timeout_s=cfg.handshake_timeout_s,
                bugs=cfg.bugs,
            )
            self._plan_ids = {"transfer_id": plan.transfer_id, "remote_engine_id": plan.remote_engine_id}
            return plan
        nixl = NixlDecodePlan(
            params,
            self.prompt_digest,
            s.nixl_cache,
            cfg.load_failure_policy,
            now,
            cfg.transfer_timeout_s,
            handshake_timeout_s=cfg.handshake_timeout_s,
            bugs=cfg.bugs,
        )
        self._plan_ids = {
            "remote_engine_id": nixl.remote_engine_id,
            "remote_request_id": nixl.remote_request_id,
        }
        return nixl

    def _after_plan(self, step: Step, now: float, wall: float) -> FlowStep:
        if isinstance(step, PullFrom):
            # Which peer the KV is read from, and as which engine: the record shows a decode that pulled from
            # somewhere else than what it was told.
            self._plan_ids.update(peer=f"{step.host}:{step.port}", peer_engine_id=step.engine_id)
        if not isinstance(step, Done):
            return self._set(step)
        self._handoff = step
        if step.action == Action.FAIL:
            rec = self._record(
                now,
                wall,
                kind="decode",
                outcome=step.outcome.value,
                error=step.error,
                output_digest=None,
                kv_digest=step.kv_digest,
                **self._plan_ids,
            )
            return self._end(Reject(500, f"KV load failed: {step.error}", "InternalServerError", rec))
        if step.action == Action.USE_KV:
            return self._set(Sleep(self.state.timing.itl_s(), "itl"))
        return self._set(Sleep(self.state.timing.ttft_s(len(self.req.prompt_ids)), "ttft"))

    def _hold_kv(
        self, now: float, ended_by: str | None = None
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """A prefill keeps its KV for the decode: (params to return, record fields). Only a prefill that
        ended at its length cap does: one a stop string or end of sequence ended (`ended_by`) frees its
        blocks at once and returns no params, as vLLM's Mooncake and NIXL connectors do (`request_finished`
        for any status but FINISHED_LENGTH_CAPPED), so a Mooncake decode sent to pull it waits out its
        transfer timeout."""
        s, connector = self.state, self.state.config.connector
        assert self.req.kv_params is not None
        key = prefill_transfer_key(connector, self.req.kv_params, self.req.request_id)
        ids: dict[str, Any] = {"transfer_id": key} if connector == "mooncake" else {}
        if key is None:
            return None, {**ids, "error": "no transfer_id: KV not held"}
        if ended_by is not None:
            return None, {**ids, "error": f"{ended_by} ended the prefill before its length cap: KV freed"}
        block = s.store.allocate(key, self.prompt_digest, len(self.req.prompt_ids), now)
        return s.prefill_params(key, list(block.block_ids)), ids

    def _record(self, now: float, wall: float, **fields: Any) -> dict[str, Any]:
        assert self._admitted_at is not None
        return self.state.add_record(
            wall,
            request_id=self.req.request_id,
            tag=self.tag,
            prompt_digest=self.prompt_digest,
            duration_s=now - self._admitted_at,
            leg=self.req.leg,
            **fields,
        )

    # -- bookkeeping ----------------------------------------------------------------------------------------
    def _set(self, step: FlowStep) -> FlowStep:
        self._step = step
        return step

    def _end(self, step: Reject | Finish) -> Reject | Finish:
        if self.admitted and not self.finished:
            self.state.active -= 1
        self._step = step
        return step

    def _expect(self, *types: type) -> None:
        if not isinstance(self._step, types):
            raise RuntimeError(f"unexpected result: request flow is at {self._step!r}")

    def _plan_at(self, step_type: type) -> MooncakeDecodePlan | NixlDecodePlan:
        self._expect(step_type)
        assert self._plan is not None
        return self._plan
