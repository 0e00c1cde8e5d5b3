"""Probe lifecycle and the health-loop planner: slots, expiry of probes that never return (bug #2)."""

from __future__ import annotations

from reference_router.core import (
    METADATA_NO_DEADLINE,
    HealthConfig,
    MetadataRead,
    ProbeStage,
    ReadOutcome,
    Status,
    Worker,
    WorkerRegistry,
    begin_identity_check,
    begin_probe,
    expire_probe,
    finish_probe,
    finish_reread,
    make_worker_spec,
    plan_probes,
    probe_due,
    probe_in_flight,
    set_draining,
)

CFG = HealthConfig(failure_threshold=1, success_threshold=1, probe_timeout_s=0.5, interval_s=1.0)


def mooncake_prefill(wid: str = "w1", port: int = 8100) -> Worker:
    return Worker.new(wid, make_worker_spec(f"http://127.0.0.1:{port}", "prefill"))


def registry(n: int) -> WorkerRegistry:
    reg = WorkerRegistry()
    for i in range(n):
        reg.add(make_worker_spec(f"http://127.0.0.1:{9000 + i}", "decode", connector="none"))
    return reg


def test_probe_then_reread_holds_one_slot_until_the_read_ends() -> None:
    w = mooncake_prefill()
    tok = begin_probe(w, 0.0)
    assert probe_in_flight(w, 0.1, CFG) and w.runtime.probe_stage is ProbeStage.PROBE
    res = finish_probe(w, tok, True, 0.1, CFG)
    assert res is not None and res.reread_due and res.changed
    assert (res.status_before, res.status_after) == (Status.PENDING, Status.READY)
    assert w.runtime.probe_stage is ProbeStage.REREAD and probe_in_flight(w, 0.2, CFG)
    d = finish_reread(w, tok, MetadataRead(ReadOutcome.COMPLETE, engine_id="e1"), 0.3, CFG)
    assert d is not None and d.engine_id == "e1"
    assert not probe_in_flight(w, 0.3, CFG) and w.runtime.probe_stage is None
    assert (w.runtime.last_probe_at, w.runtime.ready_since) == (0.1, 0.1)


def test_no_reread_frees_the_slot_at_once() -> None:
    w = Worker.new("w1", make_worker_spec("http://127.0.0.1:8100", "decode", connector="nixl"))
    tok = begin_probe(w, 0.0)
    res = finish_probe(w, tok, True, 0.1, CFG)
    assert res is not None and not res.reread_due
    assert w.runtime.probe_in_flight_since is None
    assert finish_reread(w, tok, MetadataRead(ReadOutcome.COMPLETE, engine_id="x"), 0.2, CFG) is None
    assert w.engine_id is None


def test_failed_probe_never_rereads() -> None:
    w = mooncake_prefill()
    res = finish_probe(w, begin_probe(w, 0.0), False, 0.1, CFG)
    assert res is not None and not res.reread_due and w.runtime.probe_in_flight_since is None


def test_stale_tokens_are_ignored() -> None:
    w = mooncake_prefill()
    old = begin_probe(w, 0.0)
    new = begin_probe(w, 0.1)
    assert finish_probe(w, old, True, 0.2, CFG) is None
    assert w.status is Status.PENDING
    assert finish_probe(w, new, True, 0.2, CFG) is not None
    assert finish_probe(w, new, True, 0.3, CFG) is None  # answered twice


def test_probe_that_never_returns_is_expired_as_a_failure_and_its_late_answer_ignored() -> None:
    w = mooncake_prefill()
    w.runtime.status = Status.READY
    tok = begin_probe(w, 0.0)
    assert expire_probe(w, CFG.probe_slot_s - 0.01, CFG) is None
    exp = expire_probe(w, CFG.probe_slot_s, CFG)
    assert exp is not None and exp.probe is not None and exp.reread is None
    assert (exp.probe.ok, exp.probe.status_after) == (False, Status.NOT_READY)
    assert w.runtime.probe_in_flight_since is None
    assert finish_probe(w, tok, True, 5.0, CFG) is None
    assert w.status is Status.NOT_READY
    assert expire_probe(w, 100.0, CFG) is None


def test_reread_that_never_returns_is_expired_as_a_timeout() -> None:
    w = mooncake_prefill()
    w.runtime.engine_id, w.runtime.engine_id_confirmed = "old", True
    w.runtime.status = Status.FAILED
    tok = begin_probe(w, 0.0)
    res = finish_probe(w, tok, True, 0.1, CFG)
    assert res is not None and res.reread_due and res.status_after is Status.READY
    exp = expire_probe(w, CFG.probe_slot_s + 0.1, CFG)
    assert exp is not None and exp.probe is None and exp.reread is not None
    assert exp.reread.event_outcome == "timeout"
    assert (w.engine_id, w.runtime.engine_id_confirmed, w.status) == ("old", False, Status.READY)
    assert finish_reread(w, tok, MetadataRead(ReadOutcome.COMPLETE, engine_id="late"), 9.0, CFG) is None
    assert w.engine_id == "old"


def test_with_metadata_no_deadline_bug_a_hung_reread_keeps_its_slot_forever() -> None:
    cfg = HealthConfig(
        failure_threshold=1,
        success_threshold=1,
        probe_timeout_s=0.5,
        interval_s=1.0,
        max_probes_in_flight=1,
        bugs=frozenset({METADATA_NO_DEADLINE}),
    )
    reg = WorkerRegistry()
    hung = reg.add(make_worker_spec("http://127.0.0.1:8100", "prefill"))
    other = reg.add(make_worker_spec("http://127.0.0.1:8101", "prefill"))
    tok = begin_probe(hung, 0.0)
    assert finish_probe(hung, tok, True, 0.1, cfg) is not None  # re-read starts and hangs
    for now in (1.0, 10.0, 1000.0):
        plan = plan_probes(reg, now, cfg)
        assert plan.probe == [] and plan.expired == [] and plan.in_flight == 1
        assert expire_probe(hung, now, cfg) is None
    assert other.runtime.last_probe_at is None  # starved: what bug #2 looks like


