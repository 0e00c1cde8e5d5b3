"""`pdchaos` CLI: usage/configuration errors (exit 3, one line, no traceback), list, help, and real runs
with exit codes 0 (pass), 1 (fail) and 2 (unknown) plus the re-rendered report."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT, SCENARIO_FILES

from harness import cli
from harness.history_writer import HistoryRecorder

PASS_FILE = SCENARIO_FILES / "cli_scenario_pass.py"
FAIL_FILE = SCENARIO_FILES / "cli_scenario_fail.py"


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse's own exits (--help, bad choices)
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_scenario_of_one_world_named_for_the_other_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "only.py"
    f.write_text("from harness.scenario import Scenario\n"
                 "SCENARIOS = [Scenario(name='sim_only', description='', worlds=('sim',),\n"
                 "                      world_notes={'real': 'needs exact replay'}),\n"
                 "             Scenario(name='real_only', description='', worlds=('real',))]\n")
    for name, world, needle in (("sim_only", "real", "does not run in real time: needs exact replay"),
                                ("real_only", "sim", "does not run in the simulated world")):
        code, _out, err = _main(capsys, "run", f"{f}::{name}", "--world", world, "--out", str(tmp_path / "o"))
        assert code == cli.EXIT_USAGE and needle in _one_line_error(err)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--topology", "3x"], "bad topology '3x'"),
        (["run", "--topology", ","], "--topology given without a topology"),
        (["run", "no_such_scenario"], "unknown scenario 'no_such_scenario'"),
        (["run", str(PASS_FILE), "--router", "nginx"], "unknown router 'nginx'"),
        (["run", str(PASS_FILE), "--router", "cmd:/nonexistent/router --port {port}"], "not executable"),
        (["run", str(PASS_FILE), "--router", "cmd:true --port {prot}"], "unknown placeholder"),
        (["run", "--connector", "rdma"], "invalid choice: 'rdma'"),
        (["run", "--seed", "x"], "a seed is a whole number from 0 to 4294967295, not 'x'"),
        (["run", "--seed", "4294967296"], "not 4294967296"),  # would repeat seed 0's workload
        (["run", "--seed", "-1"], "not -1"),
        (["zoo", "--seed", "-1"], "not -1"),
        (["matrix", "--seed", "2e3"], "not '2e3'"),
        (["bisect", "--seed", "99999999999"], "not 99999999999"),
        (["sweep", "ci-regression", "--json"], "--json goes with --dry-run"),
        (["sweep", "ci-regression", "--resume", "--out", "/nonexistent/sweep"], "no sweep folder at"),
        (["zoo", "--rejudge", "/tmp/z", "--resume", "/tmp/z"], "not allowed with argument --rejudge"),
        (["matrix", "--router", "profile:nope"], "unknown gateway profile 'nope'"),
        (["zoo", "--bug", "nixl_not_relayed", "--connector", "mooncake"], "cannot occur in any of the"),
        (["search", "--inject-bug", "nixl_not_relayed", "--connector", "mooncake"], "cannot occur in"),
        # The run would pass, as if its scenarios had caught nothing to catch.
        (["run", "prefill_restart_mooncake", "--world", "sim", "--inject-bug", "nixl_not_relayed"],
         "nixl_not_relayed cannot occur in any of the selected cells (mooncake/grpc, mooncake/http)"),
        (["run", "prefill_restart_mooncake", "--transport", "http", "--inject-bug", "metadata_no_deadline"],
         "needs connector mooncake and transport grpc"),
        (["run", str(PASS_FILE), "--topology", "2p2d"], "no selected scenario applies to topology 2p2d: "),
        (["run", str(PASS_FILE), "--transport", "grpc"], "no selected scenario applies to transport grpc"),
        (["report", "/nonexistent/run/dir"], "no run folder"),
        (["run", "--check-determinism"], "--check-determinism needs --world sim"),
        (["run", "--world", "sim", "--router", "smg==1.13.0"], "reference router only"),
        (["run", "--inject-bug", "no_such_bug"], "unknown bug 'no_such_bug'"),
        (["run", str(PASS_FILE), "--router", "cmd:true --port {port}", "--inject-bug", "stale_engine_id"],
         "--inject-bug stale_engine_id: a reference-router switch; router 'cmd' cannot take it"),
        (["run", "--world", "moon"], "invalid choice: 'moon'"),
        (["run", "--settings", "staging"], "invalid choice: 'staging'"),
        (["bogus"], "invalid choice: 'bogus'"),
    ],
)
def test_usage_errors_exit_3_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, _out, err = _main(capsys, *argv)
    assert code == cli.EXIT_USAGE
    line = _one_line_error(err)
    assert needle in line and line.startswith("pdchaos")


def test_bad_scenario_files_are_configuration_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("SCENARIOS = [\n")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from harness.scenario import Scenario\n"
        "SCENARIOS = [Scenario(name='w', description='d', topologies=('1p1d',), connectors=('rdma',))]\n"
    )
    for path, needle in (
        (broken, "failed to import"),
        (empty, "defines no SCENARIOS"),
        (wrong, "bad connector 'rdma'"),
        (tmp_path / "missing.py", "no such scenario file"),
    ):
        code, _, err = _main(capsys, "run", str(path))
        assert code == cli.EXIT_USAGE, err
        line = _one_line_error(err)
        assert needle in line and str(path) in line


def test_out_folder_must_be_new_or_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.txt").write_text("x")
    code, _, err = _main(capsys, "run", str(PASS_FILE), "--out", str(tmp_path))
    assert code == cli.EXIT_USAGE
    assert "already exists and is not empty" in _one_line_error(err)


def test_help_explains_commands_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "--help")
    assert code == 0
    for needle in ("run", "list", "report", "exit codes: 0 pass, 1 fail, 2 unknown", "3 usage"):
        assert needle in out
    code, out, _ = _main(capsys, "run", "--help")
    assert code == 0
    for flag in ("--topology", "--connector", "--transport", "--router", "--out", "--seed"):
        assert flag in out
    code, _, err = _main(capsys)
    assert code == cli.EXIT_USAGE and "usage: pdchaos" in err


def test_list_shows_shipped_scenarios_with_bugs(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.scenario import load_scenarios

    shipped = load_scenarios()
    code, out, _ = _main(capsys, "list")
    assert code == 0
    for s in shipped:
        assert s.name in out
        for bug in s.bugs:
            assert bug in out
    code, out, _ = _main(capsys, "list", "--json")
    data = json.loads(out)
    assert [d["name"] for d in data] == [s.name for s in shipped]
    assert {d["name"] for d in data if d["default"]} == {s.name for s in cli.default_suite(shipped)}
    code, out, _ = _main(capsys, "list", str(PASS_FILE), "--json")
    assert [d["name"] for d in json.loads(out)] == ["quick_pass"]


def test_default_suite_selection() -> None:
    from harness.scenario import Scenario

    a = Scenario(name="a", description="", tags=("default",))
    b = Scenario(name="b", description="")
    c = Scenario(name="c", description="", tags=("slow",))
    assert cli.default_suite([a, b, c]) == [a]
    assert cli.default_suite([b, c]) == [b]


def _pdchaos(*argv: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_real_runs_exit_codes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two real runs side by side: the passing scenario in the default run folder (exit 0), the failing one
    in a named folder (exit 1); then `pdchaos report` re-renders each, and a cut-short history is unknown."""
    pass_cwd = tmp_path / "proj"
    pass_cwd.mkdir()
    fail_out = tmp_path / "named" / "run"
    runs = [
        _pdchaos("run", str(PASS_FILE), "--seed", "7", cwd=pass_cwd),
        _pdchaos("run", str(FAIL_FILE), "--out", str(fail_out), "--no-progress", cwd=tmp_path),
    ]
    outputs = [p.communicate(timeout=90) for p in runs]
    codes = [p.returncode for p in runs]
    assert codes == [0, 1], outputs
    for _out, err in outputs:
        assert "Traceback" not in err

    # Default run folder: runs/<id>, with runs/latest pointing at it.
    pass_runs = [p for p in (pass_cwd / "runs").iterdir() if p.name != "latest"]
    assert len(pass_runs) == 1
    pass_dir = pass_runs[0]
    assert (pass_cwd / "runs" / "latest").resolve() == pass_dir.resolve()
    info = json.loads((pass_dir / "run.json").read_text())
    assert info["exit_code"] == 0 and info["interrupted"] is False
    assert info["seed"] == 7 and info["cells"] == [
        {"scenario": "quick_pass", "topology": "1p1d", "connector": "mooncake", "transport": "http"}
    ]
    assert "PASS     quick_pass 1p1d/mooncake/http" in outputs[0][0]
    assert "started quick_pass" in outputs[0][1]  # progress lines on stderr (not a TTY here)

    report = json.loads((fail_out / "report.json").read_text())
    assert report["summary"]["status"] == "fail"
    assert [r["status"] for r in report["results"]] == ["fail"]
    assert "availability" in outputs[1][0]
    assert (fail_out / "junit.xml").is_file() and (fail_out / "report.html").is_file()
    assert "started" not in outputs[1][1]  # --no-progress

    # `pdchaos report` in-process (the import of the renderers is paid once per test session).
    for folder, want in ((pass_dir, 0), (fail_out, 1)):
        (folder / "report.html").unlink()
        original = (folder / "report.json").read_bytes()
        assert cli.main(["report", str(folder)]) == want
        assert (folder / "report.html").is_file()
        assert (folder / "report.json").read_bytes() == original  # the run's own record is kept
        assert cli.main(["report", str(folder), "--recheck"]) == want
        assert (folder / "report.json").read_bytes() == original
        assert json.loads((folder / "report.recheck.json").read_text())["summary"]["total"] == 1
        assert "report.recheck.html" in capsys.readouterr().out

    # The passing cell as a run killed with SIGKILL leaves it: no run_ended, no handoff records (they are
    # collected as a run ends), no saved result (written once judged). Judged again: unknown, never a fail
    # for evidence never collected.
    killed = tmp_path / "killed"
    cell = next(p for p in pass_dir.iterdir() if p.is_dir())
    shutil.copytree(cell, killed / cell.name)
    (killed / cell.name / "result.json").unlink()
    history = killed / cell.name / "history.jsonl"
    kept = [ln for ln in history.read_text().splitlines()
            if json.loads(ln)["type"] not in ("handoff", "run_ended", "note")]
    history.write_text("\n".join(kept) + "\n")
    assert cli.main(["report", str(killed)]) == 2
    assert "0 fail, 1 unknown" in capsys.readouterr().out

    # A cell folder with a history cut short (no run_ended), next to the passing cell: unknown -> 2.
    mixed = tmp_path / "mixed"
    cell = next(p for p in pass_dir.iterdir() if p.is_dir())
    shutil.copytree(cell, mixed / cell.name)
    rec = HistoryRecorder(mixed / "cut_short" / "history.jsonl")
    rec.run_started("quick_pass", "1p1d", "mooncake", "http", "reference", seed=0)
    rec.close()
    assert cli.main(["report", str(mixed)]) == 2
    assert "1 pass, 0 fail, 1 unknown -> UNKNOWN" in capsys.readouterr().out


