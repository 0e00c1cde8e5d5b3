"""Scenarios as data: the cells a scenario applies to, router and engine settings, workload, fault timeline,
expectations. Nothing here sleeps, opens sockets or reads clocks: every world interprets the same objects.

Modules: `settings` (RouterSettings, EngineSettings, Workload), `conditions` (when a step fires), `actions`
(engine and worker API actions), `links` (network links and their faults), `timeline` (Step, Timeline: which
step is due), `model` (Scenario, Expect, validate), `files` (loading scenario files).
"""

from harness.scenario.actions import (
    ENGINE_FAULT_KINDS,
    ONE_SHOT,
    WEDGE_SURFACES,
    Action,
    AddWorker,
    Crash,
    Die,
    EngineFault,
    Heal,
    PatchWorker,
    RemoveWorker,
    Respawn,
    Restart,
    SlowStart,
    StartEngine,
    Wedge,
    action_kind,
)
from harness.scenario.conditions import (
    WORKER_STATUSES,
    After,
    AllOf,
    At,
    Condition,
    Observed,
    RequestsCompleted,
    WorkerStatus,
    holds,
)
from harness.scenario.files import all_scenario_files, load_scenarios, scenarios_in_file
from harness.scenario.links import (
    HealLink,
    LinkBandwidth,
    LinkFlap,
    LinkLatency,
    LinkRef,
    LinkReset,
    Partition,
    links_in,
)
from harness.scenario.model import INJECTABLE_BUGS, WORLDS, Expect, Scenario, ScenarioError, validate
from harness.scenario.presets import PRESETS, SettingsPreset, apply_preset, preset
from harness.scenario.settings import EngineSettings, RouterSettings, Workload
from harness.scenario.timeline import Step, Timeline

__all__ = [
    "ENGINE_FAULT_KINDS",
    "INJECTABLE_BUGS",
    "ONE_SHOT",
    "PRESETS",
    "WEDGE_SURFACES",
    "WORKER_STATUSES",
    "WORLDS",
    "Action",
    "AddWorker",
    "After",
    "AllOf",
    "At",
    "Condition",
    "Crash",
    "Die",
    "EngineFault",
    "EngineSettings",
    "Expect",
    "Heal",
    "HealLink",
    "LinkBandwidth",
    "LinkFlap",
    "LinkLatency",
    "LinkRef",
    "LinkReset",
    "Observed",
    "Partition",
    "PatchWorker",
    "RemoveWorker",
    "RequestsCompleted",
    "Respawn",
    "Restart",
    "RouterSettings",
    "Scenario",
    "ScenarioError",
    "SettingsPreset",
    "SlowStart",
    "StartEngine",
    "Step",
    "Timeline",
    "Wedge",
    "WorkerStatus",
    "Workload",
    "action_kind",
    "all_scenario_files",
    "apply_preset",
    "holds",
    "links_in",
    "load_scenarios",
    "preset",
    "scenarios_in_file",
    "validate",
]
