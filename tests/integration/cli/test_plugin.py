"""The pdchaos pytest plugin: opt-in scenario collection (ids, filters, errors), scenario verdicts as
test outcomes with --junitxml, and the pd_cluster fixture (a live topology, teardown guaranteed)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

# numpy refuses a second import in one process, and pytester's in-process runs drop the modules they imported:
# load it here so every in-process run finds it already loaded.
import numpy  # noqa: F401
import pytest
from helpers.paths import SCENARIO_FILES

from harness.pd_cluster import PDCluster
from harness.worlds.real.processes import pid_alive

SCENARIO_FILE = '''
from harness.scenario import Scenario

def _s(name, tags=(), topologies=("1p1d", "1p2d"), connectors=("mooncake",)):
    return Scenario(name=name, description=name, tags=tags, topologies=topologies, connectors=connectors,
                    transports=("http", "grpc"))

SCENARIOS = [_s("alpha", tags=("default",)), _s("beta", topologies=("2p1d",), connectors=("nixl",))]
'''


INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


@pytest.fixture(autouse=True)
def _quiet_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)


@pytest.fixture
def scen_dir(pytester: pytest.Pytester) -> Path:
    d = pytester.mkdir("scenarios")
    (d / "mine.py").write_text(SCENARIO_FILE)
    (d / "_helpers.py").write_text("raise RuntimeError('helpers are not scenario files')\n")
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    return d


def _ids(result: pytest.RunResult) -> list[str]:
    return sorted(ln.strip() for ln in result.outlines if "::" in ln)


def test_scenarios_not_collected_without_the_option(pytester: pytest.Pytester, scen_dir: Path) -> None:
    result = pytester.runpytest("--collect-only", "-q", "scenarios", "test_plain.py")
    assert _ids(result) == ["test_plain.py::test_plain"]


def test_folder_collects_default_scenarios_per_cell(pytester: pytest.Pytester, scen_dir: Path) -> None:
    result = pytester.runpytest("--pdchaos", "--collect-only", "-q", "scenarios")
    assert _ids(result) == [
        f"scenarios/mine.py::alpha[{t}-mooncake-{tr}]" for t in ("1p1d", "1p2d") for tr in ("grpc", "http")
    ]
    result = pytester.runpytest("--pdchaos", "--pdchaos-all", "--collect-only", "-q", "scenarios",
                                "--pdchaos-transport", "grpc")
    assert _ids(result) == [
        "scenarios/mine.py::alpha[1p1d-mooncake-grpc]",
        "scenarios/mine.py::alpha[1p2d-mooncake-grpc]",
        "scenarios/mine.py::beta[2p1d-nixl-grpc]",
    ]
    # Scenario tags are registered markers: -m selects by tag, even under --strict-markers.
    result = pytester.runpytest("--pdchaos", "--pdchaos-all", "--collect-only", "-q", "scenarios",
                                "--strict-markers", "-m", "not default")
    assert [i.split("[")[0] for i in _ids(result)] == ["scenarios/mine.py::beta"] * 2


def test_explicit_file_collects_all_and_filters_apply(pytester: pytest.Pytester, scen_dir: Path) -> None:
    result = pytester.runpytest("--pdchaos", "--collect-only", "-q", "scenarios/mine.py", "-k", "beta",
                                "--pdchaos-topology", "2p1d,1p1d", "--pdchaos-transport", "http")
    assert _ids(result) == ["scenarios/mine.py::beta[2p1d-nixl-http]"]
    result = pytester.runpytest("--pdchaos", "--collect-only", "-q", "scenarios/mine.py",
                                "--pdchaos-topology", "9z")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*bad topology '9z'*"])


def test_bad_scenario_file_is_a_collection_error(pytester: pytest.Pytester, scen_dir: Path) -> None:
    (scen_dir / "broken.py").write_text("SCENARIOS = 'nope'\n")
    result = pytester.runpytest("--pdchaos", "--collect-only", "-q", "scenarios")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*SCENARIOS must be a list of Scenario, got str*"])
    (scen_dir / "broken.py").write_text(
        "from harness.scenario import Expect, Scenario\n"
        "SCENARIOS = [Scenario(name='x', description='x', expect=(Expect('no_such_checker'),))]\n"
    )
    result = pytester.runpytest("--pdchaos", "--collect-only", "-q", "scenarios")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*scenario 'x': expect?0?: unknown checker 'no_such_checker'*"])


def test_bad_router_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--pdchaos", "--pdchaos-router", "nginx", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--pdchaos-router: unknown router 'nginx'*"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--pdchaos-router", "cmd:/nonexistent/router --port {port}"],
         "*--pdchaos-router: router command '/nonexistent/router' not found or not executable*"),
        (["--pdchaos-router", "cmd:true --port {port}", "--pdchaos-world", "sim"],
         "*--pdchaos-router: *reference router*"),
    ],
)
def test_a_router_that_cannot_run_is_a_usage_error_before_any_cell(
    pytester: pytest.Pytester, args: list[str], needle: str
) -> None:
    """Not one failed test per cell, each saying the same."""
    result = pytester.runpytest("--pdchaos", *args, "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([needle])


def test_an_out_folder_holding_an_earlier_run_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """As `pdchaos run --out`: the two runs would mix in one report."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text("{}")
    result = pytester.runpytest("--pdchaos", "--pdchaos-out", str(tmp_path / "old"), "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*already exists and is not empty*"])