def test_draining_worker_is_never_probed_and_a_probe_in_flight_only_frees_its_slot() -> None:
    w = mooncake_prefill()
    w.runtime.status = Status.READY
    tok = begin_probe(w, 0.0)
    assert set_draining(w) is Status.READY
    assert finish_probe(w, tok, False, 0.1, CFG) is None
    assert w.status is Status.DRAINING and w.runtime.probe_in_flight_since is None
    assert not probe_due(w, 100.0, CFG)
    tok = begin_probe(w, 200.0)
    assert expire_probe(w, 300.0, CFG) is None and w.runtime.probe_in_flight_since is None


def test_planner_probes_new_workers_then_waits_for_the_interval() -> None:
    reg = registry(3)
    plan = plan_probes(reg, 0.0, CFG)
    assert [w.id for w in plan.probe] == ["w1", "w2", "w3"] and plan.in_flight == 0
    toks = {w.id: begin_probe(w, 0.0) for w in plan.probe}
    assert plan_probes(reg, 0.1, CFG).probe == []
    assert plan_probes(reg, 0.1, CFG).in_flight == 3
    for w in reg:
        finish_probe(w, toks[w.id], True, 0.2, CFG)
    assert plan_probes(reg, 1.1, CFG).probe == []
    assert [w.id for w in plan_probes(reg, 1.2, CFG).probe] == ["w1", "w2", "w3"]


def test_planner_caps_slots_and_serves_the_longest_waiting_first() -> None:
    cfg = HealthConfig(probe_timeout_s=0.5, interval_s=1.0, max_probes_in_flight=2)
    reg = registry(5)
    first = plan_probes(reg, 0.0, cfg).probe
    assert [w.id for w in first] == ["w1", "w2"]
    toks = {w.id: begin_probe(w, 0.0) for w in first}
    assert plan_probes(reg, 0.1, cfg).probe == []  # both slots held
    for w in first:
        finish_probe(w, toks[w.id], True, 0.1, cfg)
    second = plan_probes(reg, 0.1, cfg).probe
    assert [w.id for w in second] == ["w3", "w4"]
    for w in second:
        finish_probe(w, begin_probe(w, 0.1), True, 0.2, cfg)
    # w5 never probed beats w1/w2 (probed at 0.1) once they are due again.
    assert [w.id for w in plan_probes(reg, 5.0, cfg).probe] == ["w5", "w1"]


def test_planner_other_in_flight_takes_slots() -> None:
    cfg = HealthConfig(probe_timeout_s=0.5, interval_s=1.0, max_probes_in_flight=3)
    reg = registry(3)
    assert len(plan_probes(reg, 0.0, cfg, other_in_flight=2).probe) == 1
    assert plan_probes(reg, 0.0, cfg, other_in_flight=5).probe == []


def test_probes_that_never_return_do_not_starve_the_others() -> None:
    """Bug #2: every slot taken by a hung probe; past probe_slot_s they are expired and freed."""
    cfg = HealthConfig(
        failure_threshold=1, success_threshold=1, probe_timeout_s=0.5, interval_s=1.0, max_probes_in_flight=2
    )
    reg = registry(4)
    hung = plan_probes(reg, 0.0, cfg).probe
    for w in hung:
        begin_probe(w, 0.0)  # never finished
    assert plan_probes(reg, 0.5, cfg).probe == []
    plan = plan_probes(reg, cfg.probe_slot_s, cfg)
    assert [w.id for w in plan.expired] == ["w1", "w2"]
    assert [w.id for w in plan.probe] == ["w3", "w4"] and plan.in_flight == 0
    for w in plan.expired:
        exp = expire_probe(w, cfg.probe_slot_s, cfg)
        assert exp is not None and exp.probe is not None and not exp.probe.ok
    for w in plan.probe:
        begin_probe(w, cfg.probe_slot_s)  # these hang too
    later = plan_probes(reg, 2 * cfg.probe_slot_s, cfg)
    assert [w.id for w in later.expired] == ["w3", "w4"]
    assert [w.id for w in later.probe] == ["w1", "w2"]  # the expired ones are probed again when due
    assert all(w.status is Status.PENDING for w in reg)


def test_identity_checks_share_the_slot_budget() -> None:
    cfg = HealthConfig(probe_timeout_s=0.5, interval_s=1.0, max_probes_in_flight=2)
    reg = registry(3)
    begin_identity_check(reg.get("w1"), 0.0)  # type: ignore[arg-type]
    plan = plan_probes(reg, 0.0, cfg)
    assert plan.in_flight == 1 and len(plan.probe) == 1
    assert plan_probes(reg, 0.5, cfg).in_flight == 0  # identity checks are bounded by the probe timeout


def test_unhealthy_workers_are_still_probed_so_they_can_rejoin() -> None:
    reg = registry(4)
    for w, st in zip(reg, [Status.PENDING, Status.NOT_READY, Status.FAILED, Status.DRAINING], strict=True):
        w.runtime.status, w.runtime.last_probe_at = st, 0.0
    assert [w.id for w in plan_probes(reg, 0.9, CFG).probe] == []
    assert [w.id for w in plan_probes(reg, 1.0, CFG).probe] == ["w1", "w2", "w3"]
