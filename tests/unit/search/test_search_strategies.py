"""Search strategies: generated cases are valid scenarios, every fault heals before the run ends with time to
recover, and the same seed draws the same schedule."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from harness.scenario import AddWorker, PatchWorker, PauseRouter, Respawn, validate
from harness.scenario.bugs import INJECTABLE_BUGS
from harness.search.bias import fault_templates, search_kind, space_for
from harness.search.case import (
    IDENTITY_OFF_S,
    LONG_OPEN_S,
    SearchCase,
    duration_s,
    identity_checks_optional,
    readmit_only,
    recovery_bound_s,
)
from harness.search.execute import scenario_of
from harness.search.expect import expectations
from harness.search.faults import SELF_HEALING, FaultSpec, effective_windows, to_steps, without_conflicts
from harness.search.strategies import Space, search_cases

FAST = settings(database=None, max_examples=60, deadline=None, phases=[Phase.generate],
                suppress_health_check=list(HealthCheck))


@FAST
@given(search_cases(Space(presets=("scaled", "production"))))
def test_generated_cases_are_valid_scenarios_with_every_fault_healed(case: SearchCase) -> None:
    s = scenario_of(case, ("stale_engine_id",))
    validate(s)
    assert s.topologies == (case.topology,) and case.faults
    steps = {st.name: st for st in s.timeline}
    for i, f in enumerate(case.faults):
        name = f"f{i}_{f.kind}"
        assert name in steps
        # A self-healing fault ends with its own action; every other one has a heal step after it.
        if f.kind not in SELF_HEALING:
            heal = steps[f"{name}_heal"]
            assert heal.when.t >= steps[name].when.t
            if f.kind in ("crash", "die", "graceful_stop"):
                assert isinstance(heal.action, Respawn)
    last = max(end for _, end in effective_windows(case.faults))
    assert duration_s(case) >= last + recovery_bound_s(case.settings, case.breaker)
    assert s.workload.duration_s == duration_s(case)


@FAST
@given(search_cases())
def test_no_two_conflicting_faults_are_on_at_once(case: SearchCase) -> None:
    for a, b in itertools.combinations(case.faults, 2):
        if a.conflicts_with(b.lane):
            first, second = sorted((a, b), key=lambda f: f.start_s)
            assert second.start_s >= first.end_s, (a.label(), b.label())


@FAST
@given(search_cases(Space(favour_breaker=True)))
def test_a_long_breaker_only_comes_with_faults_that_readmit(case: SearchCase) -> None:
    if case.breaker is not None and case.breaker.open_s >= LONG_OPEN_S:
        assert readmit_only(case.faults, case.connector)
        # The open period never counts in the bound: a correct router re-admits at promotion.
        assert recovery_bound_s(case.settings, case.breaker) == recovery_bound_s(case.settings, None)


def test_control_faults_of_different_kinds_overlap_but_never_a_process_fault() -> None:
    no_id = FaultSpec("no_engine_id", "prefill-0", 1.0, 4.0)
    slow = FaultSpec("latency_fault", "prefill-0", 1.5, 1.0, params=(("surface", "health"), ("ms", 800)))
    crash = FaultSpec("crash", "prefill-0", 2.0, 1.0)
    again = FaultSpec("no_engine_id", "prefill-0", 2.0, 1.0)
    cut = FaultSpec("partition_down", "prefill-0", 2.0, 1.0, "serve")
    assert without_conflicts([no_id, slow, crash, again, cut]) == (no_id, slow, cut)
    steps = to_steps((no_id, slow))
    heals = [st.action for st in steps if st.name.endswith("_heal")]
    assert [(h.target, h.kind) for h in heals] == [("prefill-0", "latency"), ("prefill-0", "no_engine_id")]


def test_a_worker_property_update_is_an_instant_api_call_with_nothing_to_heal() -> None:
    patch = FaultSpec("patch_worker", "decode-0", 1.0, 0.0, params=(("priority", 3),))
    (step,) = to_steps((patch,))
    assert isinstance(step.action, PatchWorker) and step.action.body["priority"] == 3
    assert effective_windows((patch,)) == [(1.0, 1.0)]
    # Its own lane: it may come while the engine is down (the router keeps the worker's record).
    assert without_conflicts([FaultSpec("crash", "decode-0", 0.5, 2.0), patch])[1] == patch


@pytest.mark.parametrize(("mistake", "cls", "field"), [
    ("patch_labels", PatchWorker, "labels"), ("add_url", AddWorker, "url"),
    ("add_url_path", AddWorker, "url"), ("add_bootstrap_port", AddWorker, "bootstrap_port"),
    ("add_again", AddWorker, "url"), ("add_url_scheme", AddWorker, "url"), ("add_url_host", AddWorker, "url"),
])
def test_a_worker_api_mistake_is_an_instant_call_judged_by_worker_api(
    mistake: str, cls: type, field: str
) -> None:
    wrong = FaultSpec("api_mistake", "prefill-0", 1.0, 0.0, params=(("mistake", mistake),))
    (step,) = to_steps((wrong,))
    assert isinstance(step.action, cls) and step.action.refused == field
    assert effective_windows((wrong,)) == [(1.0, 1.0)]
    case = SearchCase(faults=(wrong,))
    assert "worker_api" in {e.checker for e in expectations(case)}
    # A shipped scenario's mistake is the same search fault (a template the search draws whole).
    assert search_kind(step.action) == "api_mistake"


def test_a_router_pause_holds_the_timeline_and_counts_as_a_fault_on_every_engine() -> None:
    pause = FaultSpec("pause_router", "router", 1.0, 0.5)
    restart = FaultSpec("restart", "prefill-0", 3.0, 0.5)
    (step, _) = to_steps((pause, restart))
    assert isinstance(step.action, PauseRouter) and step.action.pause_s == 0.5
    assert effective_windows((pause,))[0][1] == pytest.approx(1.52)
    # A prefill's new id is judged only where nothing else touches it: the pause does, as on any engine.
    case = SearchCase(faults=(restart, FaultSpec("pause_router", "router", 3.6, 1.0)))
    assert "reported_engine_id" not in {e.checker for e in expectations(case)}
    drawn = [f for c in _draw(40, 3, Space(favoured=("pause_router",))) for f in c.faults]
    pauses = [f for f in drawn if f.kind == "pause_router"]
    assert pauses and all(f.target == "router" and f.length_s >= 0.2 for f in pauses)
    assert all(f.target != "router" for f in drawn if f.kind != "pause_router")


def _draw(n: int, s: int, space: Space | None = None) -> list[SearchCase]:
    out: list[SearchCase] = []

    @settings(database=None, max_examples=n, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(s)
    @given(search_cases(space))
    def collect(case: SearchCase) -> None:
        out.append(case)

    collect()
    return out


def test_the_same_seed_draws_the_same_schedules() -> None:
    a, b = _draw(25, 11), _draw(25, 11)
    assert a == b
    assert [to_steps(c.faults) for c in a] == [to_steps(c.faults) for c in b]
    assert a != _draw(25, 12)


def test_schedules_include_swizzle_clogs_overlaps_and_repeats() -> None:
    cases = _draw(150, 3)
    overlapping = repeated = 0
    # A fault on an engine as soon as another one on it ends (`followed`).
    follows = sum(1 for c in cases for a in c.faults for b in c.faults
                  if a is not b and a.target == b.target and 0 <= round(b.start_s - a.end_s, 3) <= 0.3)
    assert follows > 5
    for c in cases:
        ws = effective_windows(c.faults)
        if any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(ws) for b in ws[i + 1:]):
            overlapping += 1
        lanes = [f.lane for f in c.faults]
        if len(set(lanes)) < len(lanes):
            repeated += 1
    assert overlapping > 10 and repeated > 5


def test_templates_are_the_catching_scenarios_schedules_on_engines_of_the_same_role() -> None:
    templates = fault_templates(("reread_every_probe",))
    assert [[(f.kind, f.target, f.start_s, f.length_s) for f in t] for t in templates] == [
        [("no_engine_id", "prefill-0", 0.0, 4.5), ("latency_fault", "prefill-0", 0.2, 1.0)]]
    space = space_for(("reread_every_probe",))
    assert space.templates == templates and space.transports == ("grpc",)
    whole = [(a, b) for c in _draw(200, 5, space) for a in c.faults for b in c.faults
             if a.kind == "no_engine_id" and b.kind == "latency_fault" and b.param.get("ms") == 8000]
    # Drawn whole: both faults on one prefill, 0.2 s apart, as in the scenario (200 cases draw it: a template
    # is one group kind among six; each of its faults is kept three times in four).
    assert any(a.target == b.target and a.target.startswith("prefill") and a.length_s == 4.5
               and round(b.start_s - a.start_s, 3) == 0.2 for a, b in whole)


def test_identity_checks_go_off_only_where_the_probes_see_every_id_change() -> None:
    for c in _draw(150, 9, Space(favour_no_identity=True)):
        if not c.identity_checks:
            assert identity_checks_optional(c.faults, c.failure_threshold)
            assert scenario_of(c, ()).router.identity_check_interval_s == IDENTITY_OFF_S


def test_identity_checks_stay_on_where_the_new_id_may_be_hidden_at_promotion() -> None:
    # Search seed 332: a crashed prefill came back while it reported no id; its promotion's read kept the
    # old id as final, and only an identity check could bring the new one.
    crash = FaultSpec("crash", "prefill-0", 0.5, 0.5)
    hidden = FaultSpec("no_engine_id", "prefill-0", 1.4, 0.5)
    assert identity_checks_optional((crash,), 1)
    assert not identity_checks_optional((crash, hidden), 1)
    # An id hidden on another engine than the one whose id changes hides nothing from this promotion.
    assert identity_checks_optional((crash, FaultSpec("no_engine_id", "prefill-1", 1.4, 0.5)), 1)


@pytest.mark.parametrize("bug", INJECTABLE_BUGS)
def test_cases_drawn_for_every_switch_are_valid_scenarios(bug: str) -> None:
    """The bias toward a switch's shipped scenarios (kinds, settings, templates, cells) draws valid cases."""
    for case in _draw(15, 1, space_for((bug,))):
        validate(scenario_of(case, (bug,)))
        for a, b in itertools.combinations(case.faults, 2):
            if a.conflicts_with(b.lane):
                first, second = sorted((a, b), key=lambda f: f.start_s)
                assert second.start_s >= first.end_s


def test_grpc_cases_may_leave_the_router_to_learn_the_connector() -> None:
    cases = _draw(60, 5)
    learn = [c for c in cases if c.learn_connector]
    assert learn and all(c.transport == "grpc" for c in learn)
    assert any(c.completion_tokens_fraction > 0 for c in cases)
    case = SearchCase(transport="grpc", learn_connector=True, completion_tokens_fraction=0.5)
    s = scenario_of(case, (), "x")
    assert s.router.tell_connector is False and s.workload.completion_tokens_fraction == 0.5
    assert scenario_of(SearchCase(), (), "y").router.tell_connector is True


def test_cases_may_carry_answers_that_end_early() -> None:
    cases = _draw(60, 5)
    assert any(c.stop_fraction > 0 for c in cases) and any(c.stop_fraction == 0 for c in cases)
    assert any(c.eos_fraction > 0 for c in cases) and any(c.eos_fraction == 0 for c in cases)
    s = scenario_of(SearchCase(stop_fraction=0.3, eos_fraction=0.2), (), "z")
    assert (s.workload.stop_fraction, s.workload.eos_fraction) == (0.3, 0.2)
    validate(s)
