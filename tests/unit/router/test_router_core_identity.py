"""Restart detection without a failed probe (bug #13): schedule, verdicts, and the documented bound."""

from __future__ import annotations

import pytest
from helpers.health_sim import tick

from reference_router.core import (
    STALE_ENGINE_ID,
    HealthConfig,
    IdentityKind,
    MetadataRead,
    ReadOutcome,
    Status,
    Worker,
    WorkerRegistry,
    WorkerRuntime,
    apply_identity,
    apply_metadata_read,
    begin_identity_check,
    begin_probe,
    finish_probe,
    finish_reread,
    identity_check_due,
    identity_check_eligible,
    identity_check_failed,
    identity_phase,
    make_worker_spec,
    next_identity_check_at,
    observe_identity,
    plan_handoff,
    reread_due_for,
)

CFG = HealthConfig(
    failure_threshold=1,
    success_threshold=1,
    probe_timeout_s=0.2,
    interval_s=1.0,
    identity_check_interval_s=2.0,
)


def ready_prefill(wid: str = "w1", *, connector: str = "mooncake", role: str = "prefill") -> Worker:
    w = Worker.new(wid, make_worker_spec("http://127.0.0.1:8100", role, connector=connector))
    w.runtime.status = Status.READY
    w.runtime.ready_since = 10.0
    return w


# (known id, known uptime, read id, read uptime) -> verdict kind
VERDICTS = [
    ("a", 100.0, "a", 130.0, IdentityKind.SAME),
    ("a", 100.0, "b", 130.0, IdentityKind.ID_CHANGED),
    ("a", 100.0, "b", 1.0, IdentityKind.ID_CHANGED),
    ("a", 100.0, "a", 3.0, IdentityKind.UPTIME_BACKWARDS),  # pinned id, restarted
    ("a", 100.0, None, 3.0, IdentityKind.UPTIME_BACKWARDS),
    ("a", 100.0, "", 3.0, IdentityKind.UPTIME_BACKWARDS),
    ("a", None, "a", None, IdentityKind.SAME),
    ("a", None, "b", None, IdentityKind.ID_CHANGED),
    ("a", None, "a", 5.0, IdentityKind.FIRST),
    (None, None, "a", 5.0, IdentityKind.FIRST),
    (None, 100.0, "a", 150.0, IdentityKind.FIRST),
    ("a", 100.0, None, None, IdentityKind.INCONCLUSIVE),
    ("a", 100.0, None, 150.0, IdentityKind.SAME),
]


@pytest.mark.parametrize(("known_id", "known_up", "read_id", "read_up", "kind"), VERDICTS)
def test_observe_identity_table(
    known_id: str | None,
    known_up: float | None,
    read_id: str | None,
    read_up: float | None,
    kind: IdentityKind,
) -> None:
    rt = WorkerRuntime(engine_id=known_id, last_uptime_s=known_up)
    before = (rt.engine_id, rt.last_uptime_s, rt.last_identity_check_at)
    v = observe_identity(rt, read_id, read_up, now=42.0)
    assert v.kind is kind
    assert v.restarted is (kind in (IdentityKind.ID_CHANGED, IdentityKind.UPTIME_BACKWARDS))
    assert v.now == 42.0
    assert (rt.engine_id, rt.last_uptime_s, rt.last_identity_check_at) == before  # pure


def test_apply_identity_changed_id_takes_force_confirmed() -> None:
    w = ready_prefill()
    w.runtime.engine_id, w.runtime.last_uptime_s = "a", 100.0
    begin_identity_check(w, 20.0)
    apply_identity(w, observe_identity(w.runtime, "b", 2.0, 20.1))
    rt = w.runtime
    assert (rt.engine_id, rt.engine_id_confirmed, rt.last_uptime_s) == ("b", True, 2.0)
    assert (rt.last_identity_check_at, rt.identity_in_flight_since) == (20.1, None)
    assert plan_handoff(w, transfer_id="t").remote_engine_id == "b"


