"""The zoo's plan and matrix, from scripted results: what counts as caught, false alarms, holes per
transport."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.result import ScenarioResult
from harness.runner import Cell
from harness.scenario import Scenario
from harness.verdict import Verdict
from harness.zoo import applicable, build_matrix, zoo_plan
from harness.zoo.report import markdown, write_zoo
from pdchaos.bugs import BugSwitch

GRPC_ONLY = BugSwitch("grpc_bug", "router", "zoo-3", "ref", "symptom", transports=("grpc",))
BOTH = BugSwitch("both_bug", "router", "zoo-9", "ref", "symptom")
NIXL = BugSwitch("nixl_bug", "router", "zoo-11", "ref", "symptom", connectors=("nixl",))
SCEN = Scenario(name="s", description="", connectors=("mooncake",), transports=("http", "grpc"))


def _result(*verdicts: tuple[str, str], evidence: str = "") -> ScenarioResult:
    vs = [Verdict(n, st, f"{n} {st}", {}, [evidence] if evidence and st == "fail" else [])  # type: ignore[arg-type]
          for n, st in verdicts]
    status = "fail" if any(v.status == "fail" for v in vs) else "pass"
    return ScenarioResult(scenario="s", topology="1p1d", connector="mooncake", verdicts=vs, status=status)


def test_plan_runs_baselines_then_each_switch_only_where_it_can_occur() -> None:
    runs = zoo_plan([SCEN], [GRPC_ONLY, BOTH, NIXL], baseline_runs=3)
    baselines = [r for r in runs if r.switch is None]
    assert len(baselines) == 3 * 2 and {r.repeat for r in baselines} == {0, 1, 2}
    assert [(r.switch, r.cell.transport) for r in runs if r.switch] == [
        ("grpc_bug", "grpc"), ("both_bug", "http"), ("both_bug", "grpc"),
    ]  # nixl_bug: no nixl cell here
    assert applicable(NIXL, Cell("1p1d", "nixl", "http"))
    assert not applicable(NIXL, Cell("1p1d", "mooncake", "http"))
    with pytest.raises(ValueError):
        zoo_plan([SCEN], [BOTH], baseline_runs=0)


def test_caught_needs_a_checker_that_passed_in_every_baseline_run(tmp_path: Path) -> None:
    runs = zoo_plan([SCEN], [GRPC_ONLY, BOTH], baseline_runs=2)
    results = []
    for r in runs:
        if r.switch is None:
            # The http cell's balance checker is flaky: it failed once with no switch on.
            flaky = r.cell.transport == "http" and r.repeat == 1
            results.append(_result(("output", "pass"), ("balance", "fail" if flaky else "pass")))
        elif r.switch == "grpc_bug":
            stale = "prefill-0 minted stale id"
            results.append(_result(("output", "fail"), ("balance", "pass"), evidence=stale))
        else:
            # both_bug fails only the flaky checker on http (proves nothing) and nothing on grpc.
            balance = "fail" if r.cell.transport == "http" else "pass"
            results.append(_result(("output", "pass"), ("balance", balance)))
    m = build_matrix(runs, results, {"grpc_bug": GRPC_ONLY, "both_bug": BOTH}, "sim", "production")
    assert m.caught_by("grpc_bug") == ["s[1p1d/mooncake/grpc]"]
    grpc = m.outcomes["grpc_bug"]["s[1p1d/mooncake/grpc]"]
    assert grpc.checkers == ["output"] and grpc.evidence == "prefill-0 minted stale id"
    assert m.caught_by("both_bug") == []
    assert m.missing_transports("grpc_bug") == [] and m.missing_transports("both_bug") == ["http", "grpc"]
    assert list(m.false_alarms) == ["s[1p1d/mooncake/http]"] and not m.ok
    js, md = write_zoo(tmp_path, m)
    text = md.read_text()
    assert "**nothing**" in text and "balance (run 1)" in text
    assert '"holes"' in js.read_text()
    assert markdown(m).startswith("# Bug zoo detection matrix (sim world, production settings")


def test_one_result_per_run() -> None:
    with pytest.raises(ValueError):
        build_matrix(zoo_plan([SCEN], [BOTH]), [], {"both_bug": BOTH}, "sim", "scaled")


def test_a_baseline_that_could_not_tell_makes_nothing_caught() -> None:
    """Baselines cut short (unknown, e.g. an interrupted zoo): a failing checker with the switch on proves
    nothing where it never passed without it."""
    runs = zoo_plan([SCEN], [GRPC_ONLY], baseline_runs=1)
    results = []
    for r in runs:
        if r.switch is None:
            unknown = r.cell.transport == "grpc"
            results.append(_result(("output", "unknown" if unknown else "pass")))
        else:
            results.append(_result(("output", "fail")))
    m = build_matrix(runs, results, {"grpc_bug": GRPC_ONLY}, "sim", "scaled")
    assert m.caught_by("grpc_bug") == [] and m.missing_transports("grpc_bug") == ["grpc"] and not m.ok


def test_a_verdict_no_baseline_gave_can_catch_but_one_that_wavered_cannot() -> None:
    """`engine_conduct` appears only when fault verification found the engine misbehaving: absent from every
    baseline run, it failing with the switch on is news. A checker that was unknown in a baseline is not."""
    runs = zoo_plan([SCEN], [BOTH], baseline_runs=2)
    results = []
    for r in runs:
        if r.switch is None:
            results.append(_result(("output", "pass"), ("router", "unknown" if r.repeat else "pass")))
        else:
            results.append(_result(("output", "pass"), ("router", "fail"), ("engine_conduct", "fail"),
                                   evidence="engine side: sigterm: answered its health check healthy"))
    m = build_matrix(runs, results, {"both_bug": BOTH}, "sim", "production")
    assert sorted(m.caught_by("both_bug")) == ["s[1p1d/mooncake/grpc]", "s[1p1d/mooncake/http]"]
    assert m.outcomes["both_bug"]["s[1p1d/mooncake/http]"].checkers == ["engine_conduct"]
