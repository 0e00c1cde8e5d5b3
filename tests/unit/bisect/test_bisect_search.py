"""The release bisect's search, pure: the releases between two ends, the binary search with a judge that is
a table (which releases it asks for, the pair it names, why it names none), and a run's reduction to the
status the search compares."""

from __future__ import annotations

from typing import Any

import pytest

from harness.bisect.release_run import combine_runs, run_summary
from harness.bisect.report import render_text, to_json
from harness.bisect.search import BisectResult, Outcome, bisect_releases, max_runs, release_chain
from harness.result import ScenarioResult
from harness.verdict import Verdict

INDEX = ["1.13.0", "1.12.0", "1.11.0", "1.10.1", "1.10.0", "1.9.0", "1.2.0", "1.10.2"]


def test_chain_between_the_ends_in_their_direction() -> None:
    assert release_chain(INDEX, "1.13.0", "1.10.1") == ["1.13.0", "1.12.0", "1.11.0", "1.10.2", "1.10.1"]
    assert release_chain(INDEX, "1.10.1", "1.11.0") == ["1.10.1", "1.10.2", "1.11.0"]
    # 1.9.0 sorts before 1.10.0 (numbers, not text).
    assert release_chain(INDEX, "1.9.0", "1.10.0") == ["1.9.0", "1.10.0"]


