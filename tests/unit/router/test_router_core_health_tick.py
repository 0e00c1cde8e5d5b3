"""core.health_tick on a virtual clock with scripted answers: what each step starts, applies and records."""

from __future__ import annotations

import pytest

from reference_router.core import (
    METADATA_NO_DEADLINE,
    METADATA_READS_TOTAL,
    PROBES_TOTAL,
    Effects,
    HealthConfig,
    MetadataRead,
    MetricInc,
    ReadOutcome,
    Status,
    Worker,
    WorkerRegistry,
    abandon_identity_check,
    make_worker_spec,
    on_identity_done,
    on_probe_done,
    on_reread_done,
    start_tick,
    tick_period_s,
)

CFG = HealthConfig(
    failure_threshold=1,
    success_threshold=1,
    probe_timeout_s=0.5,
    interval_s=2.0,
    identity_check_interval_s=10.0,
    max_probes_in_flight=1,
)
# Identity checks only: probes are not due again for a long while, so they never take the slots.
ID_CFG = HealthConfig(failure_threshold=1, success_threshold=1, probe_timeout_s=0.5, interval_s=1000.0,
                      identity_check_interval_s=10.0)


def add(reg: WorkerRegistry, port: int, role: str = "prefill", connector: str = "mooncake",
        status: Status = Status.READY, engine_id: str | None = "gen1") -> Worker:
    w = reg.add(make_worker_spec(f"grpc://127.0.0.1:{port}", role, connector=connector))
    w.runtime.status = status
    w.runtime.engine_id = engine_id
    w.runtime.engine_id_confirmed = engine_id is not None
    return w


def complete(engine_id: str | None, uptime: float | None = None) -> MetadataRead:
    return MetadataRead(ReadOutcome.COMPLETE, engine_id=engine_id, connector="MooncakeConnector",
                        uptime_s=uptime, duration_s=0.03)


def test_tick_period_follows_the_interval_and_the_probe_timeout() -> None:
    assert tick_period_s(CFG) == pytest.approx(0.125)  # probe timeout / 4 beats interval / 10
    assert tick_period_s(HealthConfig(interval_s=0.2, probe_timeout_s=5.0)) == pytest.approx(0.02)
    assert tick_period_s(HealthConfig()) == 1.0


def test_a_tick_starts_no_more_probes_than_there_are_slots() -> None:
    reg = WorkerRegistry()
    a, b = add(reg, 7001), add(reg, 7002)
    plan = start_tick(reg, 0.0, CFG)
    assert [(s.worker, s.timeout_s) for s in plan.probes] == [(a, CFG.probe_timeout_s)]
    assert plan.expired == () and plan.effects == Effects()
    # The slot is held: b waits, and a is not probed twice.
    assert start_tick(reg, 0.1, CFG).probes == ()
    done = on_probe_done(a, plan.probes[0].token, True, 0.01, 0.2, CFG)
    assert done.effects.of_type("probe") == [
        {"worker": a.id, "url": a.spec.url, "ok": True, "duration_s": 0.01}
    ]
    assert [s.worker for s in start_tick(reg, 0.3, CFG).probes] == [b]


def test_probe_that_overruns_its_slot_is_a_failed_probe_and_frees_the_slot() -> None:
    reg = WorkerRegistry()
    a = add(reg, 7001, role="decode", connector="none")
    b = add(reg, 7002, role="decode", connector="none")
    (hung,) = start_tick(reg, 0.0, CFG).probes  # never answers
    assert hung.worker is a
    assert start_tick(reg, CFG.probe_slot_s - 0.01, CFG).expired == ()
    plan = start_tick(reg, CFG.probe_slot_s, CFG)
    assert plan.expired == (a,)
    assert plan.effects.of_type("probe") == [
        {"worker": a.id, "url": a.spec.url, "ok": False, "duration_s": CFG.probe_slot_s}
    ]
    assert plan.effects.of_type("status_change") == [
        {"worker": a.id, "url": a.spec.url, "from": "ready", "to": "not_ready"}
    ]
    assert plan.effects.metrics == [MetricInc(PROBES_TOTAL, {"outcome": "failed"})]
    # Its slot went to the worker that was waiting, in the same tick.
    assert a.runtime.probe_in_flight_since is None
    assert [s.worker for s in plan.probes] == [b]
    # The hung probe's answer, should it ever come, changes nothing and tells nothing.
    late = on_probe_done(a, hung.token, True, 9.0, CFG.probe_slot_s + 0.1, CFG)
    assert late.effects == Effects() and not late.reread_due
    assert a.status is Status.NOT_READY


def test_success_after_not_ready_makes_a_reread_due_and_the_read_takes_force() -> None:
    reg = WorkerRegistry()
    w = add(reg, 7001, status=Status.NOT_READY)
    (probe,) = start_tick(reg, 0.0, CFG).probes
    done = on_probe_done(w, probe.token, True, 0.02, 0.02, CFG)
    assert w.status is Status.READY
    assert done.reread_due and done.reread_timeout_s == CFG.probe_timeout_s
    assert done.effects.of_type("status_change") == [
        {"worker": w.id, "url": w.spec.url, "from": "not_ready", "to": "ready"}
    ]
    assert done.effects.of_type("engine_id") == []  # nothing read yet
    read = on_reread_done(w, probe.token, complete("gen2"), 0.05, CFG)
    assert read.effects.of_type("metadata_read") == [
        {"worker": w.id, "url": w.spec.url, "outcome": "id", "read": "complete", "duration_s": 0.03}
    ]
    assert read.effects.of_type("engine_id") == [
        {"worker": w.id, "url": w.spec.url, "old": "gen1", "new": "gen2", "confirmed": True, "reason": "read"}
    ]
    assert read.effects.metrics == [MetricInc(METADATA_READS_TOTAL, {"outcome": "id"})]
    assert (w.engine_id, w.runtime.probe_in_flight_since) == ("gen2", None)


