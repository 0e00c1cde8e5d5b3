"""The simulated world: production settings that real time cannot afford, exact replay, and the same verdicts
as real time at scaled settings (the agreement table)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT

from harness.agreement import TABLE, differences, load_table, rows
from harness.history import load_history
from harness.runner import replay_command, run_scenario
from harness.scenario import load_scenarios
from harness.scenario.bugs import with_bugs

SCENARIOS = {s.name: s for s in load_scenarios()}


def _checks(result: Any) -> dict[str, str]:
    return {v.name: v.status for v in result.verdicts}


async def test_2491_at_production_settings_passes_and_catches_the_stale_id(tmp_path: Path) -> None:
    s = SCENARIOS["prefill_restart_mooncake"]
    good = await run_scenario(s, "1p1d", "mooncake", "http", "reference", tmp_path / "good", world="sim")
    assert good.status == "pass", good.reason
    assert (good.world, good.settings) == ("sim", "production")
    started = load_history(tmp_path / "good" / "history.jsonl").run or {}
    settings = started["settings"]
    assert (settings["health_interval_s"], settings["transfer_timeout_s"]) == (60.0, 480.0)
    assert started["world"] == "sim" and started["time_unit"] == "simulated seconds"
    bad = await run_scenario(s.with_router(inject_bugs=("stale_engine_id",)), "1p1d", "mooncake", "http",
                             "reference", tmp_path / "bad", world="sim")
    assert _checks(bad)["transfer_timeout"] == "fail", bad.reason
    assert "--inject-bug stale_engine_id" in bad.replay and "--world sim" in bad.replay


async def test_a_restart_between_production_probes_is_noticed_within_the_identity_bound(
    tmp_path: Path,
) -> None:
    s = SCENARIOS["prefill_restart_between_probes"]
    res = await run_scenario(s, "1p1d", "mooncake", "http", "reference", tmp_path, world="sim")
    assert res.status == "pass", res.reason
    h = load_history(tmp_path / "history.jsonl")
    restart = next(f for f in h.fault_list() if f.kind == "restart")
    noticed = [e for e in h.router_events_of("engine_id") if "identity check" in str(e.fields.get("reason"))
               and e.at > (restart.applied_t or 0.0)]
    assert noticed, "the identity check never noticed the restart"
    bound = h.settings["router"]["identity_check_interval_s"] + h.settings["health_timeout_s"]
    assert bound == 35.0
    # The probes never saw it (no failed probe, no NotReady): only the identity check could.
    assert noticed[0].at - (restart.healed_t or restart.applied_t or 0.0) <= bound


def _history_digest(tmp: Path, seed: str, hashseed: str) -> str:
    out = tmp / f"run-{hashseed}"
    code = (
        "import asyncio, sys\n"
        "from harness.runner import run_scenario\n"
        "from harness.scenario import load_scenarios\n"
        "s = next(x for x in load_scenarios() if x.name == 'prefill_link_flapping')\n"
        f"r = asyncio.run(run_scenario(s, '2p1d', 'mooncake', 'http', 'reference', {str(out)!r}, seed={seed},"
        " world='sim', settings='scaled'))\n"
        "sys.exit(0 if r.status == 'pass' else 1)\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return hashlib.sha256((out / "history.jsonl").read_bytes()).hexdigest()


def test_same_scenario_cell_and_seed_give_a_byte_identical_history(tmp_path: Path) -> None:
    """Two processes, two hash seeds (a set iterated in an order that depends on either would show)."""
    first = _history_digest(tmp_path, "7", "1")
    assert _history_digest(tmp_path, "7", "2") == first
    assert _history_digest(tmp_path, "8", "3") != first  # and the seed does reach the draws


async def test_check_determinism_replays_the_cell(tmp_path: Path) -> None:
    s = SCENARIOS["decode_process_frozen"]
    res = await run_scenario(s, "1p2d", "nixl", "grpc", "reference", tmp_path, world="sim", settings="scaled",
                             check_determinism=True)
    det = next(v for v in res.verdicts if v.name == "determinism")
    assert det.status == "pass", det.reason
    assert len(det.numbers["sha256"]) == 64 and not (tmp_path / "replay.history.jsonl").exists()


async def test_the_simulated_world_runs_the_reference_router_only(tmp_path: Path) -> None:
    res = await run_scenario(SCENARIOS["sole_prefill_down"], "1p1d", "mooncake", "http", "smg==1.13.0",
                             tmp_path, world="sim")
    assert res.status == "unknown" and "reference router only" in res.run_reason


# ---------------------------------------------------------------- agreement with real time


TABLE_ROWS = load_table()


def test_the_agreement_table_covers_every_scenario_and_bug() -> None:
    assert TABLE.exists(), "run `python -m harness.agreement` to build the table"
    assert {r.key for r in rows(list(SCENARIOS.values()))} <= set(TABLE_ROWS)


@pytest.mark.parametrize("row", rows(list(SCENARIOS.values())), ids=lambda r: r.key)
async def test_simulation_agrees_with_real_time_per_checker(row: Any, tmp_path: Path) -> None:
    """The simulated world gives every checker the verdict real time gave it (the table's real column);
    a scenario that cannot agree says why (`world_notes["sim"]`)."""
    entry = TABLE_ROWS.get(row.key)
    if entry is None or "real" not in entry:
        pytest.fail(f"{row.key}: no real-time verdicts in {TABLE}: run `python -m harness.agreement`")
    s = SCENARIOS[row.scenario]
    if row.bug:
        s = with_bugs(s, [row.bug])  # a router or an engine switch
    res = await run_scenario(s, row.topology, row.connector, row.transport, "reference", tmp_path,
                             world="sim", settings="scaled")
    diff = differences(entry["real"], _checks(res))
    why = SCENARIOS[row.scenario].world_notes.get("sim")
    if why:
        assert diff, f"{row.key}: the worlds agree now: drop the scenario's world note ({why})"
        return
    assert not diff, f"{row.key}: {diff}; " + json.dumps({v.name: v.reason for v in res.verdicts
                                                          if v.status != 'pass'})[:1500]


# ---------------------------------------------------------------- load after a late heal


async def test_the_load_outlasts_a_late_heal_by_after_heal_s(tmp_path: Path) -> None:
    """A restart that takes long (3 s down) still leaves `after_heal_s` of traffic after it."""
    from dataclasses import replace

    from harness.scenario import At, Restart, Step

    base = replace(SCENARIOS["sole_prefill_down"],
                   timeline=(Step("restart", Restart("prefill-0", down_s=3.0), At(0.5)),))
    base = replace(base, workload=replace(base.workload, duration_s=2.0))
    kept = replace(base, workload=replace(base.workload, after_heal_s=1.5))

    def last_send_after_heal(res: Any) -> float:
        h = load_history(Path(res.history_path))
        healed = max(f.healed_t for f in h.fault_list() if f.healed_t is not None)
        return max(r.invoked_t for r in h.request_list() if r.invoked_t is not None) - healed

    short = await run_scenario(base, "1p1d", "mooncake", "grpc", "reference", tmp_path / "a", world="sim",
                               settings="scaled")
    long = await run_scenario(kept, "1p1d", "mooncake", "grpc", "reference", tmp_path / "b", world="sim",
                              settings="scaled")
    assert last_send_after_heal(short) < 0  # the load ended before the engine was back
    assert 1.0 < last_send_after_heal(long) <= 1.5


def test_the_replay_of_a_scenario_file_names_it_by_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    mine = dataclasses.replace(SCENARIOS["prefill_restart_mooncake"], source="mine/my scenario.py")
    line = replay_command(mine, "1p1d", "mooncake", "http", "reference", 3, "sim", "production")
    # FILE::NAME: the file may define other scenarios, and the replay runs this one alone.
    path = tmp_path / "mine" / "my scenario.py"
    assert f"pdchaos run '{path}::prefill_restart_mooncake' --topology 1p1d" in line
    shipped = replay_command(SCENARIOS["prefill_restart_mooncake"], "1p1d", "mooncake", "http", "reference",
                             3, "sim", "production")
    assert shipped.startswith("pdchaos run prefill_restart_mooncake ")
    checked = replay_command(SCENARIOS["prefill_restart_mooncake"], "1p1d", "mooncake", "http", "reference",
                             3, "sim", "production", check_determinism=True)
    assert checked.endswith(" --check-determinism")
    # Built in code (a search's case, a bench): no name or file the command line could take.
    in_code = dataclasses.replace(SCENARIOS["prefill_restart_mooncake"], name="search_case", source="")
    assert replay_command(in_code, "1p1d", "mooncake", "http", "reference", 3, "sim", "production") == ""


async def test_a_paused_router_expires_the_probe_it_held_and_serves_what_waited(tmp_path: Path) -> None:
    """router_paused: the probe in flight across the pause overran its slot; the router freed it as it
    resumed (an event of the slot's length), and the requests that waited were served."""
    s = SCENARIOS["router_paused"]
    res = await run_scenario(s, "1p2d", "mooncake", "http", "reference", tmp_path, world="sim",
                             settings="scaled")
    assert res.status == "pass", res.reason
    h = load_history(tmp_path / "history.jsonl")
    pause = next(f for f in h.fault_list() if f.kind == "pause_router")
    assert pause.applied_t is not None and pause.healed_t is not None
    slot = 2 * h.settings["health_timeout_s"]
    expired = [e for e in h.router_events_of("probe") if abs(float(e.get("duration_s")) - slot) < 1e-6]
    assert len(expired) == 1 and expired[0].at == pytest.approx(pause.healed_t, abs=0.05), expired
    waited = [r for r in h.request_list() if r.invoked_t is not None
              and pause.applied_t < r.invoked_t < pause.healed_t]
    assert waited and all(r.ok and (r.completed_t or 0.0) >= pause.healed_t for r in waited)


async def test_a_worker_api_failure_the_core_did_not_expect_is_a_500_as_the_server_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A core that forgets a type check raises where the server's handler expects a ValueError: the server
    answers 500 (its error middleware), so the simulated router does too, and the worker API contract
    fails with that answer as its evidence, rather than the cell ending unknown on the world's crash."""
    import harness.worlds.sim.router as sim_router

    def careless(body: Any) -> Any:
        return 1 <= body.get("bootstrap_port", 1) <= 65535 and real(body)  # TypeError on a port as text

    real = sim_router.spec_from_json
    monkeypatch.setattr(sim_router, "spec_from_json", careless)
    res = await run_scenario(SCENARIOS["worker_api_add_remove"], "2p1d", "mooncake", "http", "reference",
                             tmp_path, world="sim", settings="scaled")
    api = next(v for v in res.verdicts if v.name == "worker_api")
    assert res.status == "fail" and api.status == "fail", (res.status, res.run_reason)
    assert any("was 500, not a 4xx" in line and "bootstrap_port" in line for line in api.evidence), \
        api.evidence
