"""Everything one fake engine knows and counts, as a pure object: the asyncio servers and the simpy models
both read and change the engine through it.

Identity, protocol faults, held KV, handshake caches, timing model, the dead flag, counters and provenance
records live here, with the decisions that touch only them: what a restart resets, what the bootstrap server
and the side channel answer, what a prefill hands back. Time (``now``, any monotonic clock) and the wall clock
(``wall``, for record timestamps) are always passed in.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from fake_engines.core.bootstrap import build_query_answer
from fake_engines.core.bugs import HEALTHY_WHILE_DRAINING, REPORTS_FIRST_ID, SHUTDOWN_DROPS_PULLS
from fake_engines.core.calls import GENERATE, make_call
from fake_engines.core.engine_config import EngineConfig
from fake_engines.core.fault_state import FaultState
from fake_engines.core.handoff import HandshakeCache, nixl_prefill_params
from fake_engines.core.identity import EngineIdentity
from fake_engines.core.kv_store import KvStore
from fake_engines.core.records import make_record
from fake_engines.core.timing import TimingModel
from fake_engines.core.wire import (
    HandshakeRequest,
    HandshakeResponse,
    Message,
    PullRequest,
    PullResponse,
    WireError,
    serve_handshake,
    serve_pull,
)

RecordSink = Callable[[dict[str, Any]], None]


def engine_timing(config: EngineConfig) -> TimingModel:
    """The timing model a config asks for; a zero TTFT means no per-token prefill cost either."""
    ttft = config.ttft_ms
    return TimingModel(ttft_ms=ttft, ttft_per_token_ms=0.05 if ttft > 0 else 0.0, itl_ms=config.itl_ms)


class EngineState:
    """One fake engine across its starts. ``config`` must carry the bound ``bootstrap_port`` / ``nixl_port``
    (they are part of what a prefill tells its decodes).

    ``new_id`` makes engine ids (seeded in simulation); ``on_record`` sees every provenance record as it is
    made (the asyncio shell appends it to the ``--records`` file).
    """

    def __init__(
        self,
        config: EngineConfig,
        now: float = 0.0,
        *,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
        on_record: RecordSink | None = None,
        keep_records: bool = True,
    ) -> None:
        self.config = config
        self._new_id = new_id
        self.on_record = on_record
        self.identity = EngineIdentity.first(now, config.engine_id, new_id)
        self._first_id = self.identity.engine_id
        self.faults = FaultState()
        self.store = KvStore(abort_timeout_s=config.kv_abort_timeout_s, bugs=config.bugs)
        self.bootstrap_cache = HandshakeCache()
        self.nixl_cache = HandshakeCache()
        self.timing = engine_timing(config)
        self.dead = False
        # A graceful stop (SIGTERM) in progress: new work refused, held KV still served (`begin_drain`).
        self.draining = False
        self._drain_deadline = 0.0
        # Set by the shell once its side-channel listeners are bound (one port per dp rank); empty while down.
        self.side_channel_ports: list[int] = []
        self.active = 0
        self.served = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.outcome_counts: dict[str, int] = {}
        self.last_receive = 0.0
        # keep_records=False: records go to `on_record` only (a simulation hands them on as they come).
        self._keep_records = keep_records
        self.records: list[dict[str, Any]] = []

    # -- identity and lifecycle -----------------------------------------------------------------------------
    @property
    def engine_id(self) -> str:
        return self.identity.engine_id

    def reported_engine_id(self) -> str:
        """The id told to others (GetServerInfo, bootstrap, prefill params): "" under ``no_engine_id``."""
        if self.faults.no_engine_id:
            return ""
        if REPORTS_FIRST_ID in self.config.bugs:
            # BUG: the id registered at the process's first start, kept across restarts in place.
            return self._first_id
        return self.identity.engine_id

    def start(self, now: float) -> None:
        """The first start is when serving begins (after any load time), so the id is minted then."""
        self.identity = EngineIdentity.first(now, self.config.engine_id, self._new_id)
        self._first_id = self.identity.engine_id

    def restart(self, now: float, engine_id: str | None = None) -> dict[str, Any]:
        """A new start, as a new process would be: new identity (``engine_id``, else the configured pin, else
        fresh), generation + 1, no KV held, nothing cached, alive, no protocol faults.

        Returns the faults cleared (``{kind: {"old", "new"}}``); a shell that parks requests on a wedge must
        wake them.
        """
        pinned = engine_id if engine_id is not None else self.config.engine_id
        self.identity = self.identity.restarted(now, pinned, self._new_id)
        self.store.clear()
        self.bootstrap_cache.clear()
        self.nixl_cache.clear()
        self.dead = False
        self.draining = False
        return self.faults.clear_all()

    @property
    def healthy(self) -> bool:
        """What health checks say: not after an engine death, not while stopping."""
        if self.draining and HEALTHY_WHILE_DRAINING in self.config.bugs:
            return not self.dead  # BUG: readiness flips only when the process exits
        return not (self.dead or self.draining)

    def begin_drain(self, now: float) -> None:
        """A graceful stop begins: health turns unhealthy and new requests are refused (503), while requests
        already running finish and the side channel keeps serving the KV decodes have yet to pull."""
        if not self.draining:
            self.draining = True
            # Bounded: by then every KV held now has passed its abort timeout; anything left is stuck.
            self._drain_deadline = now + self.config.kv_abort_timeout_s

    def drained(self, now: float) -> bool:
        """Whether a graceful stop may end the process now: nothing running and no KV left to pull (or the
        drain bound has passed)."""
        if now >= self._drain_deadline:
            return True
        if SHUTDOWN_DROPS_PULLS in self.config.bugs:
            # BUG: waits for in-flight requests only; the KV its decodes are about to pull dies with it.
            return self.active == 0
        return self.active == 0 and self.store.live(now) == 0

    def drain_wake(self, now: float) -> float:
        """The next time ``drained`` can turn true by the clock alone (a KV expiring, the bound): a shell
        waits until then or until a request ends or a pull is served, whichever comes first."""
        expiry = self.store.next_live_expiry(now)
        return self._drain_deadline if expiry is None else min(expiry, self._drain_deadline)

    def die(self) -> dict[str, Any]:
        """Engine death: health turns 503 / unhealthy, generate refuses with 503 (the shell exits later)."""
        old, self.dead = self.dead, True
        return {"dead": {"old": old, "new": True}}

    # -- answers to peers -----------------------------------------------------------------------------------
    def bootstrap_answer(self) -> dict[str, Any]:
        """The Mooncake bootstrap ``GET /query`` answer for the side channels bound now."""
        ports = list(self.side_channel_ports)
        if self.config.advertise_side_channel_port and ports:
            ports[0] = self.config.advertise_side_channel_port  # rank 0 through the proxy in front of it
        return build_query_answer(self.reported_engine_id(), self.config.host, ports)

    def answer_side_channel(
        self, msg: Message, my_engine_id: str, now: float
    ) -> PullResponse | HandshakeResponse:
        """A side-channel request's answer (a granted pull gives up the KV). ``my_engine_id``: the rank's id,
        or this start's for NIXL. WireError for a message that is not a request."""
        if isinstance(msg, PullRequest):
            return serve_pull(self.store, msg, my_engine_id, now)
        if isinstance(msg, HandshakeRequest):
            return serve_handshake(msg, my_engine_id)
        raise WireError(f"unexpected message {type(msg).__name__}")

    def prefill_params(self, key: str, block_ids: list[int]) -> dict[str, Any] | None:
        """The ``kv_transfer_params`` a prefill returns for the KV it holds under ``key``: NIXL's peer
        facts, which routers relay to the decode; none for Mooncake, whose prefill answers with
        ``kv_transfer_params`` null and leaves the decode's params to the router (vLLM 0.32
        mooncake_connector.py:1166, ``request_finished`` returns ``(delay_free_blocks, None)``)."""
        cfg = self.config
        if cfg.connector == "nixl":
            return nixl_prefill_params(
                self.reported_engine_id(),
                cfg.host,
                cfg.advertise_side_channel_port or cfg.nixl_port,
                block_ids,
                key,
            )
        return None

    # -- records and counters -------------------------------------------------------------------------------
    def add_record(self, wall: float, **fields: Any) -> dict[str, Any]:
        """Make one provenance record stamped ``wall`` with the identity in force now, and keep it."""
        cfg = self.config
        rec = make_record(
            ts=wall,
            engine=cfg.name,
            engine_id=self.identity.engine_id,
            generation=self.identity.generation,
            role=cfg.role,
            connector=cfg.connector,
            **fields,
        )
        if self._keep_records:
            self.records.append(rec)
        self.outcome_counts[rec["outcome"]] = self.outcome_counts.get(rec["outcome"], 0) + 1
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def add_call(
        self,
        wall: float,
        call: str,
        status: int,
        duration_s: float,
        caller: str,
        detail: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Make one engine call record (`wall`: when the call arrived) and hand it on. It is not kept with
        the handoff records (`records`, `/control/records`): it goes to the records stream only."""
        cfg = self.config
        rec = make_call(
            ts=wall,
            engine=cfg.name,
            engine_id=self.identity.engine_id,
            generation=self.identity.generation,
            role=cfg.role,
            call=call,
            status=status,
            duration_s=duration_s,
            caller=caller,
            detail=detail,
        )
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def add_refused_leg(
        self,
        wall: float,
        status: int,
        duration_s: float,
        caller: str,
        *,
        request_id: str | None,
        tag: str | None,
        leg: Mapping[str, Any] | None,
        error: str,
    ) -> dict[str, Any]:
        """A generation leg that left no handoff record (refused, or cut before it ended) as a `generate`
        call: a leg the engine got is in its records either way."""
        detail = {"request_id": request_id, "tag": tag, "leg": dict(leg) if leg is not None else None,
                  "error": error}
        return self.add_call(wall, GENERATE, status, duration_s, caller, detail)

    def records_since(self, since: int) -> tuple[list[dict[str, Any]], int]:
        """Records from index ``since`` on (negative counts as 0) and the index to ask from next."""
        since = max(0, since)
        return self.records[since:], len(self.records)

    def count_served(self, prompt_tokens: int, output_tokens: int) -> None:
        self.served += 1
        self.prompt_tokens_total += prompt_tokens
        self.generation_tokens_total += output_tokens