def test_apply_uptime_backwards_without_id_unconfirms_so_the_next_probe_rereads() -> None:
    w = ready_prefill()
    w.runtime.engine_id, w.runtime.engine_id_confirmed, w.runtime.last_uptime_s = "a", True, 100.0
    assert not reread_due_for(w, Status.READY, CFG)
    apply_identity(w, observe_identity(w.runtime, None, 1.0, 20.0))
    assert (w.engine_id, w.runtime.engine_id_confirmed) == ("a", False)
    assert reread_due_for(w, Status.READY, CFG)


def test_apply_same_keeps_everything_and_moves_the_clock() -> None:
    w = ready_prefill()
    w.runtime.engine_id, w.runtime.engine_id_confirmed, w.runtime.last_uptime_s = "a", True, 100.0
    apply_identity(w, observe_identity(w.runtime, "a", 130.0, 30.0))
    assert (w.engine_id, w.runtime.engine_id_confirmed, w.runtime.last_uptime_s) == ("a", True, 130.0)
    assert next_identity_check_at(w, CFG) == 32.0


@pytest.mark.parametrize(
    ("status", "connector", "role", "bugs", "eligible"),
    [
        (Status.READY, "mooncake", "prefill", frozenset(), True),
        (Status.READY, "mooncake", "decode", frozenset(), True),
        (Status.READY, "nixl", "prefill", frozenset(), False),
        (Status.READY, "none", "prefill", frozenset(), False),
        (Status.READY, "none", "regular", frozenset(), False),
        (Status.READY, "mooncake", "prefill", frozenset({STALE_ENGINE_ID}), False),
        (Status.PENDING, "mooncake", "prefill", frozenset(), False),
        (Status.NOT_READY, "mooncake", "prefill", frozenset(), False),
        (Status.FAILED, "mooncake", "prefill", frozenset(), False),
        (Status.DRAINING, "mooncake", "prefill", frozenset(), False),
    ],
)
def test_eligibility(status: Status, connector: str, role: str, bugs: frozenset[str], eligible: bool) -> None:
    w = ready_prefill(connector=connector, role=role)
    w.runtime.status = status
    cfg = HealthConfig(identity_check_interval_s=2.0, bugs=bugs)
    assert identity_check_eligible(w, cfg) is eligible
    assert (next_identity_check_at(w, cfg) is not None) is eligible
    assert identity_check_due(w, 1e9, cfg) is eligible


def test_unknown_connector_is_not_identity_checked_until_learned() -> None:
    w = Worker.new("w1", make_worker_spec("grpc://127.0.0.1:7000", "prefill"))
    w.runtime.status, w.runtime.ready_since = Status.READY, 0.0
    assert not identity_check_eligible(w, CFG)
    apply_metadata_read(
        w, MetadataRead(ReadOutcome.COMPLETE, engine_id="e", connector="MooncakeConnector"), 0.0, CFG
    )
    assert identity_check_eligible(w, CFG)


def test_first_check_is_staggered_within_one_interval_after_ready() -> None:
    phases = {identity_phase(f"w{i}") for i in range(200)}
    assert all(0.0 < p <= 1.0 for p in phases)
    assert len(phases) > 150  # spread out, not all due at once
    assert identity_phase("w7") == identity_phase("w7")  # stable
    w = ready_prefill("w7")
    due_at = next_identity_check_at(w, CFG)
    assert due_at is not None and 10.0 < due_at <= 10.0 + CFG.identity_check_interval_s
    assert not identity_check_due(w, due_at - 1e-6, CFG)
    assert identity_check_due(w, due_at, CFG)


def test_workers_promoted_together_are_spread_over_the_interval() -> None:
    reg = WorkerRegistry()
    for i in range(40):
        w = reg.add(make_worker_spec(f"http://127.0.0.1:{8100 + i}", "prefill"))
        w.runtime.status, w.runtime.ready_since, w.runtime.last_probe_at = Status.READY, 0.0, 0.0
    due_counts = [sum(identity_check_due(w, t, CFG) for w in reg) for t in (0.5, 1.0, 1.5, 2.0)]
    assert due_counts == sorted(due_counts) and 0 < due_counts[0] < 40 and due_counts[-1] == 40


