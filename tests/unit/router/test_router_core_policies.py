"""Selection policies: Ready workers only, per-leg state (bug #10), seeded randomness, load awareness."""

from __future__ import annotations

from collections import Counter

import pytest

from reference_router.core import (
    POLICY_NAMES,
    LeastLoad,
    PowerOfTwo,
    RandomPolicy,
    RoundRobin,
    Status,
    Worker,
    make_policy,
    make_worker_spec,
)


def workers(role: str, n: int, base: int) -> list[Worker]:
    out = []
    for i in range(n):
        w = Worker.new(f"{role[0]}{i}", make_worker_spec(f"http://127.0.0.1:{base + i}", role))
        w.runtime.status = Status.READY
        out.append(w)
    return out


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_only_ready_workers_and_none_when_empty(name: str) -> None:
    policy = make_policy(name, seed=1)
    assert policy.name == name
    assert policy.select([], 0.0) is None
    ws = workers("decode", 4, 9000)
    for st, w in zip([Status.PENDING, Status.NOT_READY, Status.FAILED, Status.DRAINING], ws, strict=True):
        w.runtime.status = st
    assert policy.select(ws, 0.0) is None
    ws[2].runtime.status = Status.READY
    assert all(policy.select(ws, float(t)) is ws[2] for t in range(20))


def test_round_robin_cycles() -> None:
    ws = workers("decode", 3, 9000)
    rr = RoundRobin()
    assert [rr.select(ws, 0.0).id for _ in range(7)] == ["d0", "d1", "d2", "d0", "d1", "d2", "d0"]  # type: ignore[union-attr]


def test_one_instance_per_leg_does_not_skew_round_robin() -> None:
    """Bug #10: a policy shared by both legs advances twice per request, skipping every other worker."""
    pre, dec = workers("prefill", 2, 8000), workers("decode", 2, 9000)
    p_rr, d_rr = make_policy("round_robin"), make_policy("round_robin")
    pairs = [(p_rr.select(pre, 0.0).id, d_rr.select(dec, 0.0).id) for _ in range(4)]  # type: ignore[union-attr]
    assert [p for p, _ in pairs] == ["p0", "p1", "p0", "p1"]
    assert [d for _, d in pairs] == ["d0", "d1", "d0", "d1"]
    shared = make_policy("round_robin")
    skewed = [(shared.select(pre, 0.0).id, shared.select(dec, 0.0).id) for _ in range(4)]  # type: ignore[union-attr]
    assert {d for _, d in skewed} == {"d1"}  # what the bug looks like: d0 never chosen


def picks(policy: object, ws: list[Worker], n: int = 40) -> list[str]:
    out = []
    for _ in range(n):
        w = policy.select(ws, 0.0)  # type: ignore[attr-defined]
        assert w is not None
        out.append(w.id)
    return out


def test_random_is_seeded_and_covers_all() -> None:
    ws = workers("decode", 4, 9000)
    seq = picks(RandomPolicy(3), ws)
    assert seq == picks(make_policy("random", 3), ws)
    assert set(seq) == {"d0", "d1", "d2", "d3"}
    assert picks(RandomPolicy(4), ws) != seq


def test_power_of_two_prefers_the_less_loaded_of_two() -> None:
    ws = workers("decode", 2, 9000)
    ws[0].runtime.in_flight_requests = 5
    p2 = PowerOfTwo(seed=0)
    assert all(p2.select(ws, 0.0) is ws[1] for _ in range(20))
    ws[0].runtime.in_flight_requests, ws[1].runtime.in_flight_requests = 0, 5
    assert all(p2.select(ws, 0.0) is ws[0] for _ in range(20))


def test_power_of_two_never_picks_the_most_loaded_of_many() -> None:
    ws = workers("decode", 5, 9000)
    for i, w in enumerate(ws):
        w.runtime.in_flight_requests = i
    p2 = PowerOfTwo(seed=11)
    picks = Counter(p2.select(ws, 0.0).id for _ in range(400))  # type: ignore[union-attr]
    assert "d4" not in picks and picks["d0"] > picks["d3"]
    again = PowerOfTwo(seed=11)
    assert Counter(again.select(ws, 0.0).id for _ in range(400)) == picks  # type: ignore[union-attr]


def test_least_load_picks_minimum_and_spreads_ties() -> None:
    ws = workers("decode", 3, 9000)
    ll = LeastLoad()
    ws[0].runtime.in_flight_requests = 2
    picks = [ll.select(ws, 0.0).id for _ in range(4)]  # type: ignore[union-attr]
    assert set(picks) == {"d1", "d2"} and picks.count("d1") == 2
    ws[1].runtime.in_flight_requests = ws[2].runtime.in_flight_requests = 9
    assert ll.select(ws, 0.0) is ws[0]


@pytest.mark.parametrize("bad", ["fastest", "", "cache_aware"])
def test_unknown_policy(bad: str) -> None:
    with pytest.raises(ValueError, match="round_robin, random, power_of_two, least_load"):
        make_policy(bad)


def test_make_policy_gives_fresh_instances() -> None:
    assert make_policy("round_robin") is not make_policy("round_robin")
    assert make_policy(" Least_Load ").name == "least_load"
