"""The scenario file: it loads, runs the incident's times scaled in real time and its own settings under
--settings production, and cites its evidence."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.incident.bundle import read_bundle
from harness.incident.infer import infer
from harness.incident.render import build_scenario, render
from harness.scenario import At, Restart, Step
from harness.scenario.model import ScenarioError, validate
from harness.scenario.presets import PRODUCTION, apply_preset
from harness.suite import load_named

pytestmark = pytest.mark.unit

BUNDLES = Path(__file__).resolve().parents[2] / "data" / "incidents"

# An outage told by hand at production settings: smg's 60 s probes, vLLM's 480 s transfer timeout.
HAND_TOLD = """\
[gateway]
release = "smg==1.10.1"
command = "smg launch --pd-disaggregation --prefill grpc://10.0.0.5:8000 8998 --decode grpc://10.0.0.6:8000 \
--health-check-interval-secs 60"

[engines]
transfer_timeout_s = 480

[[event]]
at = 600
engine = "prefill-0"
what = "restart"
down_s = 30

[symptom]
clients_saw = ["hang"]
"""


def test_production_incident_scales_to_one_second_probes(tmp_path: Path) -> None:
    (tmp_path / "incident.toml").write_text(HAND_TOLD)
    plan = infer(read_bundle([tmp_path]))
    assert plan.time_scale == 60.0
    scaled = build_scenario(plan, "told")
    assert scaled.router.health_interval_s == 1.0 and scaled.engines.transfer_timeout_s == 8.0
    (step,) = scaled.timeline
    assert step.action == Restart("prefill-0", down_s=0.5) and step.when == At(10.0)
    own = apply_preset(scaled, PRODUCTION)
    assert own.router.health_interval_s == 60.0 and own.router.failure_threshold == 3
    # The reference router's identity check keeps its ratio to the probes (no gateway flag sets it).
    assert own.router.identity_check_interval_s == 60.0
    assert own.engines.transfer_timeout_s == 480.0
    assert own.timeline[0].when == At(600.0) and own.timeline[0].action.down_s == pytest.approx(30.0)
    assert [x.checker for x in scaled.expect] == ["transfer_timeout"]


@pytest.mark.parametrize("name", sorted(p.name for p in BUNDLES.iterdir() if p.is_dir()))
def test_rendered_file_loads_and_cites(tmp_path: Path, name: str) -> None:
    plan = infer(read_bundle([BUNDLES / name]))
    path = tmp_path / "incident.py"
    path.write_text(render(plan, name, f"tests/data/incidents/{name}"))
    (loaded,) = load_named([str(path)])
    assert loaded == replace(build_scenario(plan, name), source=loaded.source)
    text = path.read_text()
    for s in plan.symptoms:
        assert s.cite in text
    for f in plan.faults:
        assert f.cite in text


def test_a_step_after_the_load_ends_is_refused() -> None:
    plan = infer(read_bundle([BUNDLES / "smg-1.13.0-restart-between-probes"]))
    s = build_scenario(plan, "late")
    late = replace(
        s, timeline=(*s.timeline, Step("too_late", Restart("prefill-0"), At(s.workload.duration_s + 1)))
    )
    with pytest.raises(ScenarioError, match="after the load ends"):
        validate(late)
