"""Which worker a leg goes to: one policy per leg, Ready workers whose circuit breaker admits a request only,
settled ids and unsuspected workers preferred. A leg with no such worker is a prompt 503
`no_available_workers` (bug #8)."""

from __future__ import annotations

from dataclasses import dataclass

from .answers import ErrorAnswer
from .breaker import breaker_admits
from .bugs import SHARED_POLICY
from .policies import SelectionPolicy, make_policy
from .registry import WorkerRegistry
from .retry import avoid_suspects
from .workers import BREAKER_CLOSED, MOONCAKE, PROBE_REREAD, READY, Role, Worker


@dataclass(frozen=True)
class LegPolicies:
    prefill: SelectionPolicy
    decode: SelectionPolicy
    regular: SelectionPolicy

    @classmethod
    def make(
        cls, prefill: str, decode: str, seed: int | None = None, bugs: frozenset[str] = frozenset()
    ) -> LegPolicies:
        """One instance per leg: a cursor shared by both legs would advance twice per request (bug #10).
        Each leg draws from its own seed so a seeded run stays reproducible."""
        if SHARED_POLICY in bugs:
            shared = make_policy(decode, seed)
            return cls(prefill=shared, decode=shared, regular=shared)
        return cls(
            prefill=make_policy(prefill, seed),
            decode=make_policy(decode, None if seed is None else seed + 1),
            regular=make_policy(decode, None if seed is None else seed + 2),
        )


def id_read_pending(worker: Worker) -> bool:
    """An engine-id re-read is running for a worker whose id the router mints (Mooncake, or not known yet)."""
    return worker.runtime.probe_stage is PROBE_REREAD and worker.connector in (None, MOONCAKE)


def pick_worker(registry: WorkerRegistry, role: Role, policy: SelectionPolicy, now: float) -> Worker | None:
    """The worker for a leg of `role`, or None when no worker of that role is Ready with its breaker admitting
    a request. Picking takes nothing: the dispatch flow takes a half-open breaker's trial (breaker_pick).

    Preferences, in order: a prefill whose engine-id re-read is not running (one that is may be about to
    learn a new id: it came back from NotReady/Failed, or its id is unconfirmed); then a worker not suspect
    (a request could not reach it moments ago: it is probed at once; until then, the others). One pass over
    the role's workers: every leg of every request picks."""
    admitted: list[Worker] = []
    settled: list[Worker] = []
    prefill = role is Role.PREFILL
    for w in registry.of_role(role):
        rt = w.runtime
        if rt.status is not READY:
            continue
        # A closed breaker admits: the common case skips the call (64 workers a role, every leg).
        if rt.breaker.state is not BREAKER_CLOSED and not breaker_admits(w, now):
            continue
        admitted.append(w)
        if prefill and not id_read_pending(w):
            settled.append(w)
    return policy.select(avoid_suspects(settled or admitted), now)


def no_worker_answer(role: Role, breaker_open: bool = False) -> ErrorAnswer:
    """`breaker_open`: Ready workers of the role exist, but every one's circuit breaker keeps it out."""
    what = f"no Ready {role.value} worker"
    if breaker_open:
        what += " with a circuit breaker admitting requests"
    return ErrorAnswer(503, "no_available_workers", what, "service_unavailable")
