"""The search in real time, its pure parts: which world a router is searched in and the flags refused there,
which cases the real world can carry out for a router, when a failure counts (twice on the router under
test, and the reference router passes), and the bug report written from a run's facts.

Runs here are simulated (the same checkers and history as real time, in milliseconds), or, for the rule
that decides when a failure counts, a world replaced by a script of outcomes: only a script fails once and
then passes on demand. The search in real time itself is tests/integration/cli/test_search_cli_real.py."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import cli
from harness.findings.group import search_signature_as_finding
from harness.routers.gateways.adapters import VllmRouter
from harness.routers.reference import ReferenceRouter
from harness.runner import run_scenario
from harness.search import realtime
from harness.search.case import SearchCase, bound_of
from harness.search.cli import UsageError, search_world
from harness.search.execute import RunOutcome, scenario_of
from harness.search.facts import client_view, run_facts
from harness.search.faults import API_KINDS, FaultSpec
from harness.search.found import write_found
from harness.search.realtime import ONCE, REFERENCE, RealCounts, RealJudge, real_problem, real_space
from harness.search.report import Finding, render_report
from harness.search.seedrun import SeedJob, search_seed
from harness.search.signature import Signature
from harness.search.strategies import Space
from harness.search.summary import Summary

SIG = Signature("recovery", "no correct handoff through <engine> within #s of heal")
OTHER = Signature("nothing_lost", "# of # request lost")
RESTART = SearchCase(topology="1p1d", faults=(FaultSpec("restart", "prefill-0", 0.5, 0.0),))


# ---------------------------------------------------------------- the world and the flags


@pytest.mark.parametrize(("router", "world", "expected"), [
    ("reference", None, "sim"),
    ("profile:smg-1.13.0", None, "sim"),
    ("smg==1.13.0", None, "real"),
    ("vllm-router", None, "real"),
    ("cmd:my-router --port {port}", None, "real"),
    ("reference", "real", "real"),
    ("reference", "sim", "sim"),
])
def test_the_world_a_router_is_searched_in(router: str, world: str | None, expected: str) -> None:
    assert search_world(router, world) == expected


@pytest.mark.parametrize(("router", "world", "needle"), [
    ("profile:smg-1.13.0", "real", "search the release itself in real time"),
    ("smg==1.13.0", "sim", "the simulated world runs the reference router only"),
    ("cmd:my-router", "sim", "--world real"),
])
def test_a_router_in_the_wrong_world_is_refused(router: str, world: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        search_world(router, world)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = cli.main(["search", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--router", "profile:smg-1.13.0", "--world", "real"], "is a model of its release for simulated time"),
    (["--router", "smg==1.13.0", "--world", "sim"], "runs the reference router only"),
    (["--world", "real", "--settings", "production"], "real time runs a case at scaled settings only"),
    (["--world", "real", "--settings", "any"], "real time runs a case at scaled settings only"),
    (["--world", "real", "--shifts", "0.1"], "--shifts is for simulated time"),
    (["--world", "real", "--shifts", "none"], "--shifts is for simulated time"),
    (["--world", "real", "--ray", "local"], "--ray is for simulated time"),
    (["--world", "bent"], "invalid choice"),
    (["--router", "cmd:/no/such/router --port {port}"], "not found or not executable"),
    (["--router", "cmd:/bin/true {port}", "--inject-bug", "stale_engine_id"], "a reference-router switch"),
    (["--router", "no-such-router"], "unknown router 'no-such-router'"),
])
def test_bad_real_time_arguments_exit_3_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                      needle: str) -> None:
    code, err = _main(capsys, *argv)
    assert code == 3 and needle in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def _options(tmp_path: Path, *argv: str) -> object:
    from harness.search.cli import _options, build_parser

    return _options(build_parser().parse_args([*argv, "--out", str(tmp_path / "s")]))


def test_real_time_runs_one_seed_at_a_time_and_no_shifts(tmp_path: Path) -> None:
    from harness.search.driver import SearchOptions, _job

    opts = _options(tmp_path, "--world", "real", "--inject-bug", "stale_engine_id")
    assert isinstance(opts, SearchOptions)
    assert opts.world == "real" and opts.jobs == 1 and opts.router == "reference"
    job = _job(opts, 0, 0.0)
    assert job.world == "real" and job.shifts == ()
    # An engine switch goes with any router; a cmd: router is searched in real time.
    cmd = _options(tmp_path, "--router", "cmd:/bin/true {port}", "--inject-bug", "shutdown_drops_pulls",
                   "--jobs", "2")
    assert isinstance(cmd, SearchOptions) and cmd.world == "real" and cmd.jobs == 2
    assert cmd.router == "cmd:/bin/true {port}"
    sim = _options(tmp_path, "--inject-bug", "stale_engine_id")
    assert isinstance(sim, SearchOptions) and sim.world == "sim" and _job(sim, 0, 0.0).shifts


# ---------------------------------------------------------------- what the real world can carry out


def test_a_case_the_real_worlds_proxy_cannot_follow_is_not_run() -> None:
    cut = FaultSpec("partition_down", "prefill-0", 1.0, 1.0, "side_channel")
    case = SearchCase(faults=(cut, FaultSpec("restart", "prefill-0", 1.5, 0.5)))
    assert "side-channel port" in str(real_problem(case, (), ReferenceRouter()))
    assert real_problem(RESTART, ("stale_engine_id",), ReferenceRouter()) is None


def test_a_gateway_runs_only_what_it_serves() -> None:
    vllm = VllmRouter("/nonexistent/vllm-router", version="0.1.17", flags=frozenset({"--kv-connector"}))
    grpc = SearchCase(transport="grpc", faults=RESTART.faults)
    assert "another gRPC service" in str(real_problem(grpc, (), vllm))
    patch = SearchCase(faults=(FaultSpec("patch_worker", "prefill-0", 1.0, 0.0),))
    assert "no worker API" in str(real_problem(patch, (), vllm))
    assert real_problem(RESTART, (), vllm) is None
    assert "into the reference router" in str(real_problem(RESTART, ("stale_engine_id",), vllm))
    space = real_space(Space(), vllm)
    assert space.transports == ("http",) and not set(API_KINDS) & set(space.kinds)
    assert space.whole_second_probes  # a gateway's probe flags take whole seconds
    assert real_space(Space(), ReferenceRouter()) == Space()


# ---------------------------------------------------------------- when a failure counts


class Script:
    """A world whose runs fail as told: `fails(under_test, case, nth)`, where the router under test is the
    reference router with the router switch on and the reference check runs it off, and `nth` counts the
    earlier runs of that case on that side."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fails: Callable[[bool, SearchCase, int],
                 list[Signature]]) -> None:
        self.fails = fails
        self.ran: list[tuple[tuple[str, ...], SearchCase]] = []
        monkeypatch.setattr(realtime, "run_case", self.run)

    def run(self, case: SearchCase, bugs: tuple[str, ...], out_dir: Path, router: str = "reference",
            world: str = "sim") -> RunOutcome:
        assert world == "real" and router == "reference"
        out_dir.mkdir(parents=True, exist_ok=True)
        under_test = "stale_engine_id" in bugs
        nth = sum(1 for b, c in self.ran if ("stale_engine_id" in b) == under_test and c == case)
        self.ran.append((bugs, case))
        return RunOutcome(signatures=tuple(self.fails(under_test, case, nth)), sound=True, verdicts=(),
                          requests=10)

    def first(self, case: SearchCase, bugs: tuple[str, ...], tmp_path: Path) -> RunOutcome:
        """The run that meets the case (the seed's, before the judge is asked)."""
        return self.run(case, bugs, tmp_path, world="real")