def test_report_on_folder_without_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(capsys, "report", str(tmp_path))
    assert code == cli.EXIT_USAGE
    assert "holds no scenario results" in _one_line_error(err)


def test_report_on_a_folder_of_runs_names_them_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    for name in ("run-a", "run-b"):
        (runs / name).mkdir(parents=True)
        (runs / name / cli.RUN_INFO).write_text("{}")
        rec = HistoryRecorder(runs / name / "cell" / "history.jsonl")
        rec.run_started("quick_pass", "1p1d", "mooncake", "http", "reference", seed=0)
        rec.close()
    (runs / "latest").symlink_to(runs / "run-b")
    code, _, err = _main(capsys, "report", str(runs))
    assert code == cli.EXIT_USAGE
    line = _one_line_error(err)
    assert "is not a run folder but holds 3 of them" in line and str(runs / "latest") in line
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "run-a", "run-b"]  # nothing written there
    code, out, _ = _main(capsys, "report", str(runs / "latest"))  # one of them re-renders as before
    assert code == cli.EXIT_UNKNOWN and "1 unknown" in out


def test_inject_bug_scenarios_need_the_reference_router(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.scenario import RouterSettings, Scenario

    f = tmp_path / "buggy.py"
    f.write_text(
        "from harness.scenario import RouterSettings, Scenario\n"
        "SCENARIOS = [Scenario(name='buggy', description='d',\n"
        "                      router=RouterSettings(inject_bugs=('stale_engine_id',)))]\n"
    )
    code, _, err = _main(capsys, "run", str(f), "--router", "cmd:true --port {port}")
    assert code == cli.EXIT_USAGE
    assert "injects bug 'stale_engine_id'" in _one_line_error(err)
    # In the default suite such a scenario is left out (with a note), not an error.
    buggy = Scenario(name="b", description="", router=RouterSettings(inject_bugs=("stale_engine_id",)))
    plain = Scenario(name="p", description="")
    assert cli._check_router("cmd:true", [buggy, plain], named=False) == [plain]
    assert "skipping b" in capsys.readouterr().err
    assert cli._check_router("reference", [buggy, plain], named=True) == [buggy, plain]


def test_sim_runs_replay_and_fail_with_the_bug(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--world sim`: production settings by default, a replay command per cell, exit 1 with a bug."""
    out = tmp_path / "sim"
    code, stdout, _err = _main(
        capsys,
        "run",
        "prefill_restart_mooncake",
        "--world",
        "sim",
        "--topology",
        "1p1d",
        "--transport",
        "http",
        "--out",
        str(out),
        "--no-progress",
        "--check-determinism",
    )
    assert code == cli.EXIT_PASS, stdout
    doc = json.loads((out / "report.json").read_text())
    (res,) = doc["results"]
    assert (res["world"], res["settings"]) == ("sim", "production") and doc["pdchaos_version"]
    assert res["replay"].startswith("pdchaos run prefill_restart_mooncake --topology 1p1d")
    assert "--world sim --settings production --seed 0" in res["replay"]
    assert any(v["name"] == "determinism" and v["status"] == "pass" for v in res["verdicts"])
    assert "simulated seconds" in (out / "report.html").read_text()
    bad = tmp_path / "bad"
    code, stdout, _err = _main(
        capsys,
        "run",
        "prefill_restart_mooncake",
        "--world",
        "sim",
        "--topology",
        "1p1d",
        "--transport",
        "http",
        "--out",
        str(bad),
        "--no-progress",
        "--inject-bug",
        "stale_engine_id",
    )
    assert code == cli.EXIT_FAIL, stdout
    assert (
        "replay: pdchaos run prefill_restart_mooncake" in stdout and "--inject-bug stale_engine_id" in stdout
    )
    # The terminal ends with the findings; the finding's own replay line gives the same finding again.
    [finding] = json.loads((bad / "report.json").read_text())["findings"]
    tail = stdout.strip().splitlines()
    head = next(i for i, line in enumerate(tail) if line.startswith("pdchaos: 1 finding(s)"))
    assert tail[head - 1].startswith("pdchaos: 1 cell: 0 pass, 1 fail")
    assert tail[-1] == f"     replay: {finding['replay']}"
    again = tmp_path / "again"
    replay = shlex.split(finding["replay"])[1:]
    code, stdout, _err = _main(capsys, *replay, "--out", str(again), "--no-progress")
    assert code == cli.EXIT_FAIL, stdout
    assert [f["id"] for f in json.loads((again / "report.json").read_text())["findings"]] == [finding["id"]]


def test_list_says_which_worlds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = _main(capsys, "list", "--json")
    assert code == cli.EXIT_PASS
    listed = {s["name"]: s for s in json.loads(out)}
    assert listed["prefill_restart_mooncake"]["worlds"] == ["real", "sim"]
    assert listed["prefill_restart_mooncake"]["suite_worlds"] == ["real", "sim"]
    # A contract workout runs in both worlds when named, but only the simulated default suite holds it.
    assert listed["breaker_trials"]["worlds"] == ["real", "sim"]
    assert listed["breaker_trials"]["suite_worlds"] == ["sim"]
    _code, text, _err = _main(capsys, "list")
    line = next(x for x in text.splitlines() if x.startswith("* breaker_trials"))
    assert "worlds: real/sim; default suite: sim only" in line


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("from harness.scenario import Scenario\nSCENARIOS = [Scenario(name=5, description='x')]\n",
         "name: expected str, got 5"),
        ("import sys\nsys.exit(0)\n", "exited while being imported"),
    ],
    ids=["type", "sys-exit"],
)
def test_a_fresh_process_prints_one_line_and_exits_3(tmp_path: Path, source: str, needle: str) -> None:
    """Issue 16, through the command itself: no traceback (it was exit 1) and no silent exit 0."""
    f = tmp_path / "case.py"
    f.write_text(source)
    proc = _pdchaos("run", str(f), "--out", str(tmp_path / "out"), cwd=tmp_path)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == cli.EXIT_USAGE, err
    assert needle in _one_line_error(err) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", cli.command_names())
def test_every_command_s_bad_flag_is_a_usage_error(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # argparse's own status, 2, reads as an unknown verdict here.
    try:
        code = cli.main([command, "--no-such-flag"])
    except SystemExit as stop:
        code = stop.code
    assert code == cli.EXIT_USAGE
    assert "(see pdchaos" in capsys.readouterr().err


def test_a_listing_whose_reader_went_away_ends_quietly() -> None:
    """`pdchaos list | head -1`: the reader goes away before the listing ends; no traceback, status 0."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "list"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the listing is written (the command takes a while to import)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_list_names_each_scenario_s_checks_and_the_switches_it_catches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["list", "--json"]) == 0
    listed = {s["name"]: s for s in json.loads(capsys.readouterr().out)}
    two = listed["prefill_restart_mooncake"]
    assert "transfer_timeout" in two["checks"] and "stale_engine_id" in two["catches"]
    assert cli.main(["list", "prefill_restart_mooncake"]) == 0
    text = capsys.readouterr().out
    assert "checks: " in text and "fails under --inject-bug: " in text and "stale_engine_id" in text


def test_an_out_path_that_is_a_dangling_link_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    code, _, err = _main(capsys, "run", "--out", str(tmp_path / "gone"))
    assert code == cli.EXIT_USAGE and "is a link to nothing" in _one_line_error(err)


@pytest.mark.parametrize("argv", [
    ["run"],
    ["zoo", "--bug", "stale_engine_id", "prefill_restart_mooncake"],
    ["matrix", "--router", "reference", "prefill_restart_mooncake"],
    ["bisect", "prefill_restart_mooncake", "--good", "1.13.0", "--bad", "1.10.1", "--transport", "grpc"],
    ["search"],
    ["sweep", "ci-regression"],
    ["fidelity", "--real", "command:examples/engines/local-fake.toml", "--probes", "health"],
], ids=lambda a: a[0])
def test_an_out_path_that_is_a_file_is_a_usage_error(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    taken = tmp_path / "a-file"
    taken.write_text("mine\n")
    code, _, err = _main(capsys, *argv, "--out", str(taken))
    assert code == cli.EXIT_USAGE, err
    assert "is not a folder" in _one_line_error(err) and taken.read_text() == "mine\n"


def test_fidelity_without_vllm_says_so_before_probing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PDCHAOS_VLLM_HOME", str(tmp_path / "no-vllm-here"))
    code, _, err = _main(capsys, "fidelity", "--real", "vllm", "--out", str(tmp_path / "f"))
    assert code == cli.EXIT_USAGE and "no vLLM installation" in _one_line_error(err)
    assert not (tmp_path / "f").exists()  # nothing probed, nothing written


def test_fidelity_ctrl_c_is_an_unknown_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.fidelity import cli as fidelity_cli

    async def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fidelity_cli, "_probe_backend", interrupted)
    monkeypatch.chdir(ROOT)
    code, _, err = _main(capsys, "fidelity", "--real", "command:examples/engines/local-fake.toml",
                         "--out", str(tmp_path / "f"))
    assert code == 2 and "interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("pool", ["abc", "20000-20002", "80-90"])
def test_a_bad_port_pool_is_a_usage_error_before_anything_starts(
    pool: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PDCHAOS_PORT_POOL", pool)
    code, _, err = _main(capsys, "run", str(PASS_FILE), "--out", str(tmp_path / "r"))
    assert code == cli.EXIT_USAGE and "PDCHAOS_PORT_POOL" in _one_line_error(err)
    assert not (tmp_path / "r").exists()


def test_cluster_engines_with_no_cluster_to_reach_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    code, _, err = _main(capsys, "run", "sole_prefill_down", "--topology", "1p1d", "--connector", "mooncake",
                         "--transport", "http", "--engines", f"k8s:{ROOT / 'examples/engines/k8s-fake.toml'}",
                         "--out", str(tmp_path / "r"))
    assert code == cli.EXIT_USAGE and "no cluster to reach" in _one_line_error(err)


def test_list_marks_only_the_default_suite_whatever_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--json", "prefill_replaced_same_address", "prefill_restart_mooncake"]) == 0
    listed = {s["name"]: s["default"] for s in json.loads(capsys.readouterr().out)}
    assert listed == {"prefill_replaced_same_address": False, "prefill_restart_mooncake": True}
    assert cli.main(["list", str(PASS_FILE)]) == 0
    assert not capsys.readouterr().out.startswith("*")  # a file's scenario is in no default suite


def test_report_of_a_folder_with_nothing_in_it_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _main(capsys, "report", str(tmp_path))
    assert code == cli.EXIT_USAGE and "holds no scenario results" in err
    assert list(tmp_path.iterdir()) == []


def test_a_named_scenario_with_no_cell_here_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken").write_text("x")  # stops the run after planning: nothing runs
    code, _, err = _main(capsys, "run", "metadata_wedged", "sole_prefill_down", "--transport", "http",
                         "--out", str(tmp_path))
    assert code == cli.EXIT_USAGE
    assert "metadata_wedged: no cell with the --topology/--connector/--transport given" in err


def test_list_names_the_default_checks_of_a_scenario_that_names_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.checkers import DEFAULT_CHECKS

    mine = tmp_path / "plain.py"
    mine.write_text("from harness.scenario import Scenario\n"
                    "SCENARIOS = [Scenario(name='plain', description='d')]\n")
    assert cli.main(["list", "--json", str(mine)]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["checks"] == list(DEFAULT_CHECKS)


def test_report_of_a_zoo_or_search_folder_points_at_its_own_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, search = tmp_path / "zoo", tmp_path / "search"
    (zoo / "cells").mkdir(parents=True)
    (zoo / "plan.json").write_text("{}")
    (search / "work").mkdir(parents=True)
    (search / "summary.json").write_text("{}")
    for folder, says in ((zoo, "pdchaos zoo --rejudge"), (search, "is a search folder")):
        code, _, err = _main(capsys, "report", str(folder))
        assert code == cli.EXIT_USAGE and says in _one_line_error(err)
        assert not (folder / "report.json").exists()


def test_the_module_tools_refuse_what_they_cannot_do(capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --only ran nothing and printed the stored table as if all agreed; a fake cluster node on a
    non-loopback address was accepted."""
    from harness import agreement, profile_check
    from harness.kube.fake_cluster.__main__ import parse_args

    assert agreement.main(["--dry-run", "--world", "sim", "--only", "nosuch"]) == 2
    assert "unknown scenario(s) nosuch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        profile_check.main(["--dry-run", "--only", "nosuch"])
    assert info.value.code == 2 and "unknown scenario(s) nosuch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        parse_args(["--root", "/tmp/x", "--kubeconfig", "/tmp/x/k", "--node-host", "0.0.0.0"])
    assert info.value.code == 2 and "loopback" in capsys.readouterr().err


def test_a_signal_ignored_at_start_stays_ignored() -> None:
    """`nohup pdchaos run ...`: a SIGHUP must not tear the run down."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert signal.SIGHUP not in cli.handled_signals()
        assert signal.SIGTERM in cli.handled_signals()
    finally:
        signal.signal(signal.SIGHUP, before)
    # Handled again once it is not ignored (unless this test itself runs under nohup).
    assert (signal.SIGHUP in cli.handled_signals()) == (before is not signal.SIG_IGN)


def test_repeat_runs_each_cell_again_and_reports_it_once(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rep"
    code, stdout, err = _main(capsys, "run", "late_pull_after_kv_abort", "--topology", "1p1d", "--connector",
                              "mooncake", "--transport", "http", "--repeat", "2", "--out", str(out),
                              "--no-progress")
    assert code == cli.EXIT_PASS, stdout + err
    assert "1 cell from 1 scenario, 2 runs each" in err
    (res,) = json.loads((out / "report.json").read_text())["results"]
    assert [r["status"] for r in res["runs"]] == ["pass", "pass"]
    assert [r["cell_dir"] for r in res["runs"]] == ["late_pull_after_kv_abort__1p1d-mooncake-http__run1",
                                                    "late_pull_after_kv_abort__1p1d-mooncake-http__run2"]
    assert all((out / r["cell_dir"] / "history.jsonl").is_file() for r in res["runs"])
    assert all(v["numbers"]["runs"] == ["pass", "pass"] for v in res["verdicts"])


@pytest.mark.parametrize(("argv", "words"), [
    (["--repeat", "0"], "--repeat must be at least 1"),
    (["--repeat", "2", "--world", "sim"], "a simulated run replays exactly"),
])
def test_a_repeat_that_cannot_split_is_a_usage_error(argv: list[str], words: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _main(capsys, "run", "late_pull_after_kv_abort", *argv, "--out", str(tmp_path / "x"))
    assert code == cli.EXIT_USAGE and words in err