def test_repeating_a_simulated_run_is_a_usage_error_before_any_cell(pytester: pytest.Pytester) -> None:
    """A simulated run replays exactly: `--pdchaos-repeat` with it is refused at start, not per cell."""
    result = pytester.runpytest("--pdchaos", "--pdchaos-world", "sim", "--pdchaos-repeat", "3",
                                "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--pdchaos-repeat: a simulated run replays exactly*"])


def test_bare_option_collects_the_shipped_default_suite(pytester: pytest.Pytester) -> None:
    from harness.runner import expand_matrix
    from harness.scenario import load_scenarios
    from harness.suite import default_suite

    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    pytester.makeini(INI + "testpaths = .\n")
    result = pytester.runpytest("--pdchaos", "--collect-only", "-q")
    ids = _ids(result)
    want = expand_matrix(default_suite(load_scenarios(), "real"))
    assert len(ids) == len(want) > 0
    assert not any("test_plain" in i for i in ids)
    assert {i.split("::")[1].split("[")[0] for i in ids} == {s.name for s, _ in want}


UNKNOWN_SCENARIO = """
from dataclasses import replace
from cli_scenario_pass import SCENARIOS as P
from harness.scenario import Heal, Step, WorkerStatus

# A step whose condition never holds is missed: the harness cannot tell, the verdict is unknown.
never = Step("never", Heal("decode-0"), WorkerStatus("decode-0", "draining"), deadline_s=0.3)
SCENARIOS = [replace(P[0], name="quick_unknown", timeline=(never,))]
"""


