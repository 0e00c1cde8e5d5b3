"""The asyncio driver of the engine's request path, shared by the HTTP and gRPC surfaces.

Every decision is the core's (`core.request_flow.RequestFlow` over `core.engine_state.EngineState`); this
performs each step on the event loop: fault gates, sleeps, bootstrap queries, handshakes and side-channel
pulls under the step's timeout. It also keeps what only a running process has: the records file and the
in-flight tasks that `abort` cancels. The surfaces record every call they answer through it
(`record_call`, `refuse_leg`; `core.calls`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fake_engines import kv_channel
from fake_engines.core.calls import CLIENT_GONE, caller_of, engine_caller
from fake_engines.core.engine_config import EngineConfig
from fake_engines.core.engine_state import EngineState
from fake_engines.core.gen_request import GenRequest, GenResult, RequestError
from fake_engines.core.handoff import Handshake, HandshakeCache, PullFrom, QueryBootstrap, WaitUntil
from fake_engines.core.identity import EngineIdentity
from fake_engines.core.kv_store import KvStore
from fake_engines.core.request_flow import AwaitGate, Finish, FlowStep, Reject, RequestFlow, Sleep
from fake_engines.core.timing import TimingModel
from fake_engines.core.wire import Message, WireError, answer_frame
from fake_engines.fault_gate import FaultGate
from pdchaos.jsonl import JsonlWriter

__all__ = ["Arrival", "Engine", "GenRequest", "GenResult", "RequestError", "kv_load_failure_line"]

log = logging.getLogger(__name__)


def kv_load_failure_line(rec: dict[str, Any]) -> str:
    """A decode's failed KV load as vLLM's connectors word it (Mooncake 0.17+ on the decode side, NIXL
    0.14+), so that a log reader that knows vLLM reads the fakes too."""
    rid, error = rec["request_id"], rec.get("error") or rec["outcome"]
    if rec["outcome"] == "timed_out":
        error = f"Timeout waiting for P side ready. ({error})"
    if rec["connector"] == "nixl":
        kind = "transfer_failed" if rec["outcome"] == "failed" else "handshake_failed"
        context = {"request_id": rid, "remote_engine_id": rec.get("remote_engine_id"), "error": error}
        return f"NIXL transfer failure: {kind} | Context: {context}"
    return f"pulling kv_caches for {rid} failed: {error}"

T = TypeVar("T")


@dataclass(frozen=True)
class Arrival:
    """A call as it reached the engine: `wall` stamps its record, `at` (the loop clock) times it, `caller`
    is who made it (`core.calls.caller_of`)."""

    wall: float
    at: float
    caller: str


class Engine:
    """One engine's state (`state`) and the asyncio machinery around it; lives across restarts."""

    def __init__(self, config: EngineConfig) -> None:
        self._writer = JsonlWriter(config.records)
        self.state = EngineState(config, self.now(), on_record=self._on_record)
        self.faults = FaultGate(self.state.faults)
        self._inflight: dict[str, asyncio.Task[GenResult]] = {}

    def _on_record(self, rec: dict[str, Any]) -> None:
        self._writer.write(rec)
        # Handoff records only (call records share the writer): a decode whose KV load failed.
        if rec.get("kind") == "decode" and rec.get("outcome") in ("failed", "timed_out"):
            log.warning("%s", kv_load_failure_line(rec))

    # -- views of the state (what the surfaces and tests read) ----------------------------------------------
    @property
    def config(self) -> EngineConfig:
        return self.state.config

    @property
    def identity(self) -> EngineIdentity:
        return self.state.identity

    @property
    def engine_id(self) -> str:
        return self.state.engine_id

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.state.records

    @property
    def store(self) -> KvStore:
        return self.state.store

    @property
    def bootstrap_cache(self) -> HandshakeCache:
        return self.state.bootstrap_cache

    @property
    def nixl_cache(self) -> HandshakeCache:
        return self.state.nixl_cache

    @property
    def timing(self) -> TimingModel:
        return self.state.timing

    @timing.setter
    def timing(self, model: TimingModel) -> None:
        self.state.timing = model

    @staticmethod
    def now() -> float:
        """The shell's clock for the core's `now`: the event loop's (monotonic)."""
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:  # built outside a loop: the loop clock is time.monotonic
            return time.monotonic()

    # -- lifecycle ------------------------------------------------------------------------------------------
    def restart(self, engine_id: str | None = None) -> dict[str, Any]:
        """The core's restart; requests parked on a wedge that it cleared look at their gate again."""
        cleared = self.state.restart(self.now(), engine_id)
        self.faults.wake()
        return cleared

    def close(self) -> None:
        self._writer.close()

    # -- peers ----------------------------------------------------------------------------------------------
    async def answer_side_channel(self, msg: Message, my_engine_id: str) -> bytes:
        await self.faults.gate("side_channel")
        return answer_frame(self.state.answer_side_channel(msg, my_engine_id, self.now()))

    async def bootstrap_answer(self) -> dict[str, Any]:
        await self.faults.gate("side_channel")
        return self.state.bootstrap_answer()

    # -- call records ---------------------------------------------------------------------------------------
    def arrival(self, caller: str | None) -> Arrival:
        """A call arriving now; `caller`: what its caller header or metadata said (None: the router)."""
        return Arrival(time.time(), self.now(), caller_of(caller))

    def record_call(
        self, arrival: Arrival, call: str, status: int, detail: Mapping[str, Any] | None = None,
        *, ended: float | None = None,
    ) -> None:
        """Record a call answered (or cut) now, or at `ended` (the engine's clock) when its caller left."""
        end = self.now() if ended is None else ended
        self.state.add_call(arrival.wall, call, status, end - arrival.at, arrival.caller, detail)

    def refuse_leg(
        self,
        arrival: Arrival,
        status: int,
        error: str,
        *,
        request_id: str | None,
        tag: str | None,
        leg: Mapping[str, Any] | None,
    ) -> None:
        """Record a generation leg that ends now without a handoff record (refused, or cut)."""
        self.state.add_refused_leg(
            arrival.wall, status, self.now() - arrival.at, arrival.caller,
            request_id=request_id, tag=tag, leg=leg, error=error,
        )

    # -- generation -----------------------------------------------------------------------------------------
    async def generate(self, req: GenRequest, arrival: Arrival | None = None) -> GenResult:
        """Run one request through the core's flow; RequestError when it is refused or aborted.

        The work runs in its own task so `abort(request_id)` can stop it wherever it waits. Given the leg's
        `arrival`, a leg that ends here without a handoff record (refused, aborted, its caller gone) is
        recorded as a refused leg: only the flow knows whether it left one.
        """
        flow = RequestFlow(self.state, req)
        work = asyncio.ensure_future(self._drive(flow))
        self._inflight[req.request_id] = work
        # An outcome nobody awaits any more (caller gone) must not be reported as "never retrieved".
        work.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            return await asyncio.shield(work)
        except RequestError as exc:
            if arrival is not None and not _left_record(flow):
                self.refuse_leg(arrival, exc.status, exc.message, request_id=req.request_id, tag=flow.tag,
                                leg=req.leg)
            raise
        except asyncio.CancelledError:
            work.cancel()  # the caller went away (client hang-up): stop the work too
            # A flow still running now is aborted by the cancel, leaving no record of its own.
            if arrival is not None and not _left_record(flow):
                self.refuse_leg(arrival, CLIENT_GONE, f"request {req.request_id}: caller gone",
                                request_id=req.request_id, tag=flow.tag, leg=req.leg)
            raise
        finally:
            if self._inflight.get(req.request_id) is work:
                del self._inflight[req.request_id]

    def abort(self, request_ids: list[str]) -> int:
        """Cancel in-flight requests by id; returns how many were running."""
        n = 0
        for rid in request_ids:
            work = self._inflight.get(rid)
            if work is not None and not work.done():
                work.cancel()
                n += 1
        return n

    async def _drive(self, flow: RequestFlow) -> GenResult:
        step: FlowStep = flow.next_step()
        try:
            while True:
                if isinstance(step, Finish):
                    return step.result
                if isinstance(step, Reject):
                    raise step.error()
                step = await self._perform(flow, step)
        except asyncio.CancelledError:
            raise flow.abort().error() from None

    async def _perform(self, flow: RequestFlow, step: FlowStep) -> FlowStep:
        """Do what one step names and report its outcome to the flow."""
        if isinstance(step, AwaitGate):
            await self.faults.gate(step.surface)
            return flow.on_gate_passed(self.now(), time.time())
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return flow.on_slept(self.now(), time.time())
        if isinstance(step, QueryBootstrap):
            # Any failure of the GET (refused, HTTP error, bad JSON) is a failed query.
            query = kv_channel.query_bootstrap(step.url, step.timeout_s, engine_caller(self.config.name))
            answer, error = await _attempt(query, Exception)
            return flow.on_query_result(answer, self.now(), time.time(), error=error)
        if isinstance(step, Handshake):
            hs = kv_channel.handshake(step.host, step.port, step.engine_id, step.timeout_s)
            resp, error = await _attempt(hs, OSError, WireError)
            if error is None:
                # vLLM's NIXL decode logs this once per handshake (0.13+); PD suites look for it.
                log.info("NIXL compatibility check passed (hash: %s)", hashlib.sha256(
                    str(step.engine_id).encode()).hexdigest())
            return flow.on_handshake_result(resp, self.now(), time.time(), error=error)
        if isinstance(step, PullFrom):
            pull = kv_channel.pull(step.host, step.port, step.engine_id, step.transfer_key, step.timeout_s)
            response, error = await _attempt(pull, OSError, WireError)
            return flow.on_pull_result(response, self.now(), time.time(), error=error)
        if isinstance(step, WaitUntil):
            await asyncio.sleep(max(0.0, step.deadline - self.now()))
            return flow.on_deadline(self.now(), time.time())
        raise RuntimeError(f"unknown request step {step!r}")  # the core grew a step this shell does not know


def _left_record(flow: RequestFlow) -> bool:
    """Whether the leg left a handoff record: it was served, or refused after one (a failed KV load)."""
    step = flow.next_step()
    return isinstance(step, Finish) or (isinstance(step, Reject) and step.record is not None)


async def _attempt(io: Awaitable[T], *failures: type[Exception]) -> tuple[T | None, str | None]:
    """(result, None), or (None, error) for a timeout ("timeout") or one of `failures`."""
    try:
        return await io, None
    except TimeoutError:
        return None, "timeout"
    except failures as exc:
        return None, f"{type(exc).__name__}: {exc}"
