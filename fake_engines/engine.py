"""The engine's request path shared by the HTTP and gRPC surfaces: handoff, output, provenance records.

Decisions come from the sans-IO core (handoff plans, KV store, records); this class performs their I/O
(bootstrap queries, side-channel pulls, handshakes) on the event loop clock and keeps per-start state.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fake_engines import kv_channel, model
from fake_engines.config import EngineConfig
from fake_engines.core.bootstrap import build_query_answer
from fake_engines.core.handoff import (
    Action,
    Done,
    Handshake,
    HandshakeCache,
    MooncakeDecodePlan,
    NixlDecodePlan,
    PullFrom,
    QueryBootstrap,
    RequestKind,
    WaitUntil,
    classify_request,
    nixl_prefill_params,
    prefill_transfer_key,
)
from fake_engines.core.identity import EngineIdentity
from fake_engines.core.kv_store import KvStore
from fake_engines.core.records import find_tag, make_record
from fake_engines.core.timing import TimingModel
from fake_engines.core.wire import (
    HandshakeRequest,
    Message,
    PullRequest,
    WireError,
    serve_handshake,
    serve_pull,
)
from fake_engines.faults import FaultGate
from pdchaos.jsonl import JsonlWriter


class RequestError(Exception):
    """A request the engine answers with an error: HTTP status (mapped to a gRPC code by that surface)."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


@dataclass
class GenRequest:
    """One generation request, normalised from either surface."""

    request_id: str
    prompt_text: str
    prompt_ids: list[int]
    max_tokens: int
    seed: int | None
    kv_params: dict[str, Any] | None


