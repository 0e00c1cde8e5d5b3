"""core.picking: which workers a leg's policy chooses from, checked exhaustively against the rule written
out plainly (Ready, breaker admitting; then settled prefills; then workers not suspect)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from reference_router.core import (
    BreakerState,
    ProbeStage,
    Role,
    Status,
    Worker,
    WorkerRegistry,
    make_worker_spec,
    pick_worker,
)

NOW = 5.0


class Recorder:
    """A policy that takes the first candidate and remembers what it was offered."""

    name = "recorder"

    def __init__(self) -> None:
        self.offered: list[Worker] = []

    def select(self, candidates: Sequence[Worker], now: float) -> Worker | None:
        self.offered = list(candidates)
        return candidates[0] if candidates else None


def plain_rule(workers: list[Worker], role: Role) -> list[Worker]:
    admitted = [w for w in workers if w.runtime.status is Status.READY
                and w.runtime.breaker.state is BreakerState.CLOSED]
    settled = [w for w in admitted if role is Role.PREFILL and w.runtime.probe_stage is not ProbeStage.REREAD]
    group = settled or admitted
    clear = [w for w in group if w.runtime.suspect_since is None]
    return clear or group


# Each worker: (ready, breaker closed, engine-id re-read running, suspect).
STATES = list(itertools.product((True, False), repeat=4))


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_every_mix_of_three_workers_offers_what_the_plain_rule_offers(role: Role) -> None:
    for combo in itertools.product(STATES, repeat=3):
        reg = WorkerRegistry()
        for i, (ready, closed, reread, suspect) in enumerate(combo):
            w = reg.add(make_worker_spec(f"http://127.0.0.1:{8100 + i}", role.value, connector="mooncake",
                                         bootstrap_port=9100 + i if role is Role.PREFILL else None))
            w.runtime.status = Status.READY if ready else Status.NOT_READY
            if not closed:
                w.runtime.breaker.state = BreakerState.OPEN
                w.runtime.breaker.open_until = NOW + 10.0
            w.runtime.probe_stage = ProbeStage.REREAD if reread else None
            w.runtime.suspect_since = 1.0 if suspect else None
        policy = Recorder()
        expected = plain_rule(reg.by_role(role), role)
        chosen = pick_worker(reg, role, policy, NOW)
        if expected:
            assert policy.offered == expected, combo
            assert chosen is expected[0]
        else:
            assert chosen is None and policy.offered == [], combo
