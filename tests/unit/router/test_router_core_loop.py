"""The core's health loop driven on a virtual clock against scripted engines: the zoo bugs seen end to end.

Each case scripts what the engine answers (probe ok, metadata read) over time and checks what the router core
believes and would mint. health_sim drives the core's own tick (core.health_tick), the one the asyncio shell
runs: plan, expire, probe, re-read, identity check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from helpers.health_sim import tick

from reference_router.core import (
    PARTIAL_READ_CLEARS_ID,
    HealthConfig,
    MetadataRead,
    ReadOutcome,
    Status,
    Worker,
    WorkerRegistry,
    begin_probe,
    make_worker_spec,
    on_probe_done,
    plan_handoff,
    start_tick,
)

CFG = HealthConfig(
    failure_threshold=1,
    success_threshold=2,
    probe_timeout_s=0.1,
    interval_s=0.5,
    identity_check_interval_s=5.0,
)


@dataclass
class Script:
    """What the engine answers at time t."""

    healthy: Callable[[float], bool]
    read: Callable[[float], MetadataRead]
    reads: list[float] = field(default_factory=list)
    statuses: list[tuple[float, Status]] = field(default_factory=list)


def complete(engine_id: str | None, uptime: float | None = None) -> MetadataRead:
    return MetadataRead(
        ReadOutcome.COMPLETE, engine_id=engine_id, connector="MooncakeConnector", uptime_s=uptime
    )


def run(script: Script, until: float, cfg: HealthConfig = CFG, step: float = 0.05) -> Worker:
    reg = WorkerRegistry()
    w = reg.add(make_worker_spec("grpc://127.0.0.1:7000", "prefill"))
    now = 0.0
    while now <= until:
        for effects in tick(reg, now, cfg, script.healthy(now), script.read, script.reads):
            script.statuses += [(now, Status(c["to"])) for c in effects.of_type("status_change")]
        now = round(now + step, 6)
    return w


def restart_script(down: tuple[float, float], old: str = "gen1", new: str = "gen2") -> Script:
    start, end = down

    def healthy(t: float) -> bool:
        return not start <= t < end

    def read(t: float) -> MetadataRead:
        if start <= t < end:
            return MetadataRead(ReadOutcome.ERROR)
        return complete(old, t) if t < start else complete(new, t - end)

    return Script(healthy, read)


def test_restart_through_an_outage_rejoins_with_the_new_id() -> None:
    """Bugs #1 and #6: down long enough to be Failed, back on the same address with a new id."""
    s = restart_script((2.0, 5.0))
    w = run(s, until=8.0)
    assert [st for _, st in s.statuses] == [Status.READY, Status.NOT_READY, Status.FAILED, Status.READY]
    assert (w.status, w.engine_id, w.runtime.engine_id_confirmed) == (Status.READY, "gen2", True)
    assert plan_handoff(w, transfer_id="t").remote_engine_id == "gen2"


def test_failed_reread_at_promotion_is_retried() -> None:
    """Bug #4: the first re-read after the outage fails; the id must not stay stale for life."""
    back = 3.0
    fails = {"left": 2}

    def read(t: float) -> MetadataRead:
        if t < 1.0:
            return complete("gen1", t)
        if fails["left"] > 0:
            fails["left"] -= 1
            return MetadataRead(ReadOutcome.TIMEOUT)
        return complete("gen2", t - back)

    s = Script(lambda t: not 1.0 <= t < back, read)
    w = run(s, until=8.0)
    assert w.status is Status.READY and w.engine_id == "gen2" and w.runtime.engine_id_confirmed
    assert fails["left"] == 0


def test_engine_without_id_is_not_reread_every_probe() -> None:
    """Bug #5: complete reads without an id confirm; Ready probes stop re-reading."""
    s = Script(lambda t: True, lambda t: complete(None, t))
    w = run(s, until=20.0)
    assert w.status is Status.READY and w.engine_id is None and w.runtime.engine_id_confirmed
    probe_reads = [t for t in s.reads if t < 1.0]
    assert len(probe_reads) == 2  # the two Pending probes (no id yet), then none
    # later reads are the low-rate identity checks only: one per identity interval
    later = [t for t in s.reads if t >= 1.0]
    assert 2 <= len(later) <= 20.0 / CFG.identity_check_interval_s + 1
    assert plan_handoff(w).mint_skipped == "no_engine_id"


@pytest.mark.parametrize(
    ("bugs", "want_id"), [(frozenset(), "gen1"), (frozenset({PARTIAL_READ_CLEARS_ID}), None)]
)
def test_partial_read_after_a_blip(bugs: frozenset[str], want_id: str | None) -> None:
    """Bug #3: a blip (one failed probe) then server info fails while model info answers."""

    def read(t: float) -> MetadataRead:
        return complete("gen1", t) if t < 1.0 else MetadataRead(ReadOutcome.PARTIAL)

    cfg = HealthConfig(
        failure_threshold=1,
        success_threshold=2,
        probe_timeout_s=0.1,
        interval_s=0.5,
        identity_check_interval_s=50.0,
        bugs=bugs,
    )
    s = Script(lambda t: not 2.0 <= t < 2.5, read)
    w = run(s, until=6.0, cfg=cfg)
    assert w.status is Status.READY and w.engine_id == want_id
    if want_id is None:
        assert plan_handoff(w).mint_skipped == "no_engine_id"  # the decode recomputes forever
    else:
        assert plan_handoff(w, transfer_id="t").remote_engine_id == "gen1"
        assert not w.runtime.engine_id_confirmed  # still retrying


def test_probe_that_hangs_is_expired_and_the_worker_probed_again() -> None:
    """Bug #2 in the loop: a probe started but never finished does not stop health checking."""
    cfg = HealthConfig(failure_threshold=1, success_threshold=1, probe_timeout_s=0.1, interval_s=0.5)
    reg = WorkerRegistry()
    w = reg.add(make_worker_spec("http://127.0.0.1:8100", "decode", connector="none"))
    begin_probe(w, 0.0)  # hangs forever
    probed_again = None
    now = 0.0
    while now < 3.0 and probed_again is None:
        for p in start_tick(reg, now, cfg).probes:
            probed_again = now
            on_probe_done(p.worker, p.token, True, 0.0, now, cfg)
        now = round(now + 0.05, 6)
    assert probed_again is not None and probed_again <= cfg.probe_slot_s + cfg.interval_s + 0.05
    assert w.status is Status.READY
