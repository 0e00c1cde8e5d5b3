"""Generated expectations: each invariant is judged only where the schedule leaves a correct router no excuse,
and where it is, it catches its bug switch in a simulated run (and passes without it)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, seed, settings

from harness.search.bias import space_for
from harness.search.case import Breaker, Load, SearchCase, bound_of, probe_times_s, recovery_bound_s
from harness.search.execute import run_case
from harness.search.expect import SLACK_S, expectations
from harness.search.faults import FaultSpec
from harness.search.strategies import Space, search_cases

GENERATE = (("surface", "generate"),)


def _params(case: SearchCase, checker: str) -> list[dict[str, Any]]:
    return [dict(e.params or {}) for e in expectations(case) if e.checker == checker]


def test_legs_once_is_always_judged() -> None:
    case = SearchCase(faults=(FaultSpec("crash", "prefill-0", 1.0, 1.0),))
    assert _params(case, "legs_once") == [{}]


def test_a_sole_worker_outage_is_held_to_prompt_503s_only_past_the_routers_detection() -> None:
    """A correct router answers 503 for a worker it took out; a sole decode cut for less time than its
    failed probes take to take it out (here 3 probes) may pass unnoticed, requests failing on the leg
    meanwhile (found by the search on the reference router)."""
    def prompt(length_s: float, threshold: int) -> list[dict[str, Any]]:
        cut = FaultSpec("partition_down", "decode-0", 1.0, length_s, "serve")
        return _params(SearchCase(failure_threshold=threshold, faults=(cut,)), "prompt_503")

    assert prompt(0.5, 3) == []
    (judged,) = prompt(4.0, 3)
    assert judged["faults"] == ["f0_partition_down"] and judged["settle_s"] == pytest.approx(2.4)
    (one,) = prompt(1.5, 1)
    assert one["settle_s"] == pytest.approx(0.8)


def test_retries_are_judged_only_where_another_prefill_serves() -> None:
    crash = FaultSpec("crash", "prefill-1", 1.0, 1.5)
    two = _params(SearchCase(topology="2p1d", faults=(crash,)), "availability")
    assert {"before": None, "during": 1.0, "after": None, "faults": ["f0_crash"],
            "exclude_in_flight_at_fault": True} in two
    one = _params(SearchCase(topology="1p1d", faults=(FaultSpec("crash", "prefill-0", 1.0, 1.5),)),
                  "availability")
    assert all(p.get("during") is None for p in one)
    # A dying engine answers 503 itself: a leg that ran, never retried.
    die = _params(SearchCase(topology="2p1d", faults=(FaultSpec("die", "prefill-1", 1.0, 1.5),)),
                  "availability")
    assert all(p.get("during") is None for p in die)


def test_availability_after_the_last_fault_waits_the_recovery_bound_or_a_second_for_a_kv_path() -> None:
    crash = SearchCase(faults=(FaultSpec("crash", "prefill-0", 1.0, 1.5),))
    (after,) = [p for p in _params(crash, "availability") if p.get("after") is not None]
    assert after["settle_s"] == recovery_bound_s("scaled", None) and after["faults"] == ["f0_crash"]
    reset = FaultSpec("link_reset", "prefill-0", 1.0, 1.5, "side_channel")
    nixl = SearchCase(connector="nixl", breaker=Breaker(3, 2.0), faults=(reset,))
    assert [p["settle_s"] for p in _params(nixl, "availability")] == [SLACK_S]
    # A Mooncake decode waiting out a broken pull may be cut by the request timeout, which a breaker counts.
    mooncake = SearchCase(connector="mooncake", breaker=Breaker(3, 2.0), faults=(reset,))
    assert [p["settle_s"] for p in _params(mooncake, "availability")] == [
        recovery_bound_s("scaled", Breaker(3, 2.0))]
    # Another fault after it: no window of its own to judge.
    busy = SearchCase(faults=(FaultSpec("crash", "prefill-0", 1.0, 1.5),
                              FaultSpec("wedge", "decode-0", 3.0, 0.5, params=(("surface", "health"),))))
    assert all(p.get("faults") != ["f0_crash"] for p in _params(busy, "availability"))


def test_ejection_needs_a_long_generate_hang_a_breaker_and_enough_closed_loop_clients() -> None:
    hang = (FaultSpec("wedge", "decode-0", 1.0, 5.0, params=GENERATE),)
    short = (FaultSpec("wedge", "decode-0", 1.0, 3.0, params=GENERATE),)
    three = Load(concurrency=3)
    base = SearchCase(topology="1p2d", breaker=Breaker(2, 1.0), load=three, faults=hang)
    ejection = {"before": None, "during": 0.85, "after": None, "faults": ["f0_wedge"]}
    assert ejection in _params(base, "availability")
    for case in (SearchCase(topology="1p2d", load=three, faults=hang),
                 SearchCase(topology="1p2d", breaker=Breaker(4, 1.0), load=three, faults=hang),
                 SearchCase(topology="1p2d", breaker=Breaker(2, 1.0), load=Load(rate_rps=20.0), faults=hang),
                 SearchCase(topology="1p2d", breaker=Breaker(2, 1.0), load=three, faults=short)):
        assert all(p.get("during") != 0.85 for p in _params(case, "availability"))


def test_latency_is_judged_for_holds_the_probes_see_that_outlast_a_request_timeout() -> None:
    long = SearchCase(topology="1p2d", faults=(FaultSpec("freeze", "decode-0", 1.0, 4.0),))
    assert _params(long, "latency") == [{"max_latency_s": 1.0, "faults": ["f0_freeze"], "min_requests": 1}]
    # Shorter: a request held from before the probes saw it may be released by the heal, a late success.
    short = SearchCase(topology="1p2d", faults=(FaultSpec("freeze", "decode-0", 1.0, 2.5),))
    assert _params(short, "latency") == []
    # Probes pass under a generate-only wedge: the router keeps sending it requests the heal releases.
    hang = FaultSpec("wedge", "decode-0", 1.0, 5.0, params=GENERATE)
    generate = SearchCase(topology="1p2d", faults=(hang,))
    assert _params(generate, "latency") == []


def test_balance_only_for_untouched_roles_without_a_breaker() -> None:
    fault = FaultSpec("fail_requests", "prefill-0", 1.0, 1.0, params=(("count", 5), ("status", 500)))
    assert _params(SearchCase(topology="1p2d", faults=(fault,)), "balance") == [
        {"roles": ["decode"], "max_skew": 0.5, "min_requests": 30}]
    assert _params(SearchCase(topology="2p1d", faults=(fault,)), "balance") == []
    assert _params(SearchCase(topology="1p2d", breaker=Breaker(2, 1.0), faults=(fault,)), "balance") == []


def test_metadata_reads_count_promotions_and_skip_faults_that_fail_reads() -> None:
    no_id = FaultSpec("no_engine_id", "prefill-0", 1.0, 4.0)
    slow = FaultSpec("latency_fault", "prefill-0", 1.2, 1.0, params=(("surface", "health"), ("ms", 3000)))
    case = SearchCase(transport="grpc", faults=(no_id, slow))
    assert _params(case, "metadata_reads") == [{"target": "prefill-0", "from_fault": "f0_no_engine_id",
                                                "max_reads": 4}]
    failing = FaultSpec("fail_server_info", "prefill-0", 1.2, 1.0)
    assert _params(SearchCase(transport="grpc", faults=(no_id, failing)), "metadata_reads") == []
    assert _params(SearchCase(connector="nixl", faults=(no_id, slow)), "metadata_reads") == []


def test_transfer_timeouts_are_excused_where_a_new_id_cannot_be_read() -> None:
    restart = FaultSpec("restart", "prefill-0", 1.0, 1.0)
    assert _params(SearchCase(faults=(restart,)), "transfer_timeout") == [{}]
    unreadable = FaultSpec("fail_server_info", "prefill-0", 2.0, 1.5)
    assert _params(SearchCase(transport="grpc", faults=(restart, unreadable)), "transfer_timeout") == []
    elsewhere = FaultSpec("fail_server_info", "prefill-1", 2.0, 1.5)
    assert _params(SearchCase(topology="2p1d", faults=(restart, elsewhere)), "transfer_timeout") == [{}]


def test_a_graceful_stop_must_drain_unless_a_stall_outlasts_its_grace() -> None:
    stall = FaultSpec("wedge", "decode-0", 1.0, 0.6, params=GENERATE)
    stop = FaultSpec("graceful_stop", "prefill-0", 1.3, 3.0)
    drains = _params(SearchCase(faults=(stall, stop)), "handoff_strict")
    assert drains == [{"excuse_kinds": ["respawn"], "grace_s": recovery_bound_s("scaled", None),
                       "excuse_in_flight": False}]
    short_grace = FaultSpec("graceful_stop", "prefill-0", 1.3, 0.6)
    assert _params(SearchCase(faults=(stall, short_grace)), "handoff_strict") == []
    # KV given up by an abort timeout is a correct failed pull.
    assert _params(SearchCase(kv_abort_s=0.3, faults=(stall, stop)), "handoff_strict") == []
    crash = FaultSpec("crash", "decode-0", 1.0, 1.0)
    assert _params(SearchCase(faults=(crash, stop)), "handoff_strict") == []


def test_without_identity_checks_the_bound_leaves_out_their_interval() -> None:
    on = SearchCase(faults=(FaultSpec("restart", "prefill-0", 1.0, 1.0),))
    off = SearchCase(faults=on.faults, identity_checks=False)
    assert recovery_bound_s("scaled", None, False) < recovery_bound_s("scaled", None, True)
    assert _params(off, "handoff")[0]["grace_s"] < _params(on, "handoff")[0]["grace_s"]


def test_a_router_with_whole_second_probes_is_judged_by_the_times_it_runs() -> None:
    """smg takes 0.3 s probes (0.5 s timeout) as 1 s ones: its recovery and detection bounds grow to
    match, and only those of a case drawn for such a router."""
    exact = SearchCase(faults=(FaultSpec("restart", "prefill-0", 1.0, 1.0),))
    rounded = SearchCase(faults=exact.faults, whole_second_probes=True)
    assert probe_times_s(exact) == (0.3, 0.5) and probe_times_s(rounded) == (1.0, 1.0)
    # (success threshold 1 + 1) x interval + 2 x timeout: 2.4 s more with whole seconds.
    assert bound_of(rounded) == pytest.approx(bound_of(exact) + 2 * 0.7 + 2 * 0.5)
    assert _params(rounded, "recovery")[0]["max_recovery_s"] == bound_of(rounded)
    assert find(search_cases(Space(whole_second_probes=True)), lambda c: True).whole_second_probes


# Each: a case where the generated expectations leave no excuse, and the switch they must catch.
CAUGHT = [
    ("no_prefill_retry", SearchCase(topology="2p1d", failure_threshold=3, load=Load(concurrency=3),
                                    faults=(FaultSpec("crash", "prefill-1", 1.0, 1.5),)), "availability"),
    ("patch_drops_kv_config", SearchCase(load=Load(concurrency=2), faults=(
        FaultSpec("patch_worker", "prefill-0", 1.0, 0.0, params=(("priority", 3),)),)), "no_local_compute"),
    ("reread_every_probe", SearchCase(transport="grpc", load=Load(concurrency=2), faults=(
        FaultSpec("no_engine_id", "prefill-0", 1.0, 4.0),
        FaultSpec("latency_fault", "prefill-0", 1.2, 1.0, params=(("surface", "health"), ("ms", 3000))))),
     "metadata_reads"),
    ("wedged_stalls_all", SearchCase(topology="1p2d", load=Load(concurrency=2), faults=(
        FaultSpec("freeze", "decode-0", 1.0, 4.0),)), "latency"),
    ("retry_failed_requests", SearchCase(connector="nixl", load=Load(concurrency=3), faults=(
        FaultSpec("link_reset", "prefill-0", 1.0, 1.5, "side_channel"),)), "legs_once"),
    ("kv_freed_while_read", SearchCase(kv_abort_s=0.3, load=Load(rate_rps=20.0), faults=(
        FaultSpec("wedge", "decode-0", 1.0, 0.8, params=GENERATE),)), "output"),
    ("reread_no_retry", SearchCase(transport="grpc", identity_checks=False, load=Load(concurrency=2), faults=(
        FaultSpec("restart", "prefill-0", 1.0, 1.0), FaultSpec("fail_server_info", "prefill-0", 2.0, 1.5))),
     "recovery"),
    ("shutdown_drops_pulls", SearchCase(topology="1p2d", load=Load(rate_rps=50.0), faults=(
        FaultSpec("graceful_stop", "prefill-0", 1.3, 2.0),)), "handoff_strict"),
    ("no_outlier_ejection", SearchCase(topology="1p2d", breaker=Breaker(2, 1.0), load=Load(concurrency=2),
                                       faults=(FaultSpec("wedge", "decode-0", 1.0, 4.0, params=GENERATE),)),
     "availability"),
    ("breaker_no_readmit", SearchCase(breaker=Breaker(2, 30.0), load=Load(concurrency=3), faults=(
        FaultSpec("crash", "prefill-0", 1.0, 1.5),)), "recovery"),
]


@pytest.mark.parametrize(("bug", "case", "checker"), CAUGHT, ids=[c[0] for c in CAUGHT])
def test_generated_expectations_catch_the_switch_and_pass_without_it(
    bug: str, case: SearchCase, checker: str
) -> None:
    with tempfile.TemporaryDirectory() as d:
        clean = run_case(case, (), Path(d) / "clean")
        broken = run_case(case, (bug,), Path(d) / "bug")
    assert clean.sound and clean.signatures == (), clean.verdicts
    assert broken.sound and checker in {s.checker for s in broken.signatures}, broken.verdicts


def _sample(n: int, s: int, space: Space) -> list[SearchCase]:
    out: list[SearchCase] = []

    @settings(database=None, max_examples=n, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(s)
    @given(search_cases(space))
    def collect(case: SearchCase) -> None:
        out.append(case)

    collect()
    return out


@pytest.mark.parametrize("bugs", [(), ("no_outlier_ejection",), ("reread_every_probe",)])
def test_the_reference_router_keeps_every_generated_expectation(bugs: tuple[str, ...]) -> None:
    """A sample of generated cases (drawn as for a search with these switches, run without them): the
    reference router fails none (a failure is the generator's or a router bug: the 5-minute search's job at
    scale)."""
    with tempfile.TemporaryDirectory() as d:
        for i, case in enumerate(_sample(8, 17, space_for(bugs))):
            out = run_case(case, (), Path(d) / str(i))
            assert out.signatures == () or not out.sound, (case, out.verdicts)