def test_verdicts_become_outcomes_with_junit(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Real runs: the passing scenario passes, the failing one fails with the checker's reason, the unknown
    one is skipped (as asked); the junit file carries the verdicts and the run folder gets the reports."""
    for name in ("cli_scenario_pass.py", "cli_scenario_fail.py"):
        shutil.copy(SCENARIO_FILES / name, pytester.path / name)
    pytester.makepyfile(unknown_scenario=UNKNOWN_SCENARIO)
    pytester.syspathinsert()
    out = tmp_path / "pdchaos-out"
    result = pytester.runpytest("--pdchaos", "cli_scenario_pass.py", "cli_scenario_fail.py",
                                "unknown_scenario.py", "--pdchaos-unknown=skip", "-rs",
                                "--junitxml=junit.xml", f"--pdchaos-out={out}")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*UNKNOWN: quick_unknown 1p1d-mooncake-http*"])
    result.stdout.fnmatch_lines([
        "*FAIL: quick_fail 1p1d-mooncake-http*",
        "*fail     availability: break during: 0.000 < 0.9*",
        "pdchaos: 3 cells: 1 pass, 1 fail, 1 unknown; reports in*",
    ])
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    assert set(cases) == {f"quick_{v}[1p1d-mooncake-http]" for v in ("pass", "fail", "unknown")}
    props = {c: {p.get("name"): p.get("value") for p in case.iter("property")} for c, case in cases.items()}
    assert props["quick_pass[1p1d-mooncake-http]"]["pdchaos_status"] == "pass"
    assert props["quick_fail[1p1d-mooncake-http]"]["pdchaos_status"] == "fail"
    assert cases["quick_fail[1p1d-mooncake-http]"].find("failure") is not None
    report = json.loads((out / "report.json").read_text())
    assert sorted(r["status"] for r in report["results"]) == ["fail", "pass", "unknown"]



def test_a_repeated_cell_is_one_test_over_its_runs(pytester: pytest.Pytester, tmp_path: Path) -> None:
    shutil.copy(SCENARIO_FILES / "cli_scenario_pass.py", pytester.path / "cli_scenario_pass.py")
    pytester.syspathinsert()
    out = tmp_path / "pdchaos-out"
    result = pytester.runpytest("--pdchaos", "cli_scenario_pass.py", "--pdchaos-repeat", "2",
                                f"--pdchaos-out={out}")
    result.assert_outcomes(passed=1)
    (res,) = json.loads((out / "report.json").read_text())["results"]
    assert [r["status"] for r in res["runs"]] == ["pass", "pass"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "quick_pass__1p1d-mooncake-http__run1", "quick_pass__1p1d-mooncake-http__run2"]


# ---------------------------------------------------------------- pd_cluster


@pytest.mark.pd_cluster(topology="1p2d")
async def test_pd_cluster_serves_and_is_controllable(pd_cluster: PDCluster) -> None:
    from fake_engines.core.generator import expected_completion

    assert sorted(pd_cluster.engine_urls) == ["decode-0", "decode-1", "prefill-0"]
    assert all(u.startswith("http://127.0.0.1:") for u in pd_cluster.engine_urls.values())
    workers = await pd_cluster.workers()
    assert sorted(w["status"] for w in workers) == ["ready"] * 3
    prompt = "[pdchaos:fixture:1] alpha bravo charlie"
    status, body = await pd_cluster.completion(prompt, max_tokens=5)
    assert status == 200, body
    assert body["choices"][0]["text"] == expected_completion(prompt, 5, None)

    before = (await pd_cluster.worker("prefill-0") or {}).get("kv_engine_id")
    state = await pd_cluster.control("prefill-0").restart(down_s=0.5)
    new_id = state["state"]["engine_id"]
    assert new_id != before

    async def engine_id_in_force() -> str | None:
        return (await pd_cluster.worker("prefill-0") or {}).get("kv_engine_id")

    for _ in range(100):
        if await engine_id_in_force() == new_id:
            break
        await __import__("asyncio").sleep(0.05)
    assert await engine_id_in_force() == new_id

    status, body = await pd_cluster.patch_worker("decode-1", {"labels": {"zone": "b"}})
    assert status == 200, body
    assert body["labels"] == {"zone": "b"}

    old_pid = pd_cluster.pid("decode-1")
    pd_cluster.kill("decode-1")
    assert not pid_alive(old_pid)
    await pd_cluster.wait_status("decode-1", "not_ready", 5.0)
    new_pid = pd_cluster.respawn("decode-1")
    assert new_pid != old_pid
    await pd_cluster.wait_status("decode-1", "ready", 10.0)
    with pytest.raises(TimeoutError, match="not draining"):
        await pd_cluster.wait_status("decode-0", "draining", 0.3)


PD_CLUSTER_TEST = '''
import pytest

@pytest.mark.parametrize("pd_cluster", [{"topology": "1p1d", "transport": "grpc"}], indirect=True)
def test_sync_use_then_fail(pd_cluster):
    pids = [p.pid for p in pd_cluster._sup.processes]
    (pd_cluster.out_dir.parent.parent / "pids.txt").write_text(" ".join(map(str, pids)))
    assert pd_cluster.engine_urls["prefill-0"].startswith("grpc://127.0.0.1:")
    workers = pd_cluster.run(pd_cluster.workers())
    assert {w["status"] for w in workers} == {"ready"}
    status, _ = pd_cluster.run(pd_cluster.completion("[pdchaos:sync:1] hello"))
    assert status == 200
    raise AssertionError("deliberate failure: teardown must still kill everything")

@pytest.mark.pd_cluster(topology="one-by-one")
def test_bad_topology(pd_cluster):
    pass

@pytest.mark.pd_cluster(size=3)
def test_bad_option(pd_cluster):
    pass
'''


def test_pd_cluster_teardown_after_failing_test_and_sync_use(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cluster=PD_CLUSTER_TEST)
    result = pytester.runpytest(f"--basetemp={pytester.path / 'bt'}")
    result.assert_outcomes(failed=1, errors=2)
    result.stdout.fnmatch_lines(["*pd_cluster: bad topology 'one-by-one'*"])
    result.stdout.fnmatch_lines(["*deliberate failure*"])
    result.stdout.fnmatch_lines(["pd_cluster: unknown option(s)*size*"])
    assert "During handling" not in result.stdout.str()
    pids = [int(p) for p in (pytester.path / "pids.txt").read_text().split()]
    assert len(pids) == 3
    assert not any(pid_alive(p) for p in pids)
