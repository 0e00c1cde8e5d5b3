"""Engine backends: choosing one, what each can run (skipped with the reason, never passed), how a scenario
is adapted to real engines."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.scenario import (
    Crash,
    Die,
    EngineFault,
    Heal,
    Respawn,
    Restart,
    SlowStart,
    Step,
    Wedge,
    load_scenarios,
)
from harness.scenario.conditions import At
from harness.worlds.real.backends import (
    OUTPUT_NOT_JUDGED,
    REAL_AFTER_HEAL_S,
    REAL_HEALTH_INTERVAL_S,
    REAL_HEALTH_TIMEOUT_S,
    VLLM_PULL_TIMEOUT_S,
    VLLM_START_S,
    EngineChoice,
    EngineChoiceError,
    adapt,
    not_applicable,
    parse_engines,
)
from harness.worlds.real.command_engines import TemplateError, load_templates

SCEN = {s.name: s for s in load_scenarios()}


def _with(action) -> object:
    return replace(SCEN["decode_crash"], timeline=(Step("x", action, At(1.0)),))


def test_parse_engines(tmp_path: Path) -> None:
    assert parse_engines(None) == EngineChoice("fake")
    assert parse_engines("vllm").kind == "vllm"
    with pytest.raises(EngineChoiceError, match="known: fake, vllm, command:FILE"):
        parse_engines("sglang")
    with pytest.raises(EngineChoiceError, match="no file"):
        parse_engines(f"command:{tmp_path / 'missing.toml'}")
    f = tmp_path / "t.toml"
    f.write_text('start = "run {name} {http_port}"\nserves = "fake"\n')
    choice = parse_engines(f"command:{f}")
    assert choice.kind == "command" and choice.label == f"command:{f}" and choice.text_known


def test_an_engines_file_given_relative_is_named_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The label goes into the replay command, which must work from any folder."""
    (tmp_path / "t.toml").write_text('start = "run {name} {http_port}"\nserves = "fake"\n')
    monkeypatch.chdir(tmp_path)
    assert parse_engines("command:t.toml").label == f"command:{(tmp_path / 't.toml').resolve()}"


