"""Topology parsing, scenario validation and loading, timeline firing rules, router launch lines."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from harness.routers import CommandRouter, ReferenceRouter, RouterAdapterError, make_router_adapter
from harness.runner import expectation_problems
from harness.scenario import (
    INJECTABLE_BUGS,
    After,
    AllOf,
    At,
    Crash,
    EngineFault,
    Expect,
    Heal,
    Observed,
    RequestsCompleted,
    Respawn,
    Restart,
    RouterSettings,
    Scenario,
    ScenarioError,
    Step,
    Timeline,
    Wedge,
    WorkerStatus,
    Workload,
    action_kind,
    holds,
    load_scenarios,
    scenarios_in_file,
    validate,
)
from harness.session.requests import ABSENT_STOP, expected_text, plan_request
from harness.session.workers import status_changes
from harness.topology import allocate, build_topology, parse_topology, registration_body
from pdchaos.sse import stream_text

# ---------------------------------------------------------------- topology


@pytest.mark.parametrize(
    ("text", "p", "d"), [("1p1d", 1, 1), ("1p2d", 1, 2), ("2p1d", 2, 1), ("12P3D", 12, 3)]
)
def test_parse_topology_shapes(text: str, p: int, d: int) -> None:
    sh = parse_topology(text)
    assert (sh.prefills, sh.decodes) == (p, d)
    assert sh.engine_names()[:p] == [f"prefill-{i}" for i in range(p)]
    assert sh.engine_names()[p:] == [f"decode-{i}" for i in range(d)]


def test_a_regular_topology_runs_engines_in_both_roles_with_no_connector() -> None:
    sh = parse_topology(" 2R ")
    assert (sh.name, sh.pd, sh.engines, sh.engine_names()) == ("2r", False, 2, ["regular-0", "regular-1"])
    topo = build_topology(sh, "nixl", "http", list(range(21000, 21011)))
    r1 = topo.engine("regular-1")
    assert [e.name for e in topo.regulars] == ["regular-0", "regular-1"] and not topo.prefills
    assert (r1.engine_role, r1.engine_connector("nixl")) == ("both", "none")
    assert registration_body(r1, "nixl", "grpc") == {"url": r1.url("grpc"), "role": "regular"}
    p0 = build_topology("1p1d", "mooncake", "http", list(range(21000, 21011))).engine("prefill-0")
    assert registration_body(p0, "mooncake", "http") == {
        "url": p0.http_url, "role": "prefill", "connector": "mooncake", "bootstrap_port": p0.bootstrap_port}


@pytest.mark.parametrize("text", ["", "1p", "p1d", "0p1d", "1p0d", "1d1p", "2x2", "1p1d1", "-1p1d", "100p1d",
                                  "0r", "r", "1p1r", "100r"])
def test_parse_topology_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad topology"):
        parse_topology(text)


def test_build_topology_layout_and_urls() -> None:
    ports = list(range(20000, 20016))
    topo = build_topology("2p1d", "mooncake", "grpc", ports)
    assert topo.names() == ["prefill-0", "prefill-1", "decode-0"]
    p1 = topo.engine("prefill-1")
    assert p1.http_port == 20005 and p1.grpc_port == 20006 and p1.bootstrap_port == 20008
    assert topo.router_port == 20015
    assert topo.url_of("decode-0") == "grpc://127.0.0.1:20011"
    assert topo.name_of_url("grpc://127.0.0.1:20011/") == "decode-0"
    assert topo.name_of_url("http://localhost:20010") == "decode-0"
    assert topo.name_of_url("http://127.0.0.1:1") is None
    with pytest.raises(KeyError, match="no engine 'decode-1'"):
        topo.engine("decode-1")


def test_build_topology_bad_inputs() -> None:
    with pytest.raises(ValueError, match="connector"):
        build_topology("1p1d", "lmcache", "http", list(range(30000, 30011)))
    with pytest.raises(ValueError, match="transport"):
        build_topology("1p1d", "nixl", "tcp", list(range(30000, 30011)))
    with pytest.raises(ValueError, match="distinct ports"):
        build_topology("1p1d", "nixl", "http", [30000] * 11)


def test_allocate_gives_distinct_free_ports() -> None:
    topo = allocate("1p2d", "nixl", "http")
    ports = [topo.router_port]
    for e in topo.engines:
        ports += [e.http_port, e.grpc_port, e.control_port, e.bootstrap_port, e.nixl_port]
    assert len(set(ports)) == len(ports) == 16
    assert all(p > 0 for p in ports)


# ---------------------------------------------------------------- scenario validation


def _ok(**kw: object) -> Scenario:
    base: dict[str, object] = {"name": "s1", "description": "d", "topologies": ("1p1d", "2p1d")}
    base.update(kw)
    return Scenario(**base)  # type: ignore[arg-type]


def test_valid_scenario_passes() -> None:
    s = _ok(timeline=(
        Step("r", Restart("prefill-0"), At(1.0)),
        Step("w", Wedge("decode-0", "metadata"),
             AllOf((After("r", 0.5), WorkerStatus("prefill-0", "ready")))),
        Step("h", Heal("decode-0"), After("w", 1.0), deadline_s=9.0),
    ))
    validate(s)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"topologies": ("3x1",)}, "bad topology"),
        ({"connectors": ("lmcache",)}, "bad connector"),
        ({"transports": ("tcp",)}, "bad transport"),
        ({"name": "bad name!"}, "bad scenario name"),
        ({"timeline": (Step("x", Restart("prefill-1"), At(1)),)}, "not in 1p1d"),
        ({"timeline": (Step("x", Restart("prefill-0"), After("nope")),)}, "names no earlier step"),
        ({"timeline": (Step("x", Restart("prefill-0"), At(-1)),)}, "negative"),
        ({"timeline": (Step("x", Restart("prefill-0"), WorkerStatus("prefill-0", "up")),)}, "unknown worker"),
        ({"timeline": (Step("x", EngineFault("decode-0", "explode"), At(1)),)}, "unknown engine fault"),
        ({"timeline": (Step("x", Wedge("decode-0", "kitchen"), At(1)),)}, "unknown wedge surface"),
        ({"timeline": (Step("x", Wedge("decode-0", "health", mode="sigstop"), At(1)),)}, "whole process"),
        (
            {"timeline": (Step("x", Crash("decode-0"), At(1)), Step("x", Respawn("decode-0"), At(2)))},
            "duplicate",
        ),
        ({"router": RouterSettings(inject_bugs=("nonsense",))}, "unknown router bug"),
        ({"catches": ("stale_engine_id", "typo_bug")}, "catches unknown bug 'typo_bug'"),
        ({"workload": Workload(duration_s=0)}, "must be positive"),
        ({"workload": Workload(stream_fraction=2)}, "within [0, 1]"),
        ({"workload": Workload(mode="open", rate_rps=0)}, "rate_rps"),
        ({"workload": Workload(prompt_words=(5, 2))}, "prompt_words"),
        ({"deferred_engines": ("decode-3",)}, "not in 1p1d"),
    ],
)
def test_invalid_scenarios_are_rejected(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(_ok(**kw))


def test_matrix_filters() -> None:
    s = _ok(connectors=("mooncake", "nixl"), transports=("http",))
    assert s.matrix() == [
        ("1p1d", "mooncake", "http"), ("1p1d", "nixl", "http"),
        ("2p1d", "mooncake", "http"), ("2p1d", "nixl", "http"),
    ]
    assert s.matrix(topologies=["2p1d"], connectors=["nixl"]) == [("2p1d", "nixl", "http")]
    assert s.matrix(transports=["grpc"]) == []
    assert s.applies_to("1p1d", "nixl") and not s.applies_to("1p2d", "nixl")


def test_action_kind_names() -> None:
    assert action_kind(Restart("prefill-0")) == "restart"
    assert action_kind(EngineFault("decode-0", "no_engine_id")) == "fault:no_engine_id"
    assert action_kind(Respawn("decode-0")) == "respawn"


# ---------------------------------------------------------------- timeline


def test_timeline_fires_in_order_and_waits_for_conditions() -> None:
    tl = Timeline((
        Step("a", Restart("prefill-0"), At(1.0)),
        Step("b", Heal("prefill-0"), WorkerStatus("prefill-0", "ready")),
        Step("c", Crash("decode-0"), After("b", 0.5)),
    ))
    w = Observed(worker_status={"prefill-0": "not_ready"})
    assert tl.due(0.5, w) == ([], [])
    fire, _ = tl.due(1.0, w)
    assert [s.name for s in fire] == ["a"] and w.applied_at["a"] == 1.0
    assert tl.due(2.0, w) == ([], [])  # b waits for Ready
    w.worker_status["prefill-0"] = "ready"
    fire, _ = tl.due(2.1, w)
    assert [s.name for s in fire] == ["b"]
    assert tl.due(2.5, w)[0] == []
    fire, _ = tl.due(2.6, w)
    assert [s.name for s in fire] == ["c"] and tl.done


def test_timeline_fires_several_due_steps_at_once() -> None:
    tl = Timeline((Step("a", Restart("prefill-0"), At(1)), Step("b", Restart("decode-0"), After("a"))))
    fire, miss = tl.due(5.0, Observed())
    assert [s.name for s in fire] == ["a", "b"] and miss == []


def test_timeline_misses_a_step_past_its_deadline_and_moves_on() -> None:
    tl = Timeline((
        Step("never", Restart("prefill-0"), RequestsCompleted(100), deadline_s=3.0),
        Step("next", Heal("prefill-0"), At(4.0)),
    ))
    w = Observed(requests_completed=5)
    assert tl.due(2.0, w) == ([], [])
    fire, miss = tl.due(4.5, w)
    assert [s.name for s in miss] == ["never"] and [s.name for s in fire] == ["next"]
    assert tl.missed == ["never"]


def test_conditions() -> None:
    w = Observed(worker_status={"decode-0": "failed"}, requests_completed=3, applied_at={"x": 2.0})
    assert holds(WorkerStatus("decode-0", "failed"), 0, w)
    assert holds(WorkerStatus("prefill-0", "absent"), 0, w)
    assert not holds(RequestsCompleted(4), 0, w) and holds(RequestsCompleted(3), 0, w)
    assert not holds(After("x", 1.0), 2.9, w) and holds(After("x", 1.0), 3.0, w)
    assert not holds(After("y"), 100, w)
    assert not holds(AllOf((At(1), RequestsCompleted(4))), 5, w)


def test_last_fixed_time() -> None:
    tl = Timeline((Step("a", Restart("prefill-0"), At(2)), Step("b", Heal("prefill-0"), After("a"), 7.5)))
    assert tl.last_fixed_time() == 7.5


def test_a_side_channel_fault_on_a_mooncake_prefill_that_restarts_is_sim_only() -> None:
    """The real world's proxy on that link cannot follow the new side-channel port: every later pull would
    fail because of the harness."""
    from harness.scenario.links import LinkLatency

    timeline = (Step("slow", LinkLatency("prefill-0", "side_channel", latency_ms=100), At(1.0)),
                Step("b", Restart("prefill-0", down_s=0.6), At(1.5)))
    s = Scenario(name="x", description="", connectors=("mooncake",), timeline=timeline)
    with pytest.raises(ScenarioError, match=r"'b' restarts prefill-0, whose side_channel link step 'slow'"):
        validate(s)
    validate(replace(s, worlds=("sim",), world_notes={"real": "the proxy cannot follow the port"}))
    validate(replace(s, connectors=("nixl",)))  # a NIXL side channel keeps its port
    serve = (Step("slow", LinkLatency("prefill-0", "serve", latency_ms=100), At(1.0)), timeline[1])
    validate(replace(s, timeline=serve))


@pytest.mark.parametrize("axis", ["topologies", "connectors", "transports"])
def test_a_scenario_with_an_empty_axis_has_no_cell_and_is_refused(axis: str) -> None:
    with pytest.raises(ScenarioError, match=f"no {axis} \\(the scenario would have no cell to run in\\)"):
        validate(replace(Scenario(name="x", description=""), **{axis: ()}))


def test_start_engine_names_a_deferred_engine() -> None:
    from harness.scenario import StartEngine

    timeline = (Step("start", StartEngine("decode-1"), At(1.0)),)
    s = Scenario(name="x", description="", topologies=("1p2d",), timeline=timeline)
    with pytest.raises(ScenarioError, match=r"StartEngine\('decode-1'\) starts an engine that is not in"):
        validate(s)
    validate(replace(s, deferred_engines=("decode-1",)))


# ---------------------------------------------------------------- loading files


def test_load_scenarios_from_files_and_names(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(
        "from harness.scenario import Scenario\n"
        "SCENARIOS = [Scenario(name='alpha', description='a'), Scenario(name='beta', description='b')]\n"
    )
    assert [s.name for s in scenarios_in_file(good)] == ["alpha", "beta"]
    assert [s.name for s in load_scenarios(["beta"], directory=tmp_path)] == ["beta"]
    assert [s.name for s in load_scenarios(None, directory=tmp_path)] == ["alpha", "beta"]
    with pytest.raises(ScenarioError, match=r"unknown scenario 'gamma'.*alpha, beta"):
        load_scenarios(["gamma"], directory=tmp_path)


def test_file_colons_name_takes_one_scenario_of_a_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    two = tmp_path / "sub" / "two.py"
    two.write_text(
        "from harness.scenario import Scenario\n"
        "SCENARIOS = [Scenario(name='alpha', description='a'), Scenario(name='beta', description='b')]\n"
    )
    assert [s.name for s in load_scenarios([f"{two}::beta"], directory=tmp_path)] == ["beta"]
    # The file and one of its scenarios together: each scenario once.
    both = load_scenarios([str(two), f"{two}::alpha"], directory=tmp_path)
    assert [s.name for s in both] == ["alpha", "beta"]
    with pytest.raises(ScenarioError, match=r"two.py: no scenario named 'gamma' \(it defines: alpha, beta\)"):
        load_scenarios([f"{two}::gamma"], directory=tmp_path)
    empty = tmp_path / "empty.py"
    empty.write_text("SCENARIOS = []\n")
    with pytest.raises(ScenarioError, match=r"empty.py: SCENARIOS is empty: no scenario to run"):
        load_scenarios([str(empty)], directory=tmp_path)
    with pytest.raises(ScenarioError, match=r"no scenario named ''"):
        load_scenarios([f"{two}::"], directory=tmp_path)
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenarios([f"{tmp_path / 'gone.py'}::alpha"], directory=tmp_path)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = 1\n", "defines no SCENARIOS"),
        ("SCENARIOS = 5\n", "must be a list"),
        ("SCENARIOS = ['nope']\n", "is a str, not a Scenario"),
        ("import nonexistent_module_xyz\n", "failed to import: ModuleNotFoundError"),
        ("def broken(:\n", "failed to import: SyntaxError"),
        (
            "from harness.scenario import Scenario\nSCENARIOS = [Scenario(name='a', description='', "
            "topologies=('9z',))]\n",
            "bad topology",
        ),
    ],
)
def test_bad_scenario_files(tmp_path: Path, source: str, message: str) -> None:
    f = tmp_path / "bad.py"
    f.write_text(source)
    with pytest.raises(ScenarioError, match=message):
        scenarios_in_file(f)


def test_missing_file_and_duplicate_names(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such scenario file"):
        scenarios_in_file(tmp_path / "missing.py")
    for n in ("one", "two"):
        (tmp_path / f"{n}.py").write_text(
            "from harness.scenario import Scenario\nSCENARIOS = [Scenario(name='same', description='')]\n"
        )
    with pytest.raises(ScenarioError, match="defined in both"):
        load_scenarios(None, directory=tmp_path)


def test_shipped_scenarios_load_and_validate() -> None:
    found = load_scenarios()
    assert len(found) >= 10
    names = [s.name for s in found]
    assert len(set(names)) == len(names)
    for s in found:
        validate(s)
        assert s.bugs, f"{s.name} guards no bug"
        assert all(isinstance(x, Expect) for x in s.expect)
        assert expectation_problems(s) == [], s.name
    # Each injectable router bug is caught by at least one shipped scenario.
    caught = {b for s in found for b in s.catches}
    # Every bug switch, router and engine, is claimed by at least one shipped scenario.
    assert caught == set(INJECTABLE_BUGS)


# ---------------------------------------------------------------- router launch lines and load planning


def test_reference_router_argv() -> None:
    topo = build_topology("2p1d", "mooncake", "http", list(range(21000, 21016)))
    s = RouterSettings(health_interval_s=0.25, failure_threshold=2, inject_bugs=("stale_engine_id",))
    argv = ReferenceRouter(api_key="k").launch(topo, s, ["prefill-0", "decode-0"], "/tmp/ev.jsonl").argv
    line = " ".join(argv)
    assert "--prefill http://127.0.0.1:21000 21003" in line
    assert "http://127.0.0.1:21005" not in line  # prefill-1 not registered
    assert "--decode http://127.0.0.1:21010" in line
    assert "--health-check-interval-secs 0.25" in line and "--health-failure-threshold 2" in line
    assert "--inject-bug stale_engine_id" in line and "--api-key k" in line
    assert "--port 21015" in line


def test_command_router_template() -> None:
    topo = build_topology("1p2d", "nixl", "grpc", list(range(22000, 22016)))
    r = CommandRouter(
        "myrouter --listen {host}:{port} {prefill_args} --decodes {decodes} --hc {health_interval}"
    )
    argv = r.launch(topo, RouterSettings(health_interval_s=0.5), topo.names(), "ev").argv
    assert argv == [
        "myrouter", "--listen", "127.0.0.1:22015", "--prefill", "grpc://127.0.0.1:22001", "--decodes",
        "grpc://127.0.0.1:22006", "grpc://127.0.0.1:22011", "--hc", "0.5",
    ]
    with pytest.raises(RouterAdapterError, match="unknown placeholder"):
        CommandRouter("x --port {prot}")
    # Reaching into a value (an attribute, an index) or formatting it: refused before anything starts.
    for word, needle in (("{port.real}", r"unknown placeholder \{port.real\}"),
                         ("{port[0]}", "unknown placeholder"),
                         ("{port!r}", r"write it bare, \{port\}"), ("{port:>5}", "write it bare"),
                         ("{port", "expected '}' before end of string")):
        with pytest.raises(RouterAdapterError, match=needle):
            CommandRouter(f"x --port {word}")
    assert CommandRouter("x --port {port} --json {{}}").words[-1] == "{{}}"
    # A template that passes {api_key} gets the run's key (sent on the worker API too); another, none.
    assert CommandRouter("x --port {port} --api-key {api_key}").api_key == "pdchaos-test-key"
    assert CommandRouter("x --port {port}").api_key is None
    with pytest.raises(RouterAdapterError, match="unknown router"):
        make_router_adapter("no-such-router")
    assert isinstance(make_router_adapter("cmd:echo {port}"), CommandRouter)


def test_plan_request_is_tagged_and_deterministic() -> None:
    w = Workload(chat_fraction=0.5, stream_fraction=0.5, max_tokens=5)
    a = [plan_request(i, "run1", random.Random(7), w, "m") for i in range(1, 4)]
    b = [plan_request(i, "run1", random.Random(7), w, "m") for i in range(1, 4)]
    assert a == b
    for i, p in enumerate(a, start=1):
        assert p.prompt.startswith(f"[pdchaos:run1:{i}] ") and p.tag == f"[pdchaos:run1:{i}]"
        assert p.body["max_tokens"] == 5 and p.body["stream"] == p.stream
        assert ("messages" in p.body) == p.endpoint.endswith("chat/completions")


def test_a_share_of_requests_carries_the_clients_mistake_only_when_asked() -> None:
    plain, wrong = Workload(), Workload(mistake_fraction=0.5)
    rng_a, rng_b = random.Random(3), random.Random(3)
    right = [plan_request(i, "r", rng_a, plain, "m") for i in range(1, 40)]
    assert all(p.mistake is None and p.body["model"] == "m" for p in right)
    # No mistake asked: the same draws as ever (a seed's requests do not move).
    again = [plan_request(i, "r", rng_b, replace(plain, mistake_fraction=0.0), "m") for i in range(1, 40)]
    assert again == right
    rng = random.Random(3)
    mixed = [plan_request(i, "r", rng, wrong, "m") for i in range(1, 40)]
    bad = [p for p in mixed if p.mistake is not None]
    assert 0 < len(bad) < len(mixed)
    assert all(p.mistake == "unknown_model" and p.body["model"] == "pdchaos-no-such-model" for p in bad)


def test_a_share_of_chat_requests_caps_with_max_completion_tokens_only_when_asked() -> None:
    newer_too = Workload(chat_fraction=1.0, completion_tokens_fraction=0.5)
    plans = [plan_request(i, "r", random.Random(i), newer_too, "m") for i in range(1, 60)]
    newer = [p for p in plans if "max_completion_tokens" in p.body]
    assert 0 < len(newer) < len(plans)
    assert all(p.body["max_completion_tokens"] == p.max_tokens and "max_tokens" not in p.body for p in newer)
    # Completions have no such field; nor does any request when none is asked for.
    completions = Workload(chat_fraction=0.0, completion_tokens_fraction=1.0)
    plain = [plan_request(i, "r", random.Random(i), completions, "m") for i in range(1, 20)]
    assert all("max_completion_tokens" not in p.body for p in plain)


def test_a_share_of_requests_stops_at_its_first_word_only_when_asked() -> None:
    stopping = Workload(chat_fraction=0.5, stop_fraction=0.5)
    plans = [plan_request(i, "r", random.Random(i), stopping, "m") for i in range(1, 60)]
    stopped = [p for p in plans if "stop" in p.body]
    assert 0 < len(stopped) < len(plans)
    absent = [p for p in stopped if p.body["stop"] == [ABSENT_STOP]]
    assert 0 < len(absent) < len(stopped)
    for p in stopped:
        whole = expected_text(replace(p, body={k: v for k, v in p.body.items() if k != "stop"}))
        (word,) = p.body["stop"]
        if p in absent:
            # A stop string no answer holds changes nothing.
            assert ABSENT_STOP not in whole and expected_text(p) == whole
            continue
        # The answer's first word: it ends before that word, after the space that leads it.
        assert whole.split()[0] == word and expected_text(p) == " "
    # None asked for: the same draws as ever.
    rng_a, rng_b = random.Random(5), random.Random(5)
    assert [plan_request(i, "r", rng_a, Workload(), "m") for i in range(1, 20)] == [
        plan_request(i, "r", rng_b, Workload(stop_fraction=0.0), "m") for i in range(1, 20)]


def test_a_share_of_requests_gets_an_empty_answer_only_when_asked() -> None:
    ending = Workload(chat_fraction=0.5, eos_fraction=0.5)
    plans = [plan_request(i, "r", random.Random(i), ending, "m") for i in range(1, 60)]
    seeded = [p for p in plans if "seed" in p.body]
    assert 0 < len(seeded) < len(plans) and any(p.chat for p in seeded) and not all(p.chat for p in seeded)
    for p in plans:
        # The seed makes the model's first token end of sequence: the answer is empty.
        assert (expected_text(p) == "") == (p in seeded)
    # None asked for: the same draws as ever.
    rng_a, rng_b = random.Random(5), random.Random(5)
    assert [plan_request(i, "r", rng_a, Workload(), "m") for i in range(1, 20)] == [
        plan_request(i, "r", rng_b, Workload(eos_fraction=0.0), "m") for i in range(1, 20)]


def test_parse_sse() -> None:
    lines = ['data: {"choices":[{"text":" a"}]}', "", 'data: {"choices":[{"text":" b"}]}', "data: [DONE]"]
    assert stream_text(lines, chat=False) == (" a b", None, True)
    err = ['data: {"choices":[{"delta":{"content":"x"}}]}', 'data: {"error":{"message":"kv load failed"}}',
           "data: [DONE]"]
    assert stream_text(err, chat=True) == ("x", "kv load failed", True)
    assert stream_text(['data: {"choices":[{"text":"a"}]}'], chat=False) == ("a", None, False)


def test_status_changes_diff() -> None:
    w1 = [{"id": "w1", "status": "ready", "kv_engine_id": "e1"}, {"id": "w2", "status": "pending"}]
    changed, snap = status_changes({}, w1)
    assert [c["id"] for c in changed] == ["w1", "w2"]
    changed, snap = status_changes(snap, w1)
    assert changed == []
    w2 = [{"id": "w1", "status": "ready", "kv_engine_id": "e2"}]
    changed, snap = status_changes(snap, w2)
    assert [(c["id"], c["status"]) for c in changed] == [("w1", "ready"), ("w2", "absent")]


def test_a_contract_workout_is_in_the_simulated_default_suite_only() -> None:
    from harness.suite import default_suite

    found = load_scenarios()
    real = {s.name for s in default_suite(found, "real")}
    sim = {s.name for s in default_suite(found, "sim")}
    assert "breaker_trials" in sim and "breaker_trials" not in real
    assert real < sim and real <= {s.name for s in default_suite(found)}
    with pytest.raises(ScenarioError, match="suite_worlds names unknown world 'cloud'"):
        validate(Scenario(name="x", description="x", suite_worlds=("cloud",)))


def test_a_router_not_told_the_connector_learns_it_over_grpc_only() -> None:
    from harness.routers.reference import reference_config
    from harness.scenario import RouterSettings

    learn = RouterSettings(tell_connector=False)
    assert learn.told_connector("mooncake", "grpc") is None
    assert learn.told_connector("nixl", "http") == "nixl"  # nothing over HTTP says it
    assert RouterSettings().told_connector("nixl", "grpc") == "nixl"
    assert reference_config(learn).connector is None
