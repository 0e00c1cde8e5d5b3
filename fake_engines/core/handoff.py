"""KV handoff decisions as sans-IO state machines.

The shell (asyncio server or simpy model) creates a plan per decode request, asks ``next_step()`` what to do,
performs the I/O the step names (under the step's timeout) and feeds the outcome back through ``on_*``; each
``on_*`` returns the next step. A plan ends with ``Done``. Time is always passed in as ``now``.

Mooncake (bug #2491): an engine id the decode has never seen -> ``QueryBootstrap`` -> id listed: cache
id -> side-channel address forever, ``PullFrom``; id missing or bootstrap unreachable: fail fast. A seen id
uses the cached address even if it is dead; a dead address does not error, the shell gets
``WaitUntil(deadline)`` and the plan ends ``timed_out`` when the transfer timeout has passed. A prefill that
holds nothing under the transfer id does not refuse either (vLLM parks the pull until its abort timeout):
the decode waits out its deadline the same way.

NIXL: ``Handshake`` with remote_host:remote_port (handshake timeout) unless the engine id already handshook;
peer's id differs -> fail fast; success is cached per engine id, failures are not; then ``PullFrom``.

Both caches are keyed by the engine id the decode was told, never by the peer's address: a prefill replaced
on the same address is a new peer (the ``stale_peer_handshake`` switch keys them by address instead).

Every failure goes through the load failure policy: ``fail`` -> ``Done(action=FAIL)`` (HTTP 500 / error
chunk), outcome ``failed`` or ``timed_out``; ``recompute`` -> ``Done(action=RECOMPUTE)``, outcome
``recomputed``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fake_engines.core.bootstrap import find_engine_addr
from fake_engines.core.bugs import STALE_PEER_HANDSHAKE
from fake_engines.core.wire import HandshakeResponse, PullResponse


class Outcome(enum.StrEnum):
    """Record outcomes (CONTRACTS.md §1)."""

    COMPUTED = "computed"
    PULLED = "pulled"
    RECOMPUTED = "recomputed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


class Action(enum.StrEnum):
    """What the decode does once a plan is done."""

    USE_KV = "use_kv"  # generate from the pulled KV's digest
    RECOMPUTE = "recompute"  # local prefill: generate from the prompt's own digest
    FAIL = "fail"  # answer HTTP 500 / an error chunk


class LoadFailurePolicy(enum.StrEnum):
    FAIL = "fail"
    RECOMPUTE = "recompute"


class RequestKind(enum.StrEnum):
    """Record ``kind``: which leg this request is, judged from its kv_transfer_params."""

    PREFILL = "prefill"
    DECODE = "decode"
    LOCAL = "local"


class Connector(enum.StrEnum):
    MOONCAKE = "mooncake"
    NIXL = "nixl"
    NONE = "none"


# -- steps -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryBootstrap:
    """GET ``url`` (``<remote_bootstrap_addr>/query``) within ``timeout_s``; report to ``on_query_result``."""

    url: str
    timeout_s: float


@dataclass(frozen=True)
class Handshake:
    """NIXL handshake: send ``HandshakeRequest(engine_id)`` to host:port within ``timeout_s``;
    report via ``on_handshake_result``."""

    host: str
    port: int
    engine_id: str
    timeout_s: float


@dataclass(frozen=True)
class PullFrom:
    """Send ``PullRequest(engine_id, transfer_key)`` to host:port, wait at most ``timeout_s`` for the answer;
    report via ``on_pull_result``."""

    host: str
    port: int
    engine_id: str
    transfer_key: str
    timeout_s: float


@dataclass(frozen=True)
class WaitUntil:
    """Nothing will answer: sleep until ``deadline`` (same clock as ``now``), then call ``on_deadline``."""

    deadline: float


@dataclass(frozen=True)
class Done:
    """Final: what to record and what to do. ``digest_mismatch``: the pulled KV belongs to another prompt
    (the decode still uses it, as a real one would; its output shows the mix-up)."""

    outcome: Outcome
    action: Action
    kv_digest: str | None = None
    error: str | None = None
    digest_mismatch: bool = False


Step = QueryBootstrap | Handshake | PullFrom | WaitUntil | Done


# -- kv_transfer_params ------------------------------------------------------------------------------------


def classify_request(params: Mapping[str, Any] | None) -> RequestKind:
    """Prefill leg if ``do_remote_decode`` is true, decode leg if ``do_remote_prefill`` is, else local."""
    if not params:
        return RequestKind.LOCAL
    if params.get("do_remote_decode") is True:
        return RequestKind.PREFILL
    if params.get("do_remote_prefill") is True:
        return RequestKind.DECODE
    return RequestKind.LOCAL


# Every fake engine runs as one tensor-parallel rank (vLLM's --tensor-parallel-size is accepted and ignored).
ENGINE_TP_SIZE = 1


def nixl_tp_problem(remote_tp: object, local_tp: int = ENGINE_TP_SIZE) -> str | None:
    """Why a NIXL decode of `local_tp` ranks cannot read a prefill that says it has `remote_tp` (the
    params' `tp_size`), or None. vLLM asserts as it adds the remote agent: each decode rank reads from
    one prefill rank, so the decode's TP must be a multiple of the prefill's."""
    if not isinstance(remote_tp, int) or isinstance(remote_tp, bool) or remote_tp < 1:
        return f"NIXL tp_size {remote_tp!r} is not a positive integer"
    if local_tp % remote_tp:
        return (f"NIXL: decode TP {local_tp} cannot read from prefill TP {remote_tp} "
                "(Decode TP cannot be smaller than prefill TP)")
    return None


def nixl_prefill_params(
    engine_id: str,
    host: str,
    port: int,
    block_ids: list[int] | tuple[int, ...],
    request_id: str,
    tp_size: int = ENGINE_TP_SIZE,
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a NIXL prefill returns in its non-streaming response (relayed verbatim)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        # One list per KV cache group, as vLLM 0.32 returns them (a plain model has one group).
        "remote_block_ids": [list(block_ids)],
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp_size,
    }


def prefill_transfer_key(
    connector: Connector | str, params: Mapping[str, Any], request_id: str
) -> str | None:
    """Key a prefill stores its KV under: Mooncake ``transfer_id`` (None when absent), NIXL the request id."""
    if Connector(connector) == Connector.MOONCAKE:
        t = params.get("transfer_id")
        return t if isinstance(t, str) and t else None
    if Connector(connector) == Connector.NIXL:
        return request_id
    return None


# -- caches ------------------------------------------------------------------------------------------------


class HandshakeCache:
    """Per decode engine start: engine id -> side-channel (host, port), and the engine id that peer answered
    as. Entries are never evicted (that is the Mooncake behaviour behind #2491); a restart of the decode makes
    a new cache."""

    def __init__(self) -> None:
        self._addrs: dict[str, tuple[str, int]] = {}
        self._ids: dict[str, str] = {}

    def get(self, key: str) -> tuple[str, int] | None:
        return self._addrs.get(key)

    def put(self, key: str, addr: tuple[str, int], engine_id: str | None = None) -> None:
        """Cache ``addr`` under ``key``; ``engine_id``: the peer's id (default: the key, an engine id)."""
        self._addrs[key] = addr
        self._ids[key] = engine_id or key

    def engine_id(self, key: str) -> str | None:
        """The engine id the peer cached under ``key`` was looked up or handshaken as."""
        return self._ids.get(key)

    def __contains__(self, engine_id: object) -> bool:
        return engine_id in self._addrs

    def __len__(self) -> int:
        return len(self._addrs)

    def clear(self) -> None:
        self._addrs.clear()
        self._ids.clear()


# -- plans -------------------------------------------------------------------------------------------------


class _Plan:
    """Shared machinery: deadline, policy, digest check, single terminal state."""

    def __init__(
        self,
        prompt_digest: str,
        cache: HandshakeCache,
        policy: LoadFailurePolicy | str,
        now: float,
        transfer_timeout_s: float,
        bugs: frozenset[str],
    ):
        if transfer_timeout_s <= 0:
            raise ValueError(f"transfer_timeout_s must be > 0, got {transfer_timeout_s}")
        self.prompt_digest = prompt_digest
        self.cache = cache
        self.bugs = bugs
        self.policy = LoadFailurePolicy(policy)
        self.started_at = now
        self.deadline = now + transfer_timeout_s
        self._step: Step | None = None

    @property
    def done(self) -> Done | None:
        return self._step if isinstance(self._step, Done) else None

    def _set(self, step: Step) -> Step:
        self._step = step
        return step

    def _fail(self, error: str, outcome: Outcome = Outcome.FAILED) -> Step:
        if self.policy == LoadFailurePolicy.RECOMPUTE:
            return self._set(Done(Outcome.RECOMPUTED, Action.RECOMPUTE, None, f"{outcome.value}: {error}"))
        return self._set(Done(outcome, Action.FAIL, None, error))

    def _remaining(self, now: float) -> float:
        return max(0.0, self.deadline - now)

    def _expect(self, *types: type) -> None:
        if not isinstance(self._step, types):
            raise RuntimeError(f"unexpected result: plan is at {self._step!r}")

    def on_pull_result(self, response: PullResponse | None, now: float, error: str | None = None) -> Step:
        """Outcome of a ``PullFrom``. ``response`` None + ``error``: transport failure; ``error="timeout"``
        (or ``now`` at/after the deadline) ends ``timed_out``. A connect failure waits out the deadline
        (Mooncake) or fails fast (NIXL). A pulled KV whose digest differs from the prompt's is used anyway
        (``digest_mismatch``)."""
        self._expect(PullFrom)
        if response is None:
            if error == "timeout" or now >= self.deadline:
                return self._time_out(now)
            return self._on_transport_error(error or "transport error", now)
        if not response.ok:
            return self._fail(f"pull refused: {response.error}")
        kv = response.prompt_digest
        if not kv:
            return self._fail("pull answered without a KV digest")
        return self._set(
            Done(Outcome.PULLED, Action.USE_KV, kv, None, digest_mismatch=kv != self.prompt_digest)
        )

    def on_deadline(self, now: float) -> Step:
        """After a ``WaitUntil``: the transfer timeout has passed -> ``timed_out``."""
        self._expect(WaitUntil)
        if now < self.deadline:
            return WaitUntil(self.deadline)  # woke early: keep waiting
        return self._time_out(now)

    def _time_out(self, now: float) -> Step:
        return self._fail(f"KV transfer timed out after {now - self.started_at:.3f}s", Outcome.TIMED_OUT)

    def _on_transport_error(self, error: str, now: float) -> Step:
        """Connector-specific reaction to a pull that could not reach its peer."""
        raise NotImplementedError


class MooncakeDecodePlan(_Plan):
    """Decode side of one Mooncake handoff.

    ``params``: the decode's kv_transfer_params (``transfer_id``, ``remote_engine_id``,
    ``remote_bootstrap_addr``).
    Missing fields (the router could not mint) -> ``Done(RECOMPUTED)`` whatever the policy.
    """

    def __init__(
        self,
        params: Mapping[str, Any],
        prompt_digest: str,
        cache: HandshakeCache,
        policy: LoadFailurePolicy | str,
        now: float,
        transfer_timeout_s: float,
        query_timeout_s: float = 5.0,
        bugs: frozenset[str] = frozenset(),
    ):
        super().__init__(prompt_digest, cache, policy, now, transfer_timeout_s, bugs)
        self.query_timeout_s = query_timeout_s
        self.transfer_id = _opt_str(params, "transfer_id")
        self.remote_engine_id = _opt_str(params, "remote_engine_id")
        self.bootstrap_addr = _opt_str(params, "remote_bootstrap_addr")

    def next_step(self) -> Step:
        """The first step (idempotent: returns the current step once started)."""
        if self._step is not None:
            return self._step
        if not (self.transfer_id and self.remote_engine_id and self.bootstrap_addr):
            named = (("transfer_id", self.transfer_id), ("remote_engine_id", self.remote_engine_id),
                     ("remote_bootstrap_addr", self.bootstrap_addr))
            missing = [k for k, v in named if not v]
            return self._set(
                Done(Outcome.RECOMPUTED, Action.RECOMPUTE, None, f"incomplete kv_transfer_params: {missing}")
            )
        key = self._cache_key()
        addr = self.cache.get(key)
        if addr is not None:
            return self._pull(addr, self.started_at, self.cache.engine_id(key))
        return self._set(QueryBootstrap(self.bootstrap_addr.rstrip("/") + "/query", self.query_timeout_s))

    def _cache_key(self) -> str:
        if STALE_PEER_HANDSHAKE in self.bugs:
            # BUG: the lookup is cached by the prefill's bootstrap address: one replaced on the same address
            # (new engine id, new side-channel port) is still reached where the dead one listened.
            return self.bootstrap_addr or ""
        return self.remote_engine_id or ""

    def on_query_result(self, answer: Any, now: float, error: str | None = None) -> Step:
        """Outcome of a ``QueryBootstrap``: the decoded JSON answer, or None with ``error`` (refused, timeout,
        non-200). Unreachable, malformed or id not listed -> fail fast."""
        self._expect(QueryBootstrap)
        if error is not None or answer is None:
            return self._fail(f"bootstrap query failed: {error or 'no answer'}")
        try:
            addr = find_engine_addr(answer, self.remote_engine_id or "")
        except ValueError as exc:
            return self._fail(f"bad bootstrap answer: {exc}")
        if addr is None:
            return self._fail(f"engine id {self.remote_engine_id} not found at {self.bootstrap_addr}")
        self.cache.put(self._cache_key(), addr, self.remote_engine_id)
        return self._pull(addr, now, self.remote_engine_id)

    def _pull(self, addr: tuple[str, int], now: float, peer_id: str | None) -> Step:
        key, left = self.transfer_id or "", self._remaining(now)
        return self._set(PullFrom(addr[0], addr[1], peer_id or "", key, left))

    def _on_transport_error(self, error: str, now: float) -> Step:
        # A dead side channel does not error in Mooncake: the transfer just never completes.
        return self._set(WaitUntil(self.deadline))

    def on_pull_result(self, response: PullResponse | None, now: float, error: str | None = None) -> Step:
        """As for any connector, except a refused pull: a Mooncake prefill that holds no KV under the
        transfer id (never computed, freed, or a new process on the same side-channel port) does not
        refuse; it parks the request waiting for the "P side ready" until its abort timeout (480 s,
        vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py:1564-1607), past any
        decode transfer timeout: the decode waits out its deadline."""
        if response is not None and not response.ok:
            self._expect(PullFrom)
            return self._set(WaitUntil(self.deadline))
        return super().on_pull_result(response, now, error)


class NixlDecodePlan(_Plan):
    """Decode side of one NIXL handoff. ``params``: the prefill's kv_transfer_params relayed verbatim
    (``remote_engine_id``, ``remote_host``, ``remote_port``, ``remote_block_ids``, ``remote_request_id``,
    ``tp_size``). Missing fields, or a ``tp_size`` this decode cannot read from -> fail per policy."""

    def __init__(
        self,
        params: Mapping[str, Any],
        prompt_digest: str,
        cache: HandshakeCache,
        policy: LoadFailurePolicy | str,
        now: float,
        transfer_timeout_s: float,
        handshake_timeout_s: float = 5.0,
        bugs: frozenset[str] = frozenset(),
    ):
        super().__init__(prompt_digest, cache, policy, now, transfer_timeout_s, bugs)
        self.handshake_timeout_s = handshake_timeout_s
        self.remote_engine_id = _opt_str(params, "remote_engine_id")
        self.remote_request_id = _opt_str(params, "remote_request_id")
        self.remote_host = _opt_str(params, "remote_host")
        port = params.get("remote_port")
        self.remote_port = port if isinstance(port, int) and not isinstance(port, bool) else None
        # vLLM reads it with a default of 1: a router that drops it is fine, one that changes it is not.
        self.remote_tp = params.get("tp_size", 1)

    def next_step(self) -> Step:
        """The first step (idempotent: returns the current step once started)."""
        if self._step is not None:
            return self._step
        if not (self.remote_engine_id and self.remote_request_id and self.remote_host and self.remote_port):
            return self._fail("incomplete kv_transfer_params for NIXL")
        key = self._cache_key()
        if key in self.cache:
            return self._pull(self.started_at, self.cache.engine_id(key))
        return self._set(
            Handshake(self.remote_host, self.remote_port, self.remote_engine_id, self.handshake_timeout_s)
        )

    def on_handshake_result(
        self, response: HandshakeResponse | None, now: float, error: str | None = None
    ) -> Step:
        """Outcome of a ``Handshake``: the peer's response, or None with ``error`` (refused, timeout).
        Success is cached per engine id; failure and id mismatch fail fast and are not cached."""
        self._expect(Handshake)
        if response is None:
            return self._fail(f"NIXL handshake with {self.remote_host}:{self.remote_port} failed: {error}")
        if not response.ok or response.engine_id != self.remote_engine_id:
            return self._fail(
                f"NIXL handshake engine id mismatch: expected {self.remote_engine_id}, "
                f"peer is {response.engine_id}"
            )
        # Checked once per agent, as vLLM does when it adds one: a cached handshake is not checked again.
        problem = nixl_tp_problem(self.remote_tp)
        if problem is not None:
            return self._fail(problem)
        addr = (self.remote_host or "", self.remote_port or 0)
        self.cache.put(self._cache_key(), addr, self.remote_engine_id)
        return self._pull(now, self.remote_engine_id)

    def _cache_key(self) -> str:
        if STALE_PEER_HANDSHAKE in self.bugs:
            # BUG: the handshake is cached by the peer's address: a prefill replaced on the same NIXL port
            # (new engine id) is read as the agent handshaken with before, which no longer exists.
            return f"{self.remote_host}:{self.remote_port}"
        return self.remote_engine_id or ""

    def _pull(self, now: float, peer_id: str | None) -> Step:
        return self._set(
            PullFrom(
                self.remote_host or "",
                self.remote_port or 0,
                peer_id or "",
                self.remote_request_id or "",
                self._remaining(now),
            )
        )

    def _on_transport_error(self, error: str, now: float) -> Step:
        return self._fail(f"NIXL read from {self.remote_host}:{self.remote_port} failed: {error}")


def _opt_str(params: Mapping[str, Any], key: str) -> str | None:
    v = params.get(key)
    return v if isinstance(v, str) and v else None