@pytest.mark.parametrize(("text", "match"), [
    ("kill = 'x'", "`start`"),
    ("start = 'x'\nbogus = 1", "unknown keys"),
    ("start = 'x {nmae}'", "bad placeholder"),
    ("start = 'x'\nserves = 'sglang'", "serves"),
    ("start = 'x'\nready_timeout_s = -1", "positive"),
    ("start = [", "t.toml"),
])
def test_bad_template_files_are_said_at_once(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(TemplateError, match=match):
        load_templates(f)
    # What `--engines command:FILE` says: one usage line, before anything starts.
    with pytest.raises(EngineChoiceError, match=match):
        parse_engines(f"command:{f}")


def test_a_template_file_that_is_not_text_is_said_at_once(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_bytes(b"\xff\xfestart = 'x'\n")
    with pytest.raises(EngineChoiceError, match=r"t\.toml: 'utf-8' codec"):
        parse_engines(f"command:{f}")


@pytest.mark.parametrize("action", [
    EngineFault("decode-0", "fail_requests", {"count": 1}), Die("decode-0"), SlowStart("decode-0", 1.0),
    Wedge("decode-0", mode="control"), Crash("decode-0", mode="control"), Heal("decode-0", "fail_requests"),
])
def test_control_api_faults_are_not_applicable_on_real_engines(action: object) -> None:
    why = not_applicable(EngineChoice("vllm"), _with(action), "nixl", "http")
    assert why is not None and "no fault control API" in why
    assert not_applicable(EngineChoice("fake"), _with(action), "nixl", "http") is None


@pytest.mark.parametrize("action", [
    Crash("decode-0"), Respawn("decode-0"), Wedge("decode-0", mode="sigstop"), Heal("decode-0"),
    Restart("decode-0", down_s=0.5), Restart("decode-0", mode="process"),
])
def test_process_faults_run_on_every_backend(action: object) -> None:
    assert not_applicable(EngineChoice("vllm"), _with(action), "nixl", "http") is None


def test_side_channel_link_faults_need_the_fakes_but_router_links_do_not() -> None:
    side = SCEN["side_channel_reset_during_pull"]
    why = not_applicable(EngineChoice("vllm"), side, "nixl", "http")
    assert why is not None and "side channel" in why
    assert not_applicable(EngineChoice("fake"), side, "nixl", "http") is None
    assert not_applicable(EngineChoice("vllm"), SCEN["prefill_link_partitioned"], "nixl", "http") is None


def test_vllm_cells_need_nixl_over_http_and_no_engine_switch() -> None:
    s = SCEN["decode_crash"]
    vllm = EngineChoice("vllm")
    assert "MooncakeConnector needs an accelerator" in not_applicable(vllm, s, "mooncake", "http")
    assert not_applicable(EngineChoice("vllm"), s, "nixl", "grpc") is None  # vLLM's gRPC server, relayed
    buggy = replace(s, engines=replace(s.engines, inject_bugs=("kv_freed_while_read",)))
    assert "engine bug switches" in not_applicable(EngineChoice("vllm"), buggy, "nixl", "http")
    loading = replace(s, engines=replace(s.engines, load_time_s=2.0))
    assert "loading time" in not_applicable(EngineChoice("vllm"), loading, "nixl", "http")


def test_every_shipped_scenario_is_runnable_or_says_why_on_vllm() -> None:
    runnable = {n for n, s in SCEN.items() if not_applicable(EngineChoice("vllm"), s, "nixl", "http") is None}
    assert {"prefill_restart_nixl", "prefill_process_frozen", "decode_crash", "sole_prefill_down"} <= runnable
    assert "prefill_fails_requests" not in runnable


def test_adapt_keeps_fakes_as_they_are_and_says_what_changes_on_vllm() -> None:
    s = SCEN["sole_prefill_down"]
    assert adapt(EngineChoice("fake"), s) == (s, [])
    real, notes = adapt(EngineChoice("vllm"), s)
    assert real.workload.after_heal_s == REAL_AFTER_HEAL_S
    assert real.engines.transfer_timeout_s == VLLM_PULL_TIMEOUT_S
    assert not any(x.checker == "output" for x in real.expect)
    assert real.router.health_interval_s == REAL_HEALTH_INTERVAL_S
    assert real.router.health_timeout_s == REAL_HEALTH_TIMEOUT_S
    assert OUTPUT_NOT_JUDGED in notes and len(notes) == 4
    slow_probes = replace(s, router=replace(s.router, health_interval_s=5.0, health_timeout_s=3.0))
    kept, notes = adapt(EngineChoice("vllm"), slow_probes)
    assert (kept.router.health_interval_s, kept.router.health_timeout_s) == (5.0, 3.0) and len(notes) == 3


def test_availability_settles_longer_when_probes_are_slowed() -> None:
    s = SCEN["prefill_restart_nixl"]  # probes every 0.3 s, after-window 1 s after the heal
    real, notes = adapt(EngineChoice("vllm"), s)
    (avail,) = [x for x in real.expect if x.checker == "availability"]
    assert avail.params["settle_s"] == round(1.0 * REAL_HEALTH_INTERVAL_S / 0.3, 3)
    assert real.workload.after_heal_s >= avail.params["settle_s"] + 3.0  # the window still has requests
    assert any("after-window" in n for n in notes)


def test_an_action_waits_at_least_as_long_as_an_engine_start_on_slow_engines() -> None:
    from harness.session.session import ACTION_S, ENGINES_UP_S, _action_budget

    restart = Restart("prefill-0", down_s=2.0)
    assert _action_budget(restart) == ACTION_S + 2.0  # the fakes: unchanged
    assert _action_budget(restart, VLLM_START_S) == VLLM_START_S + ENGINES_UP_S + 2.0
