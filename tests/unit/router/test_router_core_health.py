"""The worker status state machine, pinned transition by transition (DESIGN §2)."""

from __future__ import annotations

import random

import pytest

from reference_router.core import Counters, HealthConfig, Status, next_status

P, R, NR, F, D = Status.PENDING, Status.READY, Status.NOT_READY, Status.FAILED, Status.DRAINING
CFG = HealthConfig(failure_threshold=3, success_threshold=2)


def c(s: int = 0, f: int = 0, p: int = 0) -> Counters:
    return Counters(successes=s, failures=f, pending_probes=p)


# (status, counters, probe ok) -> (status, counters), with failure_threshold 3 and success_threshold 2.
TABLE = [
    # Pending: successes promote; failures only count probes; 30 probes (10 x 3) -> Failed.
    (P, c(), True, P, c(s=1, p=1)),
    (P, c(s=1, p=1), True, R, c()),
    (P, c(), False, P, c(f=1, p=1)),
    (P, c(f=2, p=2), False, P, c(f=3, p=3)),  # Pending never goes NotReady
    (P, c(s=1, p=4), False, P, c(f=1, p=5)),
    (P, c(f=1, p=5), True, P, c(s=1, p=6)),
    (P, c(f=6, p=28), False, P, c(f=7, p=29)),
    (P, c(f=7, p=29), False, F, c()),
    (P, c(f=7, p=29), True, F, c()),  # the cap fails it even on a success that does not promote
    (P, c(s=1, p=29), True, R, c()),  # ... unless that success completes success_threshold
    # Ready: failure_threshold consecutive failures -> NotReady, failures keep counting.
    (R, c(), True, R, c(s=1)),
    (R, c(s=9), True, R, c(s=10)),
    (R, c(), False, R, c(f=1)),
    (R, c(f=1), False, R, c(f=2)),
    (R, c(f=2), False, NR, c(f=3)),
    (R, c(f=2), True, R, c(s=1)),
    # NotReady: success_threshold successes -> Ready; 3 x failure_threshold consecutive failures -> Failed.
    (NR, c(f=3), True, NR, c(s=1)),
    (NR, c(s=1), True, R, c()),
    (NR, c(s=1), False, NR, c(f=1)),
    (NR, c(f=3), False, NR, c(f=4)),
    (NR, c(f=7), False, NR, c(f=8)),
    (NR, c(f=8), False, F, c()),
    # Failed is not terminal: success_threshold successes -> Ready (bug #6).
    (F, c(), True, F, c(s=1)),
    (F, c(s=1), True, R, c()),
    (F, c(), False, F, c(f=1)),
    (F, c(f=40), False, F, c(f=41)),
    (F, c(s=1), False, F, c(f=1)),
    # Draining never transitions and its counters never move.
    (D, c(), True, D, c()),
    (D, c(s=1), True, D, c(s=1)),
    (D, c(f=2, p=3), False, D, c(f=2, p=3)),
]


@pytest.mark.parametrize(("status", "counters", "ok", "want_status", "want_counters"), TABLE)
def test_transition_table(
    status: Status, counters: Counters, ok: bool, want_status: Status, want_counters: Counters
) -> None:
    assert next_status(status, counters, ok, CFG) == (want_status, want_counters)


def test_table_covers_every_status_and_outcome() -> None:
    seen = {(row[0], row[2]) for row in TABLE}
    assert seen == {(s, ok) for s in Status for ok in (True, False)}


def run(cfg: HealthConfig, status: Status, outcomes: list[bool]) -> list[Status]:
    counters = Counters()
    trail = []
    for ok in outcomes:
        status, counters = next_status(status, counters, ok, cfg)
        trail.append(status)
    return trail


@pytest.mark.parametrize("ft", [1, 2, 3])
def test_pending_fails_at_exactly_ten_times_failure_threshold(ft: int) -> None:
    cfg = HealthConfig(failure_threshold=ft, success_threshold=2)
    trail = run(cfg, P, [False] * (10 * ft))
    assert trail[:-1] == [P] * (10 * ft - 1)
    assert trail[-1] is F


@pytest.mark.parametrize("ft", [1, 2, 3])
def test_flapping_pending_worker_is_failed_not_pending_forever(ft: int) -> None:
    cfg = HealthConfig(failure_threshold=ft, success_threshold=2)
    trail = run(cfg, P, [True, False] * (5 * ft))
    assert trail[-1] is F
    assert R not in trail


@pytest.mark.parametrize("ft", [1, 2, 3])
def test_ready_to_not_ready_to_failed_counts(ft: int) -> None:
    cfg = HealthConfig(failure_threshold=ft, success_threshold=2)
    trail = run(cfg, R, [False] * (3 * ft))
    assert trail[ft - 1] is NR
    assert all(s is R for s in trail[: ft - 1])
    assert all(s is NR for s in trail[ft - 1 : 3 * ft - 1])
    assert trail[-1] is F


@pytest.mark.parametrize("st", [1, 2, 3])
def test_success_threshold_promotes_from_every_unhealthy_status(st: int) -> None:
    cfg = HealthConfig(failure_threshold=2, success_threshold=st)
    for start in (P, NR, F):
        trail = run(cfg, start, [True] * st)
        assert trail[-1] is R, start
        assert R not in trail[:-1], start


def test_one_failure_between_successes_restarts_the_count() -> None:
    cfg = HealthConfig(failure_threshold=3, success_threshold=2)
    assert run(cfg, F, [True, False, True]) == [F, F, F]
    assert run(cfg, F, [True, False, True, True])[-1] is R


def test_random_walks_respect_invariants() -> None:
    rng = random.Random(7)
    cfg = HealthConfig(failure_threshold=2, success_threshold=2)
    for _ in range(200):
        status, counters = rng.choice([P, R, NR, F]), Counters()
        for _ in range(50):
            ok = rng.random() < 0.5
            new, nc = next_status(status, counters, ok, cfg)
            assert new is not D
            assert nc.successes == 0 or nc.failures == 0
            if new is not status and not (status is R and new is NR):
                assert nc == Counters()
            if new is R and status is not R:
                assert ok
            status, counters = new, nc