def test_success_on_a_ready_confirmed_worker_needs_no_reread() -> None:
    reg = WorkerRegistry()
    w = add(reg, 7001)
    (probe,) = start_tick(reg, 0.0, CFG).probes
    done = on_probe_done(w, probe.token, True, 0.02, 0.02, CFG)
    assert not done.reread_due and done.effects.of_type("status_change") == []
    assert w.runtime.probe_in_flight_since is None


def test_reread_that_overruns_is_a_timed_out_read_that_keeps_the_id_unconfirmed() -> None:
    reg = WorkerRegistry()
    w = add(reg, 7001, status=Status.FAILED)
    (probe,) = start_tick(reg, 0.0, CFG).probes
    assert on_probe_done(w, probe.token, True, 0.01, 0.01, CFG).reread_due
    plan = start_tick(reg, CFG.probe_slot_s, CFG)
    assert plan.expired == (w,)
    assert plan.effects.of_type("metadata_read") == [
        {"worker": w.id, "url": w.spec.url, "outcome": "timeout", "read": "timeout",
         "duration_s": CFG.probe_timeout_s}
    ]
    # The id stays, no longer confirmed: that change is told, so the next probe's re-read is expected.
    assert plan.effects.of_type("engine_id") == [
        {"worker": w.id, "url": w.spec.url, "old": "gen1", "new": "gen1", "confirmed": False,
         "reason": "timeout read: kept, retry next probe"}
    ]
    assert on_reread_done(w, probe.token, complete("late"), 1.1, CFG).effects == Effects()
    assert w.engine_id == "gen1"


def test_metadata_no_deadline_bug_gives_the_reread_no_deadline_and_never_frees_its_slot() -> None:
    cfg = HealthConfig(failure_threshold=1, success_threshold=1, probe_timeout_s=0.5, interval_s=2.0,
                       max_probes_in_flight=1, bugs=frozenset({METADATA_NO_DEADLINE}))
    reg = WorkerRegistry()
    w = add(reg, 7001, status=Status.NOT_READY)
    other = add(reg, 7002)
    (probe,) = start_tick(reg, 0.0, cfg).probes
    done = on_probe_done(w, probe.token, True, 0.01, 0.01, cfg)
    assert done.reread_due and done.reread_timeout_s is None
    later = start_tick(reg, 100.0, cfg)
    assert later.expired == () and later.probes == () and later.effects == Effects()
    assert other.runtime.last_probe_at is None  # starved, which is what the bug does


def test_identity_check_sees_a_restart_no_probe_saw() -> None:
    reg = WorkerRegistry()
    w = add(reg, 7001)
    w.runtime.last_probe_at = 0.0
    w.runtime.last_identity_check_at = 0.0
    w.runtime.last_uptime_s = 50.0
    assert start_tick(reg, 1.0, ID_CFG).identity == ()
    plan = start_tick(reg, ID_CFG.identity_check_interval_s, ID_CFG)
    (check,) = plan.identity
    assert check.worker is w and check.timeout_s == ID_CFG.probe_timeout_s
    done = on_identity_done(w, check.token, complete("gen2", uptime=3.0), 10.1)
    assert done.verdict is not None and done.verdict.restarted
    assert done.effects.of_type("engine_id") == [
        {"worker": w.id, "url": w.spec.url, "old": "gen1", "new": "gen2", "confirmed": True,
         "reason": "identity check: id_changed"}
    ]
    assert done.effects.metrics == [MetricInc(METADATA_READS_TOTAL, {"outcome": "identity_id_changed"})]
    assert w.engine_id == "gen2" and w.runtime.identity_in_flight_since is None


def test_identity_check_that_fails_is_counted_and_retried_an_interval_later() -> None:
    reg = WorkerRegistry()
    w = add(reg, 7001)
    w.runtime.last_probe_at = 0.0
    w.runtime.last_identity_check_at = 0.0
    (check,) = start_tick(reg, 10.0, ID_CFG).identity
    done = on_identity_done(w, check.token, MetadataRead(ReadOutcome.TIMEOUT), 10.5)
    assert done.verdict is None and done.effects.events == []
    assert done.effects.metrics == [MetricInc(METADATA_READS_TOTAL, {"outcome": "identity_timeout"})]
    assert w.runtime.identity_in_flight_since is None and w.engine_id == "gen1"
    assert start_tick(reg, 20.4, ID_CFG).identity == ()
    assert [s.worker for s in start_tick(reg, 20.5, ID_CFG).identity] == [w]


def test_late_identity_answer_of_an_older_check_is_ignored() -> None:
    reg = WorkerRegistry()
    w = add(reg, 7001)
    w.runtime.last_probe_at = 0.0
    w.runtime.last_identity_check_at = 0.0
    (old,) = start_tick(reg, 10.0, ID_CFG).identity
    abandon_identity_check(w, old.token, 10.6)  # e.g. its task was cancelled
    (new,) = start_tick(reg, 20.6, ID_CFG).identity
    assert on_identity_done(w, old.token, complete("stale"), 20.7).effects == Effects()
    abandon_identity_check(w, old.token, 20.7)
    assert w.runtime.identity_in_flight_since == 20.6  # the newer check still holds its slot
    assert on_identity_done(w, new.token, complete("gen1", 30.0), 20.8).verdict is not None
    assert w.engine_id == "gen1"
