"""`pdchaos search`: bad arguments (exit 3, one line), and a short search with an easy switch that finds a
failure, stops there (`--stop-at-first`), shrinks it to at most two faults and writes a scenario file that
replays with the same failing checker in simulated time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import ROOT

from harness import cli
from harness.runner import run_scenario
from harness.scenario import scenarios_in_file


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["search", "--inject-bug", "no_such_bug"], "unknown bug no_such_bug"),
        (["search", "--budget", "soon"], "--budget takes a number of seconds"),
        (["search", "--budget", "-5"], "--budget must be a positive number"),
        (["search", "--budget", "nan"], "--budget must be a positive number"),
        (["search", "--seeds", "0"], "--seeds must be at least 1"),
        (["search", "--max-side", "9"], "--max-side must be within 1..8"),
        # A gateway is searched in real time (a plain `--router smg==1.0` installs that release).
        (["search", "--router", "smg==1.0", "--world", "sim"], "runs the reference router only"),
        (["search", "--router", "profile:smg-1.10.1", "--transport", "http"],
         "profile smg-1.10.1 models smg==1.10.1 over grpc only"),
        (["search", "--shifts", "0.1,later"], "--shifts takes seconds separated by commas"),
        (["search", "--shifts", "0"], "each shift must be within (0, 5] seconds"),
        (["search", "--shifts", "9"], "each shift must be within (0, 5] seconds"),
    ],
)
def test_bad_arguments_exit_3_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, _, err = _main(capsys, *argv)
    assert code == 3 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_out_folder_in_use_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    code, _, err = _main(capsys, "search", "--out", str(tmp_path))
    assert code == 3 and "already exists and is not empty" in err


def test_help_explains_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "search", "--help")
    assert code == 0 and "--inject-bug" in out and "found/<checker>-<hash>.py" in out


def test_a_short_search_finds_shrinks_and_writes_a_replayable_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "search"
    code, text, err = _main(capsys, "search", "--inject-bug", "stale_engine_id", "--budget", "15",
                            "--seeds", "3", "--jobs", "1", "--stop-at-first", "--out", str(out))
    assert code == 1, text + err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures_found"] >= 1 and summary["runs"] >= 1
    # --stop-at-first: seed 0 finds it, and no later seed is started.
    assert summary["seeds_tried"] == 1 and summary["found"][0]["seed"] == 0
    found = summary["found"][0]
    assert found["shrunk"]["faults"] <= 2
    path = Path(found["file"])
    source = path.read_text()
    assert "stale_engine_id" in source and "pdchaos run" in source and "ORIGINAL = Scenario(" in source
    (scenario,) = scenarios_in_file(path)
    assert scenario.router.inject_bugs == ("stale_engine_id",)
    seed = int(source.split("--seed ")[1].split()[0])
    result = asyncio.run(run_scenario(scenario, scenario.topologies[0], scenario.connectors[0],
                                      scenario.transports[0], "reference", tmp_path / "replay", seed=seed,
                                      world="sim", settings="scaled"))
    checker = found["signature"].split(":")[0]
    assert any(v.name == checker and v.status == "fail" for v in result.verdicts)


def test_ctrl_c_keeps_what_the_seeds_found_and_says_unknown(tmp_path: Path) -> None:
    """Ctrl-C on a search over worker processes: the running seeds stop where they are, their failures (as
    shrunk so far) are written, summary.json says interrupted, exit 2, and no worker is left."""
    out = tmp_path / "s"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "search", "--inject-bug", "stale_engine_id", "--budget", "120",
         "--jobs", "2", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # A shell's background job inherits SIGINT ignored: give the child a terminal's Ctrl-C back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 90
        # Once a seed has handed in a failure, others are under way.
        while not any((out / "found").glob("*.py")) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, stdout + stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["seeds_tried"] >= 1
    assert summary["found"] and all(Path(f["file"]).is_file() for f in summary["found"])
    assert "partial summary, verdict UNKNOWN" in stderr and "Traceback" not in stderr
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert left == []


def test_known_marks_a_finding_the_shipped_run_shows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A finding whose problem a `pdchaos run` folder shows is known (with its cells); the rest are new."""
    args = ["search", "--inject-bug", "stale_engine_id", "--budget", "15", "--seeds", "1", "--jobs", "1",
            "--stop-at-first"]
    code, text, err = _main(capsys, *args, "--out", str(tmp_path / "first"))
    assert code == 1, text + err
    found = json.loads((tmp_path / "first" / "summary.json").read_text())["found"][0]
    assert found["shown_by"] is None and "not compared" not in text  # the reference router: the zoo names it
    # The run that shows it: the found file itself, replayed by `pdchaos run`.
    code, text, err = _main(capsys, "run", found["file"], "--world", "sim", "--no-progress",
                            "--out", str(tmp_path / "run"))
    assert code == 1, text + err
    code, text, err = _main(capsys, *args, "--known", str(tmp_path / "run"), "--out", str(tmp_path / "again"))
    assert code == 1, text + err
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["found"][0]["shown_by"] and summary["new_signatures"] == []
    assert f"known: {tmp_path / 'run'} shows it in" in text and "new: 0 distinct signature(s)" in text
    # --skip-known passes such cases by while searching: what it still finds is new, and it counts the rest.
    code, text, err = _main(capsys, *args, "--known", str(tmp_path / "run"), "--skip-known",
                            "--out", str(tmp_path / "skip"))
    skipped = json.loads((tmp_path / "skip" / "summary.json").read_text())
    assert skipped["skip_known"] is True and skipped["known_passed"] >= 1, text + err
    assert found["signature"] not in skipped["distinct_signatures"]
    assert all(not f["shown_by"] for f in skipped["found"]) and code == (1 if skipped["found"] else 0)
    assert f"cases passed by, failing only as {tmp_path / 'run'} shows: {skipped['known_passed']}" in text
    # It needs the run it skips by.
    code, _, err = _main(capsys, *args, "--skip-known", "--out", str(tmp_path / "none"))
    assert code == 3 and "--skip-known needs --known" in err


def test_known_that_is_not_a_run_folder_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = _main(capsys, "search", "--known", str(tmp_path), "--out", str(tmp_path / "s"))
    assert code == 3 and "--known" in err and "report.json" in err
    assert not (tmp_path / "s").exists()  # nothing written
