"""The corpus of malformed scenarios and flags (issue 16): every case exits 3 with one line that names the
problem, before any process starts (the runner is replaced by one that fails the test if reached, and the
run folder is never created).

Scenario cases are one `Scenario(...)` each, written into a file from the `BASE` template (a valid 1p1d
scenario) with one field or timeline step changed; file cases are whole files; flag cases are argv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.paths import SCENARIO_FILES

from harness import cli

PASS_FILE = SCENARIO_FILES / "cli_scenario_pass.py"

HEADER = """\
from harness.scenario import *
from harness.scenario import Expect, Scenario, Step
"""
# A valid scenario; `{extra}` adds or overrides keyword arguments.
BASE = """\
SCENARIOS = [Scenario(**{{**dict(
    name="corpus", description="one malformed field", topologies=("1p1d",), connectors=("mooncake",),
    transports=("http",), workload=Workload(duration_s=1.0, max_tokens=4)), **dict({extra})}})]
"""


def _step(action: str, when: str = "At(0.5)", deadline: str = "None", name: str = "s") -> str:
    return f"timeline=(Step({name!r}, {action}, {when}, deadline_s={deadline}),)"


# (id, keyword arguments given to the base scenario, a piece of the one error line)
SCENARIO_CASES: list[tuple[str, str, str]] = [
    ("name-int", "name=5", "name: expected str, got 5"),
    ("name-chars", "name='bad name!'", "bad scenario name"),
    ("description-none", "description=None", "description: expected str"),
    ("topologies-str", "topologies='1p1d'", "topologies: expected tuple of str"),
    ("topologies-int", "topologies=(1,)", "topologies[0]: expected str"),
    ("topology-bad", "topologies=('0p1d',)", "bad topology '0p1d'"),
    ("connector-bad", "connectors=('rdma',)", "bad connector 'rdma'"),
    ("transport-bad", "transports=('tcp',)", "bad transport 'tcp'"),
    ("tags-str", "tags='default'", "tags: expected tuple of str"),
    ("worlds-bad", "worlds=('moon',)", "unknown world 'moon'"),
    ("catches-typo", "catches=('typo_bug',)", "catches unknown bug 'typo_bug'"),
    ("min-duration-negative", "min_duration_s=-1.0", "min_duration_s must be >= 0"),
    ("ready-timeout-zero", "ready_timeout_s=0", "ready_timeout_s must be > 0"),
    ("deferred-missing", "deferred_engines=('decode-3',)", "engine 'decode-3' not in 1p1d"),
    ("preset-unknown", "preset_overrides={'staging': {}}", "unknown preset 'staging'"),
    ("preset-field", "preset_overrides={'production': {'router': {'bogus': 1}}}",
     "router.bogus: unknown RouterSettings field"),
    ("preset-scale", "preset_overrides={'production': {'time_scale': 0}}", "time_scale must be a number > 0"),
    # expectations
    ("expect-tuple", "expect=('recovery', 5)", "expect[0]: expected Expect, got 'recovery'"),
    ("expect-params-int", "expect=(Expect('recovery', 5),)", "params: expected a mapping"),
    ("expect-unknown", "expect=(Expect('recover'),)", "unknown checker 'recover'"),
    ("expect-negative", "expect=(Expect('recovery', {'max_recovery_s': -3}),)",
     "recovery: max_recovery_s must be >= 0"),
    ("expect-nan", "expect=(Expect('recovery', {'max_recovery_s': float('nan')}),)",
     "must be a finite number"),
    ("expect-str-number", "expect=(Expect('recovery', {'max_recovery_s': '3'}),)", "must be a number"),
    ("expect-unknown-param", "expect=(Expect('recovery', {'max_recovery': 3}),)", "unknown parameter"),
    ("expect-kinds-str", "expect=(Expect('recovery', {'kinds': 'restart'}),)",
     "kinds must be a list of names"),
    ("expect-fault-name", "expect=(Expect('recovery', {'faults': ['nostep']}),)",
     "faults names no timeline step 'nostep'"),
    ("expect-ratio", "expect=(Expect('availability', {'during': 1.5}),)", "ratio within [0, 1]"),
    ("expect-bool", "expect=(Expect('recovery', {'require_ready': 1}),)", "must be true/false"),
    # timeline: types
    ("timeline-str", "timeline=('restart',)", "timeline[0]: expected Step, got 'restart'"),
    ("action-str", _step("'restart'"), "action: expected"),
    ("when-number", _step("Restart('prefill-0')", when="1.0"), "when: expected"),
    ("restart-mode", _step("Restart('prefill-0', mode='bogus')"), "must be one of 'control', 'process'"),
    ("restart-down-str", _step("Restart('prefill-0', down_s='5')"), "down_s: expected a number"),
    ("crash-mode", _step("Crash('decode-0', mode='hard')"), "must be one of 'control', 'signal'"),
    ("wedge-mode", _step("Wedge('decode-0', mode='freeze')"), "must be one of 'control', 'sigstop'"),
    # timeline: values
    ("restart-down-negative", _step("Restart('prefill-0', down_s=-5)"), "down_s must be >= 0"),
    ("slow-start-negative", _step("SlowStart('prefill-0', refuse_s=-1)"), "refuse_s must be >= 0"),
    ("die-negative", _step("Die('decode-0', exit_after_s=-1)"), "exit_after_s must be >= 0"),
    ("wedge-surface", _step("Wedge('decode-0', 'kitchen')"), "unknown wedge surface 'kitchen'"),
    ("fault-kind", _step("EngineFault('decode-0', 'explode')"), "unknown engine fault kind 'explode'"),
    ("fault-count", _step("EngineFault('decode-0', 'fail_requests', {'count': 0})"), "count must be"),
    ("fault-latency", _step("EngineFault('decode-0', 'latency', {'ms': -5})"), "ms must be >= 0"),
    ("target-missing", _step("Restart('prefill-5')"), "target 'prefill-5' not in 1p1d"),
    ("pause-length", _step("PauseRouter(0)"), "pause_s must be > 0"),
    ("pause-target", _step("PauseRouter(1.0, target='prefill-0')"), "a router pause targets 'router'"),
    ("add-mistake-unnamed", _step("AddWorker('prefill-0', {'url': 'x'})"), "needs both `mistake`"),
    ("add-refused-elsewhere", _step("AddWorker('prefill-0', {'url': 'x'}, refused='role')"),
     "refused='role' names no field of the mistake"),
    ("at-negative", _step("Restart('prefill-0')", when="At(-1)"), "At(-1) is negative"),
    ("after-dangling", _step("Restart('prefill-0')", when="After('nope')"), "After('nope') names no earlier"),
    ("status-unknown", _step("Restart('prefill-0')", when="WorkerStatus('decode-0', 'up')"),
     "unknown worker status 'up'"),
    ("deadline-negative", _step("Restart('prefill-0')", deadline="-1"), "deadline_s -1 is negative"),
    ("deadline-before-at", _step("Restart('prefill-0')", when="At(5.0)", deadline="1.0"),
     "cannot fire before t=5 s but its deadline is t=1 s"),
    ("deadline-after-chain",
     "timeline=(Step('a', Restart('prefill-0'), At(2.0)), Step('b', Heal('decode-0'), After('a', 3.0), "
     "deadline_s=4.0))", "step 'b': cannot fire before t=5 s"),
    ("requests-unreachable", _step("Restart('prefill-0')", when="RequestsCompleted(10**9)", deadline="1.0"),
     "RequestsCompleted(1000000000) cannot hold"),
    ("requests-never", _step("Restart('prefill-0')", when="RequestsCompleted(10**9)"), "in the whole run"),
    ("step-duplicate",
     "timeline=(Step('x', Crash('decode-0'), At(1)), Step('x', Respawn('decode-0'), At(2)))",
     "duplicate step name 'x'"),
    ("partition-mode", _step("Partition('decode-0', mode='sideways')"), "partition mode 'sideways'"),
    ("bandwidth-zero", _step("LinkBandwidth('prefill-0', rate_kb_s=0)"), "rate_kb_s must be > 0"),
    ("latency-float", _step("LinkLatency('decode-0', latency_ms=1.5)"), "latency_ms: expected an integer"),
    # workload
    ("max-tokens-negative", "workload=Workload(max_tokens=-5)", "workload.max_tokens must be >= 1"),
    ("max-tokens-huge", "workload=Workload(max_tokens=10**9)", "do not fit the engines' context"),
    ("duration-zero", "workload=Workload(duration_s=0)", "duration and deadline must be positive"),
    ("mode-bad", "workload=Workload(mode='burst')", "must be one of 'open', 'closed'"),
    ("stream-fraction", "workload=Workload(stream_fraction=2)", "within [0, 1]"),
    ("mistake-fraction", "workload=Workload(mistake_fraction=-0.1)", "mistake_fraction must be within"),
    ("stop-fraction", "workload=Workload(stop_fraction=1.5)", "stop_fraction must be within"),
    ("completion-tokens-fraction", "workload=Workload(completion_tokens_fraction=1.5)",
     "completion_tokens_fraction must be within"),
    ("prompt-words-order", "workload=Workload(prompt_words=(5, 2))", "bad prompt_words range"),
    ("prompt-words-short", "workload=Workload(prompt_words=(5,))", "prompt_words: expected tuple (int, int)"),
    ("concurrency-zero", "workload=Workload(concurrency=0)", "concurrency >= 1"),
    ("think-negative", "workload=Workload(think_time_s=-1)", "think_time_s must be >= 0"),
    ("rate-zero", "workload=Workload(mode='open', rate_rps=0)", "rate_rps > 0"),
    ("after-heal-open", "workload=Workload(mode='open', after_heal_s=2.0)", "needs a closed-loop workload"),
    ("after-heal-zero", "workload=Workload(after_heal_s=0)", "after_heal_s must be positive"),
    # router settings
    ("health-interval-negative", "router=RouterSettings(health_interval_s=-1)",
     "health_interval_s must be > 0"),
    ("health-timeout-zero", "router=RouterSettings(health_timeout_s=0)", "health_timeout_s must be > 0"),
    ("failure-threshold-zero", "router=RouterSettings(failure_threshold=0)",
     "failure_threshold must be >= 1"),
    ("policy-unknown", "router=RouterSettings(prefill_policy='fastest')", "prefill_policy 'fastest'"),
    ("request-timeout", "router=RouterSettings(request_timeout_s=-1)", "request_timeout_s must be > 0"),
    ("threshold-float", "router=RouterSettings(success_threshold=1.5)", "expected an integer"),
    # engine settings
    ("transfer-timeout-zero", "engines=EngineSettings(transfer_timeout_s=0)",
     "transfer_timeout_s must be > 0"),
    ("load-policy", "engines=EngineSettings(load_failure_policy='retry')",
     "must be one of 'fail', 'recompute'"),
    ("per-engine-missing", "engines=EngineSettings(per_engine={'decode-9': {'load_time_s': 1.0}})",
     "names 'decode-9', which no topology"),
    ("per-engine-key", "engines=EngineSettings(per_engine={'decode-0': {'load_time': 1.0}})",
     "unknown engine setting"),
    ("per-engine-value", "engines=EngineSettings(per_engine={'decode-0': {'load_time_s': -1.0}})",
     "load_time_s must be >= 0"),
]

# (id, whole file, a piece of the error line)
FILE_CASES: list[tuple[str, str, str]] = [
    ("sys-exit-0", "import sys\nsys.exit(0)\n", "exited while being imported (sys.exit(0))"),
    ("sys-exit-text", "raise SystemExit('bye')\n", "exited while being imported"),
    ("scenarios-int", "SCENARIOS = 5\n", "must be a list"),
    ("scenarios-items", "SCENARIOS = [5]\n", "SCENARIOS[0] is a int, not a Scenario"),
    ("no-scenarios", "X = 1\n", "defines no SCENARIOS"),
    ("syntax", "SCENARIOS = [\n", "failed to import: SyntaxError"),
    ("import", "import nonexistent_module_xyz\n", "failed to import: ModuleNotFoundError"),
    ("raises", "raise RuntimeError('boom\\nsecond line')\n",
     "failed to import: RuntimeError: boom second line"),
    ("empty", "SCENARIOS = []\n", "case.py: SCENARIOS is empty: no scenario to run"),
    ("same-name-one-file",
     HEADER + "SCENARIOS = [Scenario(name='twin', description=''), Scenario(name='twin', description='')]\n",
     "scenario name 'twin' defined twice"),
]


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own exits
        code = int(e.code or 0)
    return code, capsys.readouterr().err


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reaching the runner, the process supervisor or the router adapters' launch fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a run started for a malformed case")

    monkeypatch.setattr(cli, "_run_async", refuse)
    monkeypatch.setattr("harness.worlds.real.processes.ProcessSupervisor.spawn", refuse)


def _assert_usage_error(code: int, err: str, needle: str, out: Path) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == cli.EXIT_USAGE, err
    assert len(lines) == 1, err
    assert lines[0].startswith("pdchaos") and "Traceback" not in err
    assert needle in lines[0], lines[0]
    assert not out.exists(), "the run folder was created for a malformed case"


@pytest.mark.parametrize(
    ("extra", "needle"), [c[1:] for c in SCENARIO_CASES], ids=[c[0] for c in SCENARIO_CASES]
)
def test_malformed_scenario_exits_3_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, needle: str
) -> None:
    f = tmp_path / "case.py"
    f.write_text(HEADER + BASE.format(extra=extra))
    out = tmp_path / "out"
    code, err = _run(capsys, ["run", str(f), "--out", str(out), "--no-progress"])
    _assert_usage_error(code, err, needle, out)
    assert str(f) in err  # the file is named


@pytest.mark.parametrize(("source", "needle"), [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_malformed_scenario_file_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, needle: str
) -> None:
    f = tmp_path / "case.py"
    f.write_text(source)
    out = tmp_path / "out"
    code, err = _run(capsys, ["run", str(f), "--out", str(out)])
    _assert_usage_error(code, err, needle, out)


def _twin(tmp_path: Path, stem: str, name: str) -> str:
    f = tmp_path / f"{stem}.py"
    f.write_text(HEADER + f"SCENARIOS = [Scenario(name={name!r}, description='')]\n")
    return str(f)


def _binary(tmp_path: Path) -> str:
    f = tmp_path / "binary.py"
    f.write_bytes(b"\xff\xfe\x00garbage\x00" * 20)
    return str(f)


def _not_empty(tmp_path: Path) -> str:
    d = tmp_path / "busy"
    d.mkdir()
    (d / "old.txt").write_text("x")
    return str(d)


def _a_file(tmp_path: Path) -> str:
    f = tmp_path / "notes.md"
    f.write_text("not a run")
    return str(f)


PASS = str(PASS_FILE)
# (id, argv builder, a piece of the error line); the run folder is tmp/out unless the case gives --out.
FLAG_CASES: list[tuple[str, Any, str]] = [
    ("two-files-one-name", lambda t: ["run", _twin(t, "a", "same"), _twin(t, "b", "same")],
     "scenario name 'same' comes from both"),
    ("file-reuses-shipped-name", lambda t: ["run", "steady_round_robin", _twin(t, "mine",
     "steady_round_robin")],
     "scenario name 'steady_round_robin' comes from both"),
    ("missing-file", lambda t: ["run", str(t / "missing.py")], "no such scenario file"),
    ("binary-file", lambda t: ["run", _binary(t)], "failed to import"),
    ("unknown-scenario", lambda t: ["run", "no_such_scenario"], "unknown scenario 'no_such_scenario'"),
    ("topology-shape", lambda t: ["run", PASS, "--topology", "3x"], "bad topology '3x'"),
    ("topology-zero", lambda t: ["run", PASS, "--topology", "0p1d"], "bad topology '0p1d'"),
    ("topology-empty", lambda t: ["run", PASS, "--topology", ","], "--topology given without a topology"),
    ("topology-unused", lambda t: ["run", PASS, "--topology", "2p2d"], "no selected scenario applies"),
    ("transport-unused", lambda t: ["run", PASS, "--transport", "grpc"], "no selected scenario applies"),
    ("router-unknown", lambda t: ["run", PASS, "--router", "nginx"], "unknown router 'nginx'"),
    ("router-cmd-missing", lambda t: ["run", PASS, "--router", "cmd:/nonexistent/router --port {port}"],
     "not executable"),
    ("router-cmd-placeholder", lambda t: ["run", PASS, "--router", "cmd:true --port {prot}"],
     "unknown placeholder"),
    ("router-cmd-quote", lambda t: ["run", PASS, "--router", "cmd:echo 'unbalanced {port}"],
     "No closing quotation"),
    ("router-cmd-empty", lambda t: ["run", PASS, "--router", "cmd:"], "empty router command template"),
    ("router-cmd-blank", lambda t: ["run", PASS, "--router", "cmd:   "], "empty router command template"),
    ("connector-choice", lambda t: ["run", PASS, "--connector", "rdma"], "invalid choice: 'rdma'"),
    ("transport-choice", lambda t: ["run", PASS, "--transport", "tcp"], "invalid choice: 'tcp'"),
    ("seed-text", lambda t: ["run", PASS, "--seed", "x"], "a seed is a whole number"),
    ("world-choice", lambda t: ["run", PASS, "--world", "moon"], "invalid choice: 'moon'"),
    ("settings-choice", lambda t: ["run", PASS, "--settings", "staging"], "invalid choice: 'staging'"),
    ("determinism-real", lambda t: ["run", PASS, "--check-determinism"],
     "--check-determinism needs --world sim"),
    ("sim-gateway", lambda t: ["run", PASS, "--world", "sim", "--router", "smg==1.13.0"],
     "the simulated world runs the reference router"),
    ("inject-unknown", lambda t: ["run", PASS, "--inject-bug", "no_such_bug"], "no_such_bug"),
    ("out-not-empty", lambda t: ["run", PASS, "--out", _not_empty(t)], "already exists and is not empty"),
    ("report-missing", lambda t: ["report", str(t / "absent")], "no run folder"),
    ("report-a-file", lambda t: ["report", _a_file(t)], "is a file, not a run folder"),
    ("list-unknown", lambda t: ["list", "no_such_scenario"], "unknown scenario 'no_such_scenario'"),
    ("command-unknown", lambda t: ["bogus"], "invalid choice: 'bogus'"),
]


@pytest.mark.parametrize(("argv", "needle"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES])
def test_malformed_flags_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: Any, needle: str
) -> None:
    args = argv(tmp_path)
    if args[0] == "run" and "--out" not in args:
        args = [*args, "--out", str(tmp_path / "out")]
    code, err = _run(capsys, args)
    _assert_usage_error(code, err, needle, tmp_path / "out")


def test_corpus_size() -> None:
    """The issue asks for at least 60 malformed scenarios and flags."""
    assert len(SCENARIO_CASES) + len(FILE_CASES) + len(FLAG_CASES) >= 60


def test_production_preset_problems_are_found_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scenario valid as written whose production override is not (a negative interval) fails before the
    run, at the preset it would run at."""
    f = tmp_path / "case.py"
    f.write_text(HEADER + BASE.format(extra="preset_overrides={'production': {'router': "
                                            "{'health_interval_s': -1.0}}}"))
    out = tmp_path / "out"
    code, err = _run(capsys, ["run", str(f), "--world", "sim", "--out", str(out)])
    _assert_usage_error(code, err, "at --settings production", out)
    assert "health_interval_s must be > 0" in err