def test_in_flight_check_blocks_a_second_until_the_probe_timeout() -> None:
    w = ready_prefill()
    w.runtime.last_identity_check_at = 0.0
    assert identity_check_due(w, 2.0, CFG)
    begin_identity_check(w, 2.0)
    assert not identity_check_due(w, 2.1, CFG)
    assert identity_check_due(w, 2.0 + CFG.probe_timeout_s, CFG)  # a hung check never blocks for long
    identity_check_failed(w, 2.3)
    assert w.runtime.identity_in_flight_since is None
    assert not identity_check_due(w, 4.2, CFG) and identity_check_due(w, 4.3, CFG)


def test_no_identity_check_while_a_probe_is_in_flight() -> None:
    w = ready_prefill()
    w.runtime.last_identity_check_at = 0.0
    begin_probe(w, 5.0)
    assert not identity_check_due(w, 5.1, CFG)


def test_a_complete_reread_resets_the_identity_clock() -> None:
    w = ready_prefill()
    w.runtime.status = Status.NOT_READY
    tok = begin_probe(w, 20.0)
    res = finish_probe(w, tok, True, 20.1, CFG)
    assert res is not None and res.reread_due
    finish_reread(w, tok, MetadataRead(ReadOutcome.COMPLETE, engine_id="e", uptime_s=1.0), 20.2, CFG)
    assert next_identity_check_at(w, CFG) == pytest.approx(22.2)


class Engine:
    """A stand-in engine for the closed-loop test: id and uptime, restarted at a chosen time."""

    def __init__(self, engine_id: str, started: float) -> None:
        self.engine_id, self.started = engine_id, started

    def restart(self, now: float, new_id: str) -> None:
        self.engine_id, self.started = new_id, now

    def read(self, now: float) -> MetadataRead:
        return MetadataRead(
            ReadOutcome.COMPLETE,
            engine_id=self.engine_id,
            connector="MooncakeConnector",
            uptime_s=now - self.started,
        )


def drive(
    cfg: HealthConfig, restart_at: float, until: float, step: float = 0.05
) -> tuple[Worker, float | None]:
    """Run the core's health loop on a virtual clock against an engine restarted between two probes (every
    probe passes). Returns the worker and when the new id took force (None if never)."""
    reg = WorkerRegistry()
    w = reg.add(make_worker_spec("grpc://127.0.0.1:7000", "prefill"))
    eng = Engine("gen1", 0.0)
    restarted = False
    took_force: float | None = None
    now = 0.0
    while now <= until:
        if not restarted and now >= restart_at:
            eng.restart(now, "gen2")
            restarted = True
        # Every probe passes: the engine is back before any probe sees it down.
        tick(reg, now, cfg, True, eng.read)
        if restarted and took_force is None and w.engine_id == "gen2":
            took_force = now
        now = round(now + step, 6)
    return w, took_force


@pytest.mark.parametrize("restart_at", [3.05, 4.4, 5.0, 7.73])
def test_restart_between_probes_is_noticed_within_the_documented_bound(restart_at: float) -> None:
    w, took_force = drive(CFG, restart_at, until=restart_at + 10.0)
    assert w.status is Status.READY and took_force is not None
    bound = CFG.identity_check_interval_s + CFG.probe_timeout_s
    assert took_force - restart_at <= bound + 0.05
    assert plan_handoff(w, transfer_id="t").remote_engine_id == "gen2"


def test_with_stale_engine_id_bug_the_restart_is_never_noticed() -> None:
    cfg = HealthConfig(
        failure_threshold=1,
        success_threshold=1,
        probe_timeout_s=0.2,
        interval_s=1.0,
        identity_check_interval_s=2.0,
        bugs=frozenset({STALE_ENGINE_ID}),
    )
    w, took_force = drive(cfg, 3.0, until=30.0)
    assert took_force is None and w.engine_id == "gen1"
    assert plan_handoff(w, transfer_id="t").remote_engine_id == "gen1"  # minting the dead id
