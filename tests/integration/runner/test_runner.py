"""Scenarios end to end against the reference router: each passes, and fails once its bug is put back.

Every test starts real processes (fake engines, `pdchaos-router`) on loopback through the runner; the runner's
supervisor kills them on every path. A pass run and its injected-bug twin run side by side to halve the wait.
The full matrix (every shipped scenario in every cell) is `slow`: set PDCHAOS_SLOW=1 to run it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.parallel import run_suite
from harness.runner import Cell, expand_matrix, run_scenario
from harness.scenario import (
    At,
    Expect,
    RemoveWorker,
    Restart,
    Scenario,
    Step,
    WorkerStatus,
    Workload,
    load_scenarios,
)
from pdchaos.ports import port_is_open
from reports import write_reports

slow = pytest.mark.skipif(os.environ.get("PDCHAOS_SLOW") != "1", reason="slow matrix: set PDCHAOS_SLOW=1")


def _scenario(name: str, **workload: Any) -> Scenario:
    s = load_scenarios([name])[0]
    # Fewer clients keep two runs side by side light on a 2-core machine; the timeline is unchanged.
    return replace(s, workload=replace(s.workload, concurrency=2, **workload))


def _explain(result: Any) -> str:
    return "\n".join(f"{v.status} {v.name}: {v.reason}" for v in result.verdicts)


async def _pair(s: Scenario, bug: str, cell: Cell, tmp: Path) -> tuple[Any, Any]:
    good, bad = await asyncio.gather(
        run_scenario(s, cell.topology, cell.connector, cell.transport, "reference", tmp / "good", seed=3),
        run_scenario(s.with_router(inject_bugs=(bug,)), cell.topology, cell.connector, cell.transport,
                     "reference", tmp / "bad", seed=3),
    )
    return good, bad


def _status(result: Any, checker: str) -> str:
    return next(v.status for v in result.verdicts if v.name == checker)


async def test_prefill_restart_mooncake_passes_and_catches_stale_engine_id(tmp_path: Path) -> None:
    s = _scenario("prefill_restart_mooncake", duration_s=5.0)
    good, bad = await _pair(s, "stale_engine_id", Cell("1p1d", "mooncake", "http"), tmp_path)
    assert good.status == "pass", _explain(good)
    assert bad.status == "fail", _explain(bad)
    # The dead id is minted after the restart: decodes wait out the transfer timeout.
    assert _status(bad, "transfer_timeout") == "fail", _explain(bad)
    assert (tmp_path / "good" / "history.jsonl").is_file()
    assert any((tmp_path / "good" / "engines").glob("*.records.jsonl"))


async def test_metadata_wedged_passes_and_catches_metadata_no_deadline(tmp_path: Path) -> None:
    # gRPC chat and streaming are left out: see the report on the router's gRPC rendering (output checker).
    s = _scenario("metadata_wedged", chat_fraction=0.0, stream_fraction=0.0, duration_s=5.2)
    good, bad = await _pair(s, "metadata_no_deadline", Cell("1p1d", "mooncake", "grpc"), tmp_path)
    assert good.status == "pass", _explain(good)
    assert bad.status == "fail", _explain(bad)
    # The re-read with no deadline holds the probe slot: the worker is not probed while metadata is wedged.
    assert _status(bad, "probe_schedule") == "fail", _explain(bad)


async def test_partial_read_passes_and_catches_partial_read_clears_id(tmp_path: Path) -> None:
    s = _scenario("partial_metadata_read", chat_fraction=0.0, stream_fraction=0.0, duration_s=4.8)
    good, bad = await _pair(s, "partial_read_clears_id", Cell("1p1d", "mooncake", "grpc"), tmp_path)
    assert good.status == "pass", _explain(good)
    assert bad.status == "fail", _explain(bad)
    # With the id cleared the router cannot mint: decodes recompute silently.
    assert _status(bad, "no_local_compute") == "fail", _explain(bad)


async def test_broken_router_command_gives_unknown_with_reason_and_no_leftovers(tmp_path: Path) -> None:
    # Long enough that the restart at 1.5 s is inside the load (a step after it is refused up front).
    s = _scenario("prefill_restart_mooncake", duration_s=2.0)
    res = await run_scenario(s, "1p1d", "mooncake", "http", "cmd:false --port {port}", tmp_path, seed=1)
    assert res.status == "unknown"
    assert "error" in res.run_reason and "router" in res.run_reason.lower(), res.run_reason
    text = (tmp_path / "history.jsonl").read_text()
    assert '"type":"run_ended"' in text
    # Every engine the run started is gone (the supervisor tore them down).
    states = [ln for ln in text.splitlines() if '"type":"engine_state"' in ln]
    assert states, "engines were started before the router"
    layout = json.loads(text.splitlines()[0])["settings"]["engines_layout"]
    for _name, info in layout.items():
        port = int(info["url"].rsplit(":", 1)[1])
        assert not port_is_open(port), f"engine port {port} still open after the run"


async def test_unverified_action_and_missed_step_make_the_run_unknown(tmp_path: Path) -> None:
    s = Scenario(
        name="harness_failure_paths",
        description="prefill-1 is never registered: removing it fails, and a step waiting for it is missed",
        topologies=("2p1d",),
        router=load_scenarios(["prefill_restart_mooncake"])[0].router,
        workload=Workload(duration_s=1.5, concurrency=1),
        unregistered_engines=("prefill-1",),
        timeline=(
            Step("remove", RemoveWorker("prefill-1"), At(0.3)),
            Step("never", Restart("prefill-0"), WorkerStatus("prefill-1", "ready"), deadline_s=1.0),
        ),
        expect=(Expect("nothing_lost"),),
    )
    res = await run_scenario(s, "2p1d", "mooncake", "http", "reference", tmp_path, seed=2)
    by_name = {v.name: v for v in res.verdicts}
    assert res.status == "unknown", _explain(res)
    assert by_name["faults"].status == "unknown" and "remove" in by_name["faults"].reason
    assert by_name["timeline"].status == "unknown" and "never" in by_name["timeline"].reason
    assert by_name["nothing_lost"].status == "pass"
    text = (tmp_path / "history.jsonl").read_text()
    assert '"fault":"remove"' in text and '"ok":false' in text and "step never missed" in text
    # The same folder again: the first run's engine records must not be judged with the second run.
    def handoff_tags() -> set[str]:
        lines = (tmp_path / "history.jsonl").read_text().splitlines()
        return {json.loads(ln)["tag"] for ln in lines if '"type":"handoff"' in ln}

    first = handoff_tags()
    await run_scenario(s, "2p1d", "mooncake", "http", "reference", tmp_path, seed=2)
    again = handoff_tags()
    assert first and again and not first & again


async def test_cancelled_run_tears_down_and_records_interrupted(tmp_path: Path) -> None:
    s = _scenario("decode_restart")
    task = asyncio.create_task(run_scenario(s, "1p1d", "mooncake", "http", "reference", tmp_path, seed=1))
    hist = tmp_path / "history.jsonl"
    for _ in range(200):  # until the load is running
        await asyncio.sleep(0.05)
        if hist.exists() and '"type":"request_invoked"' in hist.read_text():
            break
    task.cancel()
    try:
        res = await task
    except asyncio.CancelledError:
        pass
    else:
        pytest.fail(f"the run ended before it was cancelled: {res.status}: {res.run_reason}")
    records = [json.loads(ln) for ln in hist.read_text().splitlines()]
    assert records[-1]["type"] == "run_ended" and records[-1]["reason"] == "interrupted"
    layout = records[0]["settings"]["engines_layout"]
    for info in layout.values():
        assert not port_is_open(int(info["url"].rsplit(":", 1)[1]))


async def test_scenario_that_does_not_apply_is_unknown(tmp_path: Path) -> None:
    s = _scenario("one_of_two_prefills_down")
    res = await run_scenario(s, "1p1d", "mooncake", "http", "reference", tmp_path)
    assert res.status == "unknown" and "does not apply" in res.run_reason


async def test_run_suite_runs_cells_and_points_latest_at_the_run(tmp_path: Path) -> None:
    s = replace(_scenario("property_update_keeps_handoff", duration_s=2.8), topologies=("1p1d",),
                connectors=("mooncake",), transports=("http",))
    run_dir = tmp_path / "runs" / "r1"
    results = await run_suite([s], None, run_dir)
    assert [r.status for r in results] == ["pass"], _explain(results[0])
    latest = tmp_path / "runs" / "latest"
    assert latest.is_symlink() and latest.resolve() == run_dir.resolve()
    # Rendering is the caller's (the CLI, the pytest plugin): the runner does not depend on `reports`.
    assert not (run_dir / "report.json").exists()
    write_reports(results, run_dir)
    assert (run_dir / "report.json").is_file() and (run_dir / "junit.xml").is_file()
    assert (run_dir / "property_update_keeps_handoff__1p1d-mooncake-http" / "history.jsonl").is_file()


@slow
@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "cell"),
    [pytest.param(s, c, id=f"{s.name}-{c.label}") for s, c in expand_matrix(load_scenarios())],
)
async def test_full_matrix(scenario: Scenario, cell: Cell, tmp_path: Path) -> None:
    res = await run_scenario(scenario, cell.topology, cell.connector, cell.transport, "reference", tmp_path)
    assert res.status == "pass", _explain(res)


@slow
@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "cell", "bug"),
    [
        pytest.param(s, c, bug, id=f"{s.name}-{c.label}-{bug}")
        for s, c in expand_matrix(load_scenarios())
        for bug in s.catches
    ],
)
async def test_full_matrix_catches_injected_bugs(
    scenario: Scenario, cell: Cell, bug: str, tmp_path: Path
) -> None:
    bad = scenario.with_router(inject_bugs=(bug,))
    res = await run_scenario(bad, cell.topology, cell.connector, cell.transport, "reference", tmp_path)
    assert res.status == "fail", _explain(res)


async def test_a_router_whose_port_was_taken_starts_on_another(tmp_path: Path, monkeypatch: Any) -> None:
    """Another process binds the router's port between the harness choosing it and the router binding it:
    the run moves the router to a free port and says so; it neither fails nor blames the router."""
    import socket

    import harness.runner as runner_module

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_allocate = runner_module.allocate
    monkeypatch.setattr(runner_module, "allocate",
                        lambda *a, **k: replace(real_allocate(*a, **k), router_port=taken))
    try:
        r = await run_scenario(_scenario("prefill_restart_mooncake", duration_s=5.0), "1p1d", "mooncake",
                               "http", "reference", tmp_path, seed=3)
    finally:
        squatter.close()
    assert r.status == "pass", _explain(r)
    notes = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    moved = [n for n in notes if n.get("type") == "note" and n.get("port") == taken]
    assert moved and moved[0]["new_port"] != taken and moved[0]["attempt"] == 1


async def test_a_router_that_dies_mid_run_fails_the_run_saying_so(tmp_path: Path) -> None:
    """Killed 3 s after it started (by `timeout`, as an OOM killer would): not only lost requests."""
    s = _scenario("prefill_restart_mooncake", duration_s=4.0)
    router = (f"cmd:timeout -s KILL 3 {sys.executable} -m reference_router --port {{port}} "
              "--pd-disaggregation {prefill_args} {decode_args}")
    res = await run_scenario(s, "1p1d", "mooncake", "http", router, tmp_path, seed=1)
    assert _status(res, "router") == "fail", _explain(res)
    reason = next(v.reason for v in res.verdicts if v.name == "router")
    assert reason.startswith("the router exited (signal 9) during the run (its log: "), reason
