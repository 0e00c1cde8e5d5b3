"""`pdchaos search --world real`: the reference router with a bug switch on is the router under test, in real
time (processes on loopback). The search finds the switch, confirms it (twice on the router, a pass on the
reference router), writes the scenario file and its bug report, and the reference router without the switch
passes the found case when it is run again. With PDCHAOS_SLOW=1, a longer search of the reference router as
it is finds nothing."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from harness import cli
from harness.runner import run_scenario
from harness.scenario import scenarios_in_file

SLOW = os.environ.get("PDCHAOS_SLOW") == "1"


def _search(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = cli.main(["search", "--world", "real", "--jobs", "1", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out + err


def _left_running(folder: Path) -> list[str]:
    """Processes still running whose command line names the folder (engines, routers of the search)."""
    found = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, text=True).stdout.split()
    return [p for p in found if p != str(os.getpid())]


def test_a_real_time_search_finds_confirms_and_reports_a_switch(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    out = tmp_path / "search"
    code, text = _search(capsys, "--inject-bug", "stale_engine_id", "--budget", "60", "--shrink-budget", "20",
                         "--seeds", "1", "--stop-at-first", "--out", str(out))
    assert code == 1, text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world"] == "real" and summary["router"] == "reference" and summary["failures_found"] == 1
    assert summary["replay_runs"] >= 1 and summary["reference_runs"] >= 1 and summary["shift_runs"] == 0
    (found,) = summary["found"]
    assert found["reference"] == "pass"
    assert "world real" in text and "set aside, not counted" in text

    report = Path(found["report"])
    assert report == Path(found["file"]).with_suffix(".md")
    body = report.read_text()
    for heading in ("## Router", "## The case", "## What a user sees", "## Evidence",
                    "## What the reference router does", "## Replay"):
        assert heading in body
    assert "bug switches on: stale_engine_id" in body and "--inject-bug stale_engine_id" in body
    assert "passed every check" in body
    replay = shlex.split(body.split("```\n")[1].splitlines()[0])
    assert replay[:3] == ["pdchaos", "run", found["file"]] and "real" in replay and "scaled" in replay

    # The found case without the switch: the reference router as it is passes it in real time.
    (scenario,) = scenarios_in_file(Path(found["file"]))
    assert scenario.router.inject_bugs == ("stale_engine_id",)
    clean = replace(scenario, router=replace(scenario.router, inject_bugs=()))
    seed = int(replay[replay.index("--seed") + 1])
    result = asyncio.run(run_scenario(clean, clean.topologies[0], clean.connectors[0], clean.transports[0],
                                      "reference", tmp_path / "clean", seed=seed, world="real",
                                      settings="scaled"))
    assert result.verdict.status == "pass", result.reason
    assert _left_running(tmp_path) == []


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="slow: set PDCHAOS_SLOW=1")
def test_a_real_time_search_of_the_reference_router_finds_nothing(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "search"
    code, text = _search(capsys, "--budget", "120", "--shrink-budget", "60", "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0 and summary["failures_found"] == 0, text
    assert summary["runs"] >= 3 and summary["unsound_runs"] < summary["runs"]
    assert _left_running(tmp_path) == []