def _judge(tmp_path: Path, bugs: tuple[str, ...] = ("stale_engine_id",)) -> RealJudge:
    return RealJudge(bugs, "reference", tmp_path, RealCounts())


def test_twice_on_the_router_and_a_pass_on_the_reference_counts(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    world = Script(monkeypatch, lambda under_test, case, nth: [SIG] if under_test else [])
    judge = _judge(tmp_path, ("stale_engine_id", "shutdown_drops_pulls"))
    first = world.first(RESTART, judge.bugs, tmp_path)
    found = judge.judge(RESTART, first, None)
    assert found is not None and found.signature == SIG and found.reference.passed
    assert judge.counts.replay_runs == 1 and judge.counts.reference_runs == 1 and not judge.counts.set_aside
    # The reference router runs the same engines: engine switches kept, router switches off.
    assert [bugs for bugs, _ in world.ran] == [("stale_engine_id", "shutdown_drops_pulls")] * 2 + [
        ("shutdown_drops_pulls",)]
    # Judged once: asked again (Hypothesis replays the case it shrank to), nothing runs.
    assert judge.judge(RESTART, first, SIG) is found and len(world.ran) == 3
    assert found.replay.facts is None  # a scripted run keeps no facts; its folder is kept all the same
    assert (tmp_path / "confirmed-0").is_dir() and (tmp_path / "confirmed-0-reference").is_dir()


def test_a_failure_that_does_not_replay_is_set_aside(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    world = Script(monkeypatch, lambda under_test, case, nth: [SIG] if nth == 0 else [])
    judge = _judge(tmp_path)
    assert judge.judge(RESTART, world.first(RESTART, judge.bugs, tmp_path), None) is None
    (aside,) = judge.counts.set_aside
    assert aside.why == ONCE and aside.signature == SIG.text and "replay passed" in aside.detail
    assert judge.counts.reference_runs == 0


def test_a_failure_the_reference_router_shares_is_set_aside(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    world = Script(monkeypatch, lambda under_test, case, nth: [SIG, OTHER] if under_test or nth == 0 else [])
    judge = _judge(tmp_path)
    assert judge.judge(RESTART, world.first(RESTART, judge.bugs, tmp_path), None) is None
    (aside,) = judge.counts.set_aside
    assert aside.why == REFERENCE and judge.counts.reference_runs == 1


def test_the_same_signature_must_come_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Failing twice, but another checker the second time, is not failing the same way twice."""
    world = Script(monkeypatch, lambda under_test, case, nth: [SIG] if nth == 0 else [OTHER])
    judge = _judge(tmp_path)
    assert judge.judge(RESTART, world.first(RESTART, judge.bugs, tmp_path), None) is None
    assert judge.counts.set_aside[0].why == ONCE and "failed otherwise" in judge.counts.set_aside[0].detail


def test_a_failure_the_known_run_shows_is_passed_by_without_a_replay(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """--skip-known: a case failing only as the known run shows is no failure (counted, not replayed); one
    failing a new way too counts with the new signature."""
    known = frozenset({search_signature_as_finding(SIG.checker, SIG.reason)})
    world = Script(monkeypatch, lambda under_test, case, nth: [SIG] if under_test else [])
    judge = RealJudge(("stale_engine_id",), "reference", tmp_path, RealCounts(), known)
    assert judge.judge(RESTART, world.first(RESTART, judge.bugs, tmp_path), None) is None
    assert judge.counts.known_passed == 1 and judge.counts.replay_runs == 0 and len(world.ran) == 1
    world = Script(monkeypatch, lambda under_test, case, nth: [SIG, OTHER] if under_test else [])
    judge = RealJudge(("stale_engine_id",), "reference", tmp_path / "b", RealCounts(), known)
    found = judge.judge(RESTART, world.first(RESTART, judge.bugs, tmp_path / "b"), None)
    assert found is not None and found.signature == OTHER and judge.counts.known_passed == 0


def test_a_seed_in_real_time_finds_confirms_and_shrinks(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """The reference router (no switch) passes everything; the router under test fails any case with a
    fault, except that every first run of a case with three or more faults passes (noise the rule must not
    be fooled by either way)."""
    def fails(under_test: bool, case: SearchCase, nth: int) -> list[Signature]:
        return [SIG] if under_test and case.faults and not (len(case.faults) >= 3 and nth == 0) else []

    world = Script(monkeypatch, fails)
    res = search_seed(SeedJob(seed=1, bugs=("stale_engine_id",), work_dir=tmp_path, max_examples=20,
                              world="real", shifts=()))
    assert res.found is not None and res.found.signature == SIG
    assert len(res.found.shrunk.faults) == 1 and res.found.reference is not None
    # Every run is accounted for, and each case ran at most once on the router under test apart from its
    # replay.
    assert len(world.ran) == res.runs + res.real.replay_runs + res.real.reference_runs
    under_test = [c for bugs, c in world.ran if bugs]
    assert all(under_test.count(c) <= 2 for c in under_test)
    assert res.real.reference_runs >= 1 and res.shift_runs == 0


# ---------------------------------------------------------------- the facts and the bug report


def _sim_run(case: SearchCase, bugs: tuple[str, ...], out: Path) -> RunOutcome:
    """The case run in simulated time, its outcome with the facts a real run keeps."""
    from harness.search.signature import run_is_sound, signatures

    result = asyncio.run(run_scenario(scenario_of(case, bugs), case.topology, case.connector, case.transport,
                                      "reference", out, seed=case.run_seed, world="sim", settings="scaled"))
    verdicts = list(result.verdicts)
    return RunOutcome(tuple(signatures(verdicts)), run_is_sound(verdicts),
                      tuple((v.name, v.status, v.reason) for v in verdicts), 0,
                      run_facts(verdicts, result.history_path, out))


def test_the_client_view_counts_what_the_client_saw(tmp_path: Path) -> None:
    from harness.history import load_history

    bad = _sim_run(RESTART, ("stale_engine_id",), tmp_path / "bad")
    assert bad.facts is not None
    c = bad.facts.client
    history = load_history(Path(bad.facts.run_dir) / "history.jsonl")
    assert c.requests == len(history.request_list()) and c.requests == c.succeeded + c.failed
    assert c.failed > 0 and c.failed_after_heal > 0 and c.last_heal_t is not None
    # The bug keeps requests failing past the recovery bound; a correct router fails some only within it.
    assert c.last_failure_after_heal_s is not None and c.last_failure_after_heal_s > bound_of(RESTART)
    clean = _sim_run(RESTART, (), tmp_path / "good")
    assert clean.passed and clean.facts is not None
    done = clean.facts.client.last_failure_after_heal_s
    assert done is None or done <= bound_of(RESTART)
    assert client_view(load_history(tmp_path / "good" / "history.jsonl")) == clean.facts.client


def test_the_bug_report_says_router_case_symptom_evidence_reference_and_replay(tmp_path: Path) -> None:
    bad = _sim_run(RESTART, ("stale_engine_id",), tmp_path / "bad")
    ref = _sim_run(RESTART, (), tmp_path / "ref")
    sig = bad.signatures[0]
    path = write_found(tmp_path, sig, 0, ("stale_engine_id",), RESTART, RESTART, "x", (), "reference", "real")
    text = render_report(Finding(sig, 0, "reference", ("stale_engine_id",), RESTART, RESTART, bad, ref, path),
                         [])
    for heading in ("## Router", "## The case", "## What a user sees", "## Evidence",
                    "## What the reference router does", "## Confirmed", "## Replay"):
        assert heading in text
    assert "bug switches on: stale_engine_id" in text and "`restart@prefill-0[0.5+0]`" in text
    assert bad.facts is not None
    c = bad.facts.client
    assert f"Of {c.requests} requests, {c.succeeded} succeeded and {c.failed} failed" in text
    reason = next(r for n, s, r in bad.verdicts if n == sig.checker and s == "fail")
    assert f"The `{sig.checker}` check: {reason}." in text
    assert "passed every check" in text
    replay = shlex.split(text.split("```\n")[1].splitlines()[0])
    assert replay[:3] == ["pdchaos", "run", str(path.resolve())]
    assert replay[replay.index("--world") + 1] == "real"
    assert replay[replay.index("--settings") + 1] == "scaled"
    assert "--router" not in replay


def test_a_gateway_finding_replays_on_that_release_in_real_time_only(tmp_path: Path) -> None:
    case = SearchCase(topology="1p1d", faults=(FaultSpec("crash", "prefill-0", 1.0, 1.0),), run_seed=4)
    path = write_found(tmp_path, OTHER, 2, (), case, case, "3 lost", (), "smg==1.13.0", "real")
    lines = [shlex.split(ln) for ln in path.read_text().splitlines() if ln.strip().startswith("pdchaos run")]
    (real,) = lines  # the simulated world cannot run the release
    assert real[real.index("--router") + 1] == "smg==1.13.0" and real[real.index("--world") + 1] == "real"
    assert real[real.index("--seed") + 1] == "4"
    text = render_report(Finding(OTHER, 2, "smg==1.13.0", (), case, case,
                                 RunOutcome((OTHER,), True, (), 3), None, path),
                         ["health interval 0.3 s -> 1 s (whole seconds, at least 1)"])
    assert "Router: `smg==1.13.0`" in text and "Taken approximately: health interval 0.3 s -> 1 s" in text
    assert "--router smg==1.13.0" in text


def test_the_summary_separates_findings_from_what_was_set_aside() -> None:
    s = Summary(["stale_engine_id"], "reference", "scaled", 60.0, 1, world="real", runs=5, replay_runs=3,
                reference_runs=2, wall_s=10.0, set_aside=[
                    {"seed": 0, **realtime.SetAside(SIG.text, ONCE, "its replay passed").as_dict()},
                    {"seed": 1, **realtime.SetAside(OTHER.text, REFERENCE, "it failed x").as_dict()}])
    d = s.as_dict()
    assert d["world"] == "real" and d["runs_per_s"] == 1.0 and d["failures_found"] == 0
    assert d["set_aside"]["failed_once_only"] == 1 and d["set_aside"]["reference_also_fails"] == 1
    text = s.text()
    assert "world real" in text and "1 failed once only, 1 the reference router also fails" in text
    assert "5 + 3 replays + 2 on the reference router" in text
    sim = Summary([], "reference", "scaled", 60.0, 1).as_dict()
    assert sim["world"] == "sim" and "set_aside" not in sim



def test_the_summary_tells_new_findings_from_what_the_known_run_shows() -> None:
    from harness.search.summary import FoundEntry

    size = {"faults": 1, "engines": 2, "duration_s": 3.0}
    known = FoundEntry(0, SIG.text, "found/a.py", 1.0, size, size, 2, shown_by=["x[1p1d/mooncake/http]"])
    new = FoundEntry(1, OTHER.text, "found/b.py", 2.0, size, size, 2, shown_by=[])
    s = Summary([], "smg==1.13.0", "scaled", 60.0, 1, world="real", found=[known, new],
                known_from="runs/suite")
    assert s.as_dict()["new_signatures"] == [OTHER.text]
    text = s.text()
    assert "new: 1 distinct signature(s); already shown by runs/suite: 1" in text
    assert "known: runs/suite shows it in 1 cell(s): x[1p1d/mooncake/http]" in text
    assert "new: no cell of runs/suite shows it" in text
    # Without --known a gateway's summary says it did not compare.
    plain = Summary([], "smg==1.13.0", "scaled", 60.0, 1, world="real", found=[known]).text()
    assert "not compared with what the shipped scenarios show" in plain
