"""No process outlives `pdchaos run`: interrupted mid-scenario by SIGINT or SIGTERM (handled: teardown,
partial report, exit 2) or by SIGKILL (not handled: the children die with it by their parent-death signal).

Each test runs the real CLI on `tests/scenario_files/orphans_scenario.py` (engines, router, a process
restart), waits until the scenario is under way, signals it, then looks for survivors two ways: every
pid/pgid the run recorded in its `pids.jsonl` files, and a /proc scan for the run's unique marker
(environment or argv).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.paths import SCENARIO_FILES

from harness.worlds.real.processes import MARKER_ENV, find_marked_processes, group_alive, pid_alive
from pdchaos.jsonl import read_jsonl
from pdchaos.ports import POOL_ENV
from pdchaos.waiting import poll_until_sync

SCENARIO_FILE = SCENARIO_FILES / "orphans_scenario.py"
START_TIMEOUT_S = 30.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and PDEATHSIG")


def _records(run_dir: Path, name: str) -> list[dict]:
    out: list[dict] = []
    for path in sorted(run_dir.rglob(name)):
        out.extend(read_jsonl(path))
    return out


def _under_way(run_dir: Path) -> bool:
    """The process restart was applied and verified, and traffic flows: the run is mid-scenario."""
    hist = _records(run_dir, "history.jsonl")
    verified = [r for r in hist if r.get("type") == "fault_verified"]
    if not verified:
        return False
    after = [r for r in hist if r.get("type") == "request_completed" and r["t"] > verified[0]["t"]]
    return len(after) >= 2


def _wait_for(pred, timeout_s: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    if poll_until_sync(lambda: pred() or proc.poll() is not None, timeout_s) and pred():
        return
    if proc.poll() is not None:
        pytest.fail(f"pdchaos exited early ({proc.returncode}) waiting for {what}:\n{log.read_text()}")
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}:\n{log.read_text()[-3000:]}")


def _survivors(run_dir: Path, marker: str) -> list[str]:
    found = []
    for rec in _records(run_dir, "pids.jsonl"):
        if pid_alive(rec["pid"]) or group_alive(rec["pgid"]):
            found.append(f"{rec['name']} pid {rec['pid']}")
    found += [f"marked pid {p}" for p in find_marked_processes(marker)]
    return found


def _wait_no_survivors(run_dir: Path, marker: str, timeout_s: float) -> list[str]:
    left: list[str] = []

    def none_left() -> bool:
        nonlocal left
        left = _survivors(run_dir, marker)
        return not left

    poll_until_sync(none_left, timeout_s)
    return left


@dataclass
class Launched:
    proc: subprocess.Popen
    run_dir: Path
    marker: str
    log: Path


def _launch(base: Path, label: str) -> Launched:
    marker = f"pdchaos-orphan-test-{label}-{uuid.uuid4().hex}"
    run_dir = base / label / "run"
    run_dir.parent.mkdir(parents=True)
    log = base / label / "pdchaos.out"
    # Three runs start at once from one port pool: their claims (pdchaos.port_claims) keep them apart.
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    env[MARKER_ENV] = marker
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "run", str(SCENARIO_FILE), "--out", str(run_dir),
             "--no-progress"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    return Launched(proc, run_dir, marker, log)


def _kill_leftovers(run: Launched) -> None:
    if run.proc.poll() is None:
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
    for rec in _records(run.run_dir, "pids.jsonl"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec["pgid"], signal.SIGKILL)
    for pid in find_marked_processes(run.marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Launched]]:
    """One `pdchaos run` per signal, all started at once (the scenario runs 60 s: each is still mid-way when
    its test signals it), so the three start-ups overlap. Whatever is left is killed at the end."""
    base = tmp_path_factory.mktemp("orphans")
    started: dict[str, Launched] = {}
    try:
        for label in ("SIGINT", "SIGTERM", "SIGKILL"):
            started[label] = _launch(base, label)
        yield started
    finally:
        for run in started.values():
            _kill_leftovers(run)


def _start_and_wait(run: Launched) -> tuple[subprocess.Popen, Path, str, Path, list[dict]]:
    proc, run_dir, marker, log = run.proc, run.run_dir, run.marker, run.log
    _wait_for(lambda: _under_way(run_dir), START_TIMEOUT_S, "the scenario to be under way", proc, log)
    pids = _records(run_dir, "pids.jsonl")
    names = sorted(r["name"] for r in pids)
    # prefill twice: the original and its respawn after the process restart; the fork server forked them.
    assert names == ["decode-0", "forkserver", "prefill-0", "prefill-0", "router"], names
    live = [r for r in pids if pid_alive(r["pid"])]
    assert len(live) == 4, (f"expected the fork server, the respawned prefill, the decode and the router "
                            f"alive: {live}")
    marked = set(find_marked_processes(marker))
    assert {r["pid"] for r in live} | {proc.pid} <= marked
    info = json.loads((run_dir / "run.json").read_text())
    assert info["marker"] == marker and info["pid"] == proc.pid
    return proc, run_dir, marker, log, pids


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_handled_signal_tears_down_and_writes_partial_report(
    runs: dict[str, Launched], sig: signal.Signals
) -> None:
    proc, run_dir, marker, log, _ = _start_and_wait(runs[sig.name])
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pdchaos did not exit within 30 s of {sig.name}:\n{log.read_text()[-3000:]}")
    output = log.read_text()
    assert code == 2, output
    assert "partial report" in output and "Traceback" not in output
    # Handled: teardown happened before exit, so nothing is left right away (a tiny slack for the kernel).
    assert _wait_no_survivors(run_dir, marker, 1.0) == []
    report = json.loads((run_dir / "report.json").read_text())
    statuses = [c["status"] for c in report["results"]] if "results" in report else None
    assert statuses == ["unknown"], report
    hist = _records(run_dir, "history.jsonl")
    assert hist[-1]["type"] == "run_ended" and hist[-1]["reason"] == "interrupted"
    assert (run_dir / "junit.xml").is_file() and (run_dir / "report.html").is_file()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["interrupted"] is True and info["exit_code"] == 2


def test_sigkill_takes_the_children_along(runs: dict[str, Launched]) -> None:
    proc, run_dir, marker, _log, pids = _start_and_wait(runs["SIGKILL"])
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    # Nothing ran in the harness after the SIGKILL: only the kernel's parent-death signal can clean up.
    left = _wait_no_survivors(run_dir, marker, 5.0)
    assert left == [], f"survivors after SIGKILL of the harness: {left}"
    assert all(not pid_alive(r["pid"]) for r in pids)
    assert not (run_dir / "report.json").exists()
    # `pdchaos report` still judges the cut-short run: unknown, exit 2.
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", str(run_dir)], capture_output=True, text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "UNKNOWN" in out.stdout