@dataclass
class GenResult:
    """Everything a surface needs to answer; streaming surfaces pace `token_ids` with `itl_s`."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    kv_transfer_params: dict[str, Any] | None
    itl_s: float
    record: dict[str, Any] = field(default_factory=dict)

    def token_texts(self) -> list[str]:
        """Per-token text pieces; joined they equal `text` (output tokens are whole words)."""
        return model.token_pieces(self.token_ids)


class Engine:
    """Per-process engine state; `reset(identity)` starts a new generation (restart)."""

    def __init__(self, config: EngineConfig, identity: EngineIdentity) -> None:
        self.config = config
        self.identity = identity
        self.faults = FaultGate()
        self.store = KvStore(abort_timeout_s=config.kv_abort_timeout_s)
        self.bootstrap_cache = HandshakeCache()
        self.nixl_cache = HandshakeCache()
        self.records: list[dict[str, Any]] = []
        self._writer = JsonlWriter(config.records)
        ttft = config.ttft_ms
        self.timing = TimingModel(
            ttft_ms=ttft, ttft_per_token_ms=0.05 if ttft > 0 else 0.0, itl_ms=config.itl_ms
        )
        self.dead = False
        self.active = 0
        self.served = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.outcome_counts: dict[str, int] = {}
        self.last_receive = 0.0
        self.side_channel_ports: list[int] = []
        self.nixl_port = 0
        self._inflight: dict[str, asyncio.Task[Any]] = {}

    # -- identity -------------------------------------------------------------------------------------------
    @property
    def engine_id(self) -> str:
        return self.identity.engine_id

    def reported_engine_id(self) -> str:
        return "" if self.faults.state.no_engine_id else self.identity.engine_id

    def reset(self, identity: EngineIdentity) -> None:
        """A new start: new identity, no KV held, no handshake or bootstrap entry cached."""
        self.identity = identity
        self.store.clear()
        self.bootstrap_cache.clear()
        self.nixl_cache.clear()

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def close(self) -> None:
        self._writer.close()

    # -- records --------------------------------------------------------------------------------------------
    def _record(self, **fields: Any) -> dict[str, Any]:
        rec = make_record(
            ts=time.time(),
            engine=self.config.name,
            engine_id=self.identity.engine_id,
            generation=self.identity.generation,
            role=self.config.role,
            connector=self.config.connector,
            **fields,
        )
        self.records.append(rec)
        self._writer.write(rec)
        self.outcome_counts[rec["outcome"]] = self.outcome_counts.get(rec["outcome"], 0) + 1
        return rec

    def records_since(self, since: int) -> tuple[list[dict[str, Any]], int]:
        since = max(0, since)
        return self.records[since:], len(self.records)

    # -- side channel (prefill side) ------------------------------------------------------------------------
    async def answer_side_channel(self, msg: Message, my_engine_id: str) -> bytes:
        await self.faults.gate("side_channel")
        if isinstance(msg, PullRequest):
            resp = serve_pull(self.store, msg, my_engine_id, self.now())
            payload = model.kv_payload(resp.prompt_digest, resp.n_tokens) if resp.ok else b""
            return resp.encode(payload)
        if isinstance(msg, HandshakeRequest):
            return serve_handshake(msg, my_engine_id).encode()
        raise WireError(f"unexpected message {type(msg).__name__}")

    def bootstrap_answer(self) -> dict[str, Any]:
        ports = list(self.side_channel_ports)
        if self.config.advertise_side_channel_port and ports:
            ports[0] = self.config.advertise_side_channel_port  # rank 0 through the proxy in front of it
        return build_query_answer(self.reported_engine_id() or "", self.config.host, ports)

    # -- generation -----------------------------------------------------------------------------------------
    def parse_kv_params(self, raw: Any) -> dict[str, Any] | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise RequestError(400, "kv_transfer_params must be an object")
        return raw

    async def generate(self, req: GenRequest) -> GenResult:
        """Run one request through the handoff (if any) and the timing model; writes the provenance record.

        The work runs in its own task so `abort(request_id)` can stop it wherever it waits.
        """
        work = asyncio.ensure_future(self._admitted(req))
        self._inflight[req.request_id] = work
        # An outcome nobody awaits any more (caller gone) must not be reported as "never retrieved".
        work.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.cancel()  # the caller went away (client hang-up): stop the work too
            raise
        finally:
            if self._inflight.get(req.request_id) is work:
                del self._inflight[req.request_id]

    async def _admitted(self, req: GenRequest) -> GenResult:
        try:
            await self.faults.gate("generate")
            status = self.faults.state.take_failure()
            if status is not None:
                raise RequestError(status, f"injected failure (status {status})", "InternalServerError")
            if self.dead:
                raise RequestError(503, "engine is dead", "ServiceUnavailableError")
            if req.max_tokens < 1:
                raise RequestError(400, "max_tokens must be at least 1")
            self.active += 1
            self.last_receive = time.time()
            try:
                return await self._generate(req)
            finally:
                self.active -= 1
        except asyncio.CancelledError:
            raise RequestError(499, f"request {req.request_id} aborted", "RequestAborted") from None

    def abort(self, request_ids: list[str]) -> int:
        """Cancel in-flight requests by id; returns how many were running."""
        n = 0
        for rid in request_ids:
            work = self._inflight.get(rid)
            if work is not None and not work.done():
                work.cancel()
                n += 1
        return n

    async def _generate(self, req: GenRequest) -> GenResult:
        t0 = self.now()
        digest = model.prompt_digest(req.prompt_ids)
        tag = find_tag(req.prompt_text)
        connector = self.config.connector
        kind = classify_request(req.kv_params) if connector != "none" else RequestKind.LOCAL
        n_prompt = len(req.prompt_ids)
        common: dict[str, Any] = {"request_id": req.request_id, "tag": tag, "prompt_digest": digest}

        if kind == RequestKind.DECODE:
            assert req.kv_params is not None
            done, ids = await self._run_decode_plan(req.kv_params, digest)
            if done.action == Action.FAIL:
                self._record(
                    kind="decode",
                    outcome=done.outcome.value,
                    error=done.error,
                    duration_s=self.now() - t0,
                    output_digest=None,
                    kv_digest=done.kv_digest,
                    **ids,
                    **common,
                )
                raise RequestError(500, f"KV load failed: {done.error}", "InternalServerError")
            source = done.kv_digest if done.action == Action.USE_KV and done.kv_digest else digest
            # Pulled KV skips the prefill: the first token costs one inter-token gap, not a TTFT.
            delay = self.timing.itl_s() if done.action == Action.USE_KV else self.timing.ttft_s(n_prompt)
            await asyncio.sleep(delay)
            text, out_ids, finish = model.complete(source, req.max_tokens, req.seed)
            rec = self._record(
                kind="decode",
                outcome=done.outcome.value,
                error=done.error,
                duration_s=self.now() - t0,
                output_digest=model.output_digest(out_ids),
                kv_digest=done.kv_digest,
                **ids,
                **common,
            )
            return self._result(req, text, out_ids, finish, None, rec)

        await asyncio.sleep(self.timing.ttft_s(n_prompt))
        text, out_ids, finish = model.complete(digest, req.max_tokens, req.seed)
        out_params: dict[str, Any] | None = None
        ids: dict[str, Any] = {}
        error: str | None = None
        if kind == RequestKind.PREFILL:
            assert req.kv_params is not None
            key = prefill_transfer_key(connector, req.kv_params, req.request_id)
            if key is None:
                error = "no transfer_id: KV not held"
            else:
                block = self.store.allocate(key, digest, n_prompt, self.now())
                out_params = self._prefill_params(key, list(block.block_ids))
            ids = {"transfer_id": key} if connector == "mooncake" else {}
        rec = self._record(
            kind=kind.value,
            outcome="computed",
            error=error,
            duration_s=self.now() - t0,
            output_digest=model.output_digest(out_ids),
            **ids,
            **common,
        )
        return self._result(req, text, out_ids, finish, out_params, rec)

    def _result(
        self,
        req: GenRequest,
        text: str,
        out_ids: list[int],
        finish: str,
        params: dict[str, Any] | None,
        rec: dict[str, Any],
    ) -> GenResult:
        self.served += 1
        self.prompt_tokens_total += len(req.prompt_ids)
        self.generation_tokens_total += len(out_ids)
        return GenResult(
            req.request_id, text, out_ids, finish, len(req.prompt_ids), params, self.timing.itl_s(), rec
        )

    def _prefill_params(self, key: str, block_ids: list[int]) -> dict[str, Any]:
        if self.config.connector == "nixl":
            return nixl_prefill_params(
                self.reported_engine_id(),
                self.config.host,
                self.config.advertise_side_channel_port or self.nixl_port,
                block_ids,
                key,
            )
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": key,
            "remote_engine_id": self.reported_engine_id(),
            "remote_bootstrap_addr": f"http://{self.config.host}:{self.config.bootstrap_port}",
            "remote_block_ids": block_ids,
        }

    async def _run_decode_plan(self, params: dict[str, Any], digest: str) -> tuple[Done, dict[str, Any]]:
        cfg = self.config
        plan: MooncakeDecodePlan | NixlDecodePlan
        if cfg.connector == "mooncake":
            plan = MooncakeDecodePlan(
                params,
                digest,
                self.bootstrap_cache,
                cfg.load_failure_policy,
                self.now(),
                cfg.transfer_timeout_s,
                query_timeout_s=cfg.handshake_timeout_s,
            )
            ids = {"transfer_id": plan.transfer_id, "remote_engine_id": plan.remote_engine_id}
        else:
            plan = NixlDecodePlan(
                params,
                digest,
                self.nixl_cache,
                cfg.load_failure_policy,
                self.now(),
                cfg.transfer_timeout_s,
                handshake_timeout_s=cfg.handshake_timeout_s,
            )
            ids = {"remote_engine_id": plan.remote_engine_id, "remote_request_id": plan.remote_request_id}
        return await drive_plan(plan, self.now), ids


async def drive_plan(plan: MooncakeDecodePlan | NixlDecodePlan, now: Any) -> Done:
    """Perform each step a plan names, under the step's own deadline, until it is done."""
    step = plan.next_step()
    while not isinstance(step, Done):
        if isinstance(step, QueryBootstrap):
            assert isinstance(plan, MooncakeDecodePlan)
            try:
                answer = await kv_channel.query_bootstrap(step.url, step.timeout_s)
                step = plan.on_query_result(answer, now())
            except TimeoutError:
                step = plan.on_query_result(None, now(), error="timeout")
            except Exception as exc:  # any transport or HTTP failure is a failed query
                step = plan.on_query_result(None, now(), error=f"{type(exc).__name__}: {exc}")
        elif isinstance(step, Handshake):
            assert isinstance(plan, NixlDecodePlan)
            try:
                resp = await kv_channel.handshake(step.host, step.port, step.engine_id, step.timeout_s)
                step = plan.on_handshake_result(resp, now())
            except TimeoutError:
                step = plan.on_handshake_result(None, now(), error="timeout")
            except (OSError, WireError) as exc:
                step = plan.on_handshake_result(None, now(), error=f"{type(exc).__name__}: {exc}")
        elif isinstance(step, PullFrom):
            try:
                res = await kv_channel.pull(
                    step.host, step.port, step.engine_id, step.transfer_key, step.timeout_s
                )
                step = plan.on_pull_result(res.response, now())
            except TimeoutError:
                step = plan.on_pull_result(None, now(), error="timeout")
            except (OSError, WireError) as exc:
                step = plan.on_pull_result(None, now(), error=f"{type(exc).__name__}: {exc}")
        elif isinstance(step, WaitUntil):
            await asyncio.sleep(max(0.0, step.deadline - now()))
            step = plan.on_deadline(now())
        else:  # pragma: no cover - the core grew a step this shell does not know
            raise RuntimeError(f"unknown handoff step {step!r}")
    return step