@pytest.mark.parametrize(("good", "bad", "match"), [
    ("1.13.0", "1.13.0", "same release"),
    ("1.14.0", "1.10.1", "1.14.0 is not on the list"),
    ("1.13.0", "0.9.0", "0.9.0 is not on the list"),
])
def test_chain_refuses_bad_ends(good: str, bad: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        release_chain(INDEX, good, bad)


class Table:
    """A judge from a table of statuses; records the releases asked for."""

    def __init__(self, statuses: dict[str, str]) -> None:
        self.statuses = statuses
        self.asked: list[str] = []

    async def __call__(self, version: str) -> Outcome:
        self.asked.append(version)
        st = self.statuses[version]
        return Outcome(version, st, "" if st == "pass" else f"{st} at {version}")


CHAIN = [f"1.{i}.0" for i in range(13, 0, -1)]  # good end 1.13.0 ... bad end 1.1.0


@pytest.mark.parametrize("first_bad", range(1, len(CHAIN)))
async def test_finds_the_adjacent_pair_wherever_it_is(first_bad: int) -> None:
    table = Table({v: ("pass" if i < first_bad else "fail") for i, v in enumerate(CHAIN)})
    res = await bisect_releases(CHAIN, table)
    assert res.found and res.pair is not None
    assert (res.pair[0].version, res.pair[1].version) == (CHAIN[first_bad - 1], CHAIN[first_bad])
    assert (res.pair[0].status, res.pair[1].status) == ("pass", "fail")
    assert len(table.asked) == len(set(table.asked)) <= max_runs(len(CHAIN))
    assert table.asked[:2] == [CHAIN[0], CHAIN[-1]]


async def test_good_may_be_the_failing_end() -> None:
    # The good end is only where the search starts: here it fails and the bad end passes (a fix).
    chain = ["1.10.1", "1.11.0", "1.12.0", "1.13.0"]
    res = await bisect_releases(chain, Table({"1.10.1": "fail", "1.11.0": "fail", "1.12.0": "pass",
                                              "1.13.0": "pass"}))
    assert res.pair is not None and [o.version for o in res.pair] == ["1.11.0", "1.12.0"]


async def test_two_releases_need_no_middle() -> None:
    table = Table({"1.2.0": "pass", "1.1.0": "fail"})
    res = await bisect_releases(["1.2.0", "1.1.0"], table)
    assert res.pair is not None and table.asked == ["1.2.0", "1.1.0"]


async def test_same_verdict_at_both_ends_names_no_pair() -> None:
    table = Table(dict.fromkeys(CHAIN, "fail"))
    res = await bisect_releases(CHAIN, table)
    assert not res.found and "same" in res.reason and "fail" in res.reason
    assert table.asked == [CHAIN[0], CHAIN[-1]]  # nothing between is run


@pytest.mark.parametrize("end", [0, -1])
async def test_an_unknown_end_stops_at_once(end: int) -> None:
    statuses = {v: ("pass" if i < 5 else "fail") for i, v in enumerate(CHAIN)}
    statuses[CHAIN[end]] = "unknown"
    res = await bisect_releases(CHAIN, Table(statuses))
    assert not res.found and "gave no verdict" in res.reason and CHAIN[end] in res.reason


async def test_an_unknown_middle_stops_and_says_where_the_change_lies() -> None:
    statuses = {v: ("pass" if i < 9 else "fail") for i, v in enumerate(CHAIN)}
    statuses[CHAIN[6]] = "unknown"  # the first midpoint of 0..12
    res = await bisect_releases(CHAIN, Table(statuses))
    assert not res.found and res.narrowed == (CHAIN[0], CHAIN[-1])
    assert f"{CHAIN[6]} gave no verdict: unknown at {CHAIN[6]}" == res.reason


async def test_fewer_than_two_releases() -> None:
    res = await bisect_releases(["1.0.0"], Table({"1.0.0": "pass"}))
    assert not res.found and "fewer than two" in res.reason


@pytest.mark.parametrize(("n", "runs"), [(0, 0), (1, 0), (2, 2), (3, 3), (4, 4), (5, 4), (9, 5), (13, 6)])
def test_max_runs(n: int, runs: int) -> None:
    assert max_runs(n) == runs


def _result(verdicts: list[Verdict], run_reason: str = "done") -> ScenarioResult:
    return ScenarioResult(scenario="s", topology="1p1d", connector="mooncake", transport="grpc",
                          router="smg-1.12.0", verdicts=verdicts, run_reason=run_reason)


def test_run_summary_whole_verdict_and_one_checker() -> None:
    res = _result([Verdict.ok("nothing_lost"),
                   Verdict.fail("handoff", "12 stale handoffs", evidence=["req 4: remote id e1 != e2"] * 5)])
    whole = run_summary(res, None)
    assert whole["status"] == "fail"
    assert whole["not_passed"] == [{"checker": "handoff", "status": "fail", "reason": "12 stale handoffs",
                                    "evidence": ["req 4: remote id e1 != e2"] * 3}]
    assert run_summary(res, "nothing_lost")["status"] == "pass"
    missing = run_summary(res, "recovery")
    assert missing["status"] == "unknown" and "no verdict from checker recovery" in missing["reason"]


def test_a_broken_run_is_unknown_whatever_its_checkers_said() -> None:
    s = run_summary(_result([Verdict.ok("nothing_lost")], run_reason="error: RouterFailed"), "nothing_lost")
    assert s["status"] == "unknown" and "did not finish" in s["reason"]


def _run(status: str, reason: str = "") -> dict[str, Any]:
    return {"status": status, "reason": reason, "not_passed": []}


def test_combine_runs() -> None:
    assert combine_runs("1.0.0", [_run("pass"), _run("pass")]).status == "pass"
    assert combine_runs("1.0.0", [_run("fail", "x"), _run("fail", "y")]).reason == "x"
    flaky = combine_runs("1.0.0", [_run("pass"), _run("fail", "x")])
    assert flaky.status == "unknown" and flaky.reason == "flaky: the runs disagree (fail 1, pass 1)"
    assert combine_runs("1.0.0", [_run("pass"), _run("unknown", "broke")]).reason == "broke"
    assert combine_runs("1.0.0", []).status == "unknown"


async def test_report_names_the_pair_and_both_runs_evidence() -> None:
    def outcome(v: str, st: str) -> Outcome:
        failed = [{"checker": "handoff", "status": "fail", "reason": "stale id", "evidence": ["req 7"]}]
        run = {"status": st, "router": f"smg-{v}", "cell_dir": f"/x/{v}",
               "not_passed": [] if st == "pass" else failed}
        return Outcome(v, st, "" if st == "pass" else "stale id", {"runs": [run]})

    async def judge(v: str) -> Outcome:
        return outcome(v, "pass" if v in ("1.13.0", "1.12.0") else "fail")

    res = await bisect_releases(["1.13.0", "1.12.0", "1.11.0", "1.10.1"], judge)
    meta = {"scenario": "s", "cell": "1p1d-mooncake-grpc", "router": "smg", "judged_by": "the verdict"}
    text = render_text(res, meta)
    assert "changes between 1.12.0 (pass) and 1.11.0 (fail)" in text
    assert "run smg-1.12.0: PASS" in text and "handoff fail: stale id" in text and "- req 7" in text
    doc = to_json(res, meta)
    assert doc["found"] is True and [p["version"] for p in doc["pair"]] == ["1.12.0", "1.11.0"]


async def test_same_verdict_at_the_ends_names_the_checkers_that_differ() -> None:
    def outcome(v: str, failing: list[str]) -> Outcome:
        np = [{"checker": c, "status": "fail", "reason": "r", "evidence": []} for c in failing]
        run = {"status": "fail", "router": f"smg-{v}", "cell_dir": "/x", "not_passed": np}
        return Outcome(v, "fail", "r", {"runs": [run]})

    table = {"1.13.0": ["reported_engine_id"], "1.12.0": ["recovery"],
             "1.10.1": ["reported_engine_id", "handoff", "recovery"]}

    async def judge(v: str) -> Outcome:
        return outcome(v, table[v])

    res = await bisect_releases(["1.13.0", "1.12.0", "1.10.1"], judge)
    meta = {"scenario": "s", "cell": "c", "router": "smg", "judged_by": "the verdict"}
    assert not res.found
    assert to_json(res, meta)["differing_checkers"] == ["handoff", "recovery"]
    text = render_text(res, meta)
    assert "differ between the ends: handoff, recovery (bisect one with --checker NAME)" in text


async def test_an_interrupted_search_leaves_what_it_judged_in_the_result_it_was_given() -> None:
    """Ctrl-C mid-search: the caller's result holds every release judged before it (`pdchaos bisect` writes
    them as the partial bisect.json)."""
    table = Table({v: ("pass" if i < 5 else "fail") for i, v in enumerate(CHAIN)})

    async def then_ctrl_c(version: str) -> Outcome:
        if len(table.asked) == 3:
            raise KeyboardInterrupt
        return await table(version)

    res = BisectResult(CHAIN, [])
    with pytest.raises(KeyboardInterrupt):
        await bisect_releases(CHAIN, then_ctrl_c, res)
    assert [o.version for o in res.tested] == table.asked and len(res.tested) == 3
