"""Engine backends of the real world: who runs the engines of a cell (`--engines`).

- `fake` (default): the fake engines (`engines.EngineFleet`), every fault of the vocabulary.
- `vllm`: real vLLM servers on this machine (`vllm_engines.VllmFleet`; `pdchaos engines install vllm`).
- `command:FILE`: engines started, stopped, killed, paused and resumed by command templates
  (`command_engines.CommandFleet`), e.g. through ssh, kubectl or a scheduler.
- `k8s:FILE`: engines as pods on a Kubernetes cluster (`kube_engines.KubeFleet`; FILE holds what a
  sweep's `[engines.NAME]` table does), through the official client.

A backend without the fakes' control API runs process and network faults only. A scenario that needs more
(a protocol fault, a control-mode wedge, an engine-side bug switch) is not applicable there: the cell is
skipped with the reason, never passed (`not_applicable`). Real engines start in tens of seconds, not
milliseconds: `adapt` keeps the load going past a slow restart so that recovery can be seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.scenario import (
    Action,
    Crash,
    Die,
    EngineFault,
    Expect,
    Heal,
    Scenario,
    SlowStart,
    Wedge,
)
from harness.scenario.bugs import split_bugs
from harness.topology import Topology
from harness.worlds.real.engines import EngineFleet
from harness.worlds.real.processes import ProcessSupervisor

# How long the load goes on after the last fault ends, on engines that take seconds to come back.
REAL_AFTER_HEAL_S = 6.0
# At least this much load after availability's after-window opens.
AFTER_WINDOW_MIN_S = 3.0
FAKE_START_S = 60.0
# The router's probe timing on real engines: on a 2-core machine running two CPU vLLM servers, the
# router, the relays and the load, the whole machine stalls for up to ~0.6 s at times (measured: every
# probe of every engine timing out at once at the scaled 0.5 s), which the scaled settings would read as
# engine failures. Probes every 1 s with a 2 s timeout see only real outages.
REAL_HEALTH_INTERVAL_S = 1.0
REAL_HEALTH_TIMEOUT_S = 2.0
# What a vLLM 0.32 NIXL decode waits at most for a peer that does not answer (its handshake's receive
# timeout): the bound the transfer_timeout checker holds requests to on real engines.
VLLM_PULL_TIMEOUT_S = 5.0
VLLM_START_S = 300.0


class EngineChoiceError(ValueError):
    """A bad `--engines` value; the message says what is accepted."""


@dataclass(frozen=True)
class EngineChoice:
    kind: str = "fake"
    file: Path | None = None
    # k8s: the backend's table, as JSON (hashable, and it travels to a cell's worker as it is).
    table_json: str = ""

    @property
    def label(self) -> str:
        if self.kind in ("command", "k8s") and self.file is not None:
            return f"{self.kind}:{self.file}"
        return self.kind

    @property
    def is_fake(self) -> bool:
        return self.kind == "fake"

    @property
    def table(self) -> dict[str, Any]:
        import json

        return json.loads(self.table_json) if self.table_json else {}

    @classmethod
    def kube(cls, table: Mapping[str, Any], file: Path | None = None) -> EngineChoice:
        import json

        body = {k: v for k, v in table.items() if k != "backend"}
        return cls("k8s", file, json.dumps(body, sort_keys=True))

    @property
    def text_known(self) -> bool:
        """Whether a correct completion's text is known in advance (only the fakes' is)."""
        if self.kind == "command" and self.file is not None:
            from harness.worlds.real.command_engines import load_templates

            return load_templates(self.file).serves == "fake"
        if self.kind == "k8s":
            return True  # the pdchaos-fake preset: the only one the cluster world runs
        return self.is_fake

    def start_budget_s(self) -> float:
        """How long the session waits for its engines to come up."""
        if self.kind == "vllm":
            return VLLM_START_S
        if self.kind == "command":
            from harness.worlds.real.command_engines import load_templates

            return load_templates(self.file).ready_timeout_s + 30.0 if self.file else VLLM_START_S
        if self.kind == "k8s":
            return float(self.table.get("ready_timeout_s", 900.0)) + 30.0
        return FAKE_START_S


def parse_engines(text: str | EngineChoice | None) -> EngineChoice:
    if isinstance(text, EngineChoice):
        return text
    spec = (text or "fake").strip()
    if spec in ("fake", "vllm"):
        return EngineChoice(spec)
    if spec.startswith("command:"):
        # Absolute: a replay command names it, from any folder.
        path = Path(spec.removeprefix("command:")).expanduser().resolve()
        if not path.is_file():
            raise EngineChoiceError(f"--engines command:FILE: no file {path}")
        from harness.worlds.real.command_engines import load_templates

        try:
            load_templates(path)  # a bad file is said now, not when the first engine starts
        except ValueError as e:
            raise EngineChoiceError(str(e)) from e
        return EngineChoice("command", path)
    if spec.startswith("k8s:"):
        path = Path(spec.removeprefix("k8s:")).expanduser().resolve()
        if not path.is_file():
            raise EngineChoiceError(f"--engines k8s:FILE: no file {path}")
        from harness.worlds.real.kube_engines import load_backend_file

        try:
            return EngineChoice.kube(load_backend_file(path), path)
        except ValueError as e:
            raise EngineChoiceError(str(e)) from e
    raise EngineChoiceError(f"unknown engine backend {spec!r} (known: fake, vllm, command:FILE, k8s:FILE)")


def make_fleet(choice: EngineChoice, topo: Topology, settings: Any, supervisor: ProcessSupervisor,
               out_dir: Path, token: str | None, ready_timeout_s: float) -> EngineFleet:
    if choice.kind == "vllm":
        from harness.worlds.real.vllm_engines import VllmFleet

        return VllmFleet(topo, settings, supervisor, out_dir, token=token, ready_timeout_s=ready_timeout_s)
    if choice.kind == "command":
        from harness.worlds.real.command_engines import CommandFleet, load_templates

        assert choice.file is not None
        return CommandFleet(topo, settings, supervisor, out_dir, token=token, ready_timeout_s=ready_timeout_s,
                            templates=load_templates(choice.file))
    if choice.kind == "k8s":
        from harness.worlds.real.kube_engines import KubeFleet

        return KubeFleet(topo, settings, supervisor, out_dir, token=token, ready_timeout_s=ready_timeout_s,
                         table=choice.table)
    return EngineFleet(topo, settings, supervisor, out_dir, token=token, ready_timeout_s=ready_timeout_s)


def _control_only(action: Action) -> str | None:
    """Why an action needs the fakes' control API (None: a process or network fault any engine takes)."""
    if isinstance(action, EngineFault):
        return f"protocol fault {action.kind!r}"
    if isinstance(action, Die):
        return "Die (an engine told to report itself dead)"
    if isinstance(action, SlowStart):
        return "SlowStart (listeners held closed by the engine)"
    if isinstance(action, Wedge) and action.mode == "control":
        return f"a {action.surface!r} wedge through the control API"
    if isinstance(action, Crash) and action.mode == "control":
        return "a crash through the control API"
    if isinstance(action, Heal) and action.kind not in (None, "wedge"):
        return f"healing protocol fault {action.kind!r}"
    return None


def not_applicable(choice: EngineChoice, scenario: Scenario, connector: str, transport: str) -> str | None:
    """Why this scenario's cell cannot run on these engines (None: it can)."""
    if choice.is_fake:
        return None
    if choice.kind == "k8s":
        from harness.worlds.real.kube_engines import not_runnable

        return not_runnable(choice.table, scenario, connector, transport)
    who = "real vLLM engines" if choice.kind == "vllm" else f"engines of {choice.label}"
    if choice.kind == "vllm" and connector != "nixl":
        return (f"{who}: the {connector} connector does not run on this machine (vLLM's "
                "MooncakeConnector needs an accelerator); NIXL only")
    for step in scenario.timeline:
        why = _control_only(step.action)
        if why:
            return f"{who} have no fault control API: step {step.name!r} needs {why}"
        if getattr(step.action, "link", None) == "side_channel":
            # A decode reaches the side channel at the port its prefill advertises in kv_transfer_params:
            # only the fakes can be told to advertise the proxy's port instead of their own.
            return (f"{who}: step {step.name!r} faults the KV side channel, which only the fake engines "
                    "can route through a proxy (they advertise its port)")
    _, engine_bugs = split_bugs(scenario.engines.inject_bugs)
    per_engine = [b for v in scenario.engines.per_engine.values() for b in (v.get("inject_bugs") or ())]
    if engine_bugs or per_engine:
        names = ", ".join((*engine_bugs, *per_engine))
        return f"{who}: engine bug switches exist only in the fake engines ({names})"
    if any((v.get("load_time_s") or 0) > 0 for v in scenario.engines.per_engine.values()) or (
            scenario.engines.load_time_s > 0):
        return f"{who}: a scripted loading time is the fakes' (a real engine loads as long as it loads)"
    return None


OUTPUT_NOT_JUDGED = ("output: not judged on these engines (a real model's text is not known in advance; "
                     "wrong KV shows in the handoff checker's records instead)")


def _settle_scaled(expect: tuple[Expect, ...], factor: float) -> tuple[tuple[Expect, ...], str]:
    """Availability expectations with `settle_s` (the after-window's delay from a heal) times `factor`."""
    out, said = [], []
    for x in expect:
        settle = x.params.get("settle_s") if x.checker == "availability" else None
        if isinstance(settle, int | float):
            out.append(replace(x, params={**x.params, "settle_s": round(settle * factor, 3)}))
            said.append(f"{settle:g} s -> {settle * factor:g} s")
        else:
            out.append(x)
    return tuple(out), ", ".join(said)


def adapt(choice: EngineChoice, scenario: Scenario) -> tuple[Scenario, list[str]]:
    """The scenario as it runs on these engines, and notes on what changed: on real ones the load goes on
    `REAL_AFTER_HEAL_S` past the last fault's end (a restart takes tens of seconds, longer than the whole
    scaled workload; a pod comes back in seconds), the router probes more slowly where the engines share
    this machine, and the output checker is left out where the text is not known in advance."""
    if choice.is_fake:
        return scenario, []
    notes = []
    w = scenario.workload
    tail = max(w.after_heal_s or 0.0, REAL_AFTER_HEAL_S)
    if tail != w.after_heal_s:
        notes.append(f"load kept on {tail:g} s after the last fault ends "
                     "(real engines and pods restart slowly)")
    router = scenario.router
    expect = scenario.expect
    # Engines on this machine stall it at times; pods of fake engines on a cluster do not.
    beside_us = choice.kind != "k8s"
    if beside_us and (router.health_interval_s < REAL_HEALTH_INTERVAL_S
                      or router.health_timeout_s < REAL_HEALTH_TIMEOUT_S):
        slower = max(router.health_interval_s, REAL_HEALTH_INTERVAL_S) / router.health_interval_s
        router = replace(router, health_interval_s=max(router.health_interval_s, REAL_HEALTH_INTERVAL_S),
                         health_timeout_s=max(router.health_timeout_s, REAL_HEALTH_TIMEOUT_S))
        notes.append(f"router probes every {router.health_interval_s:g} s with a "
                     f"{router.health_timeout_s:g} s timeout (real engines beside the harness on few cores "
                     "stall the machine for half a second at times; the scaled probe settings would read "
                     "that as engine failures)")
        expect, scaled = _settle_scaled(expect, slower)
        if scaled:
            notes.append(f"availability's after-window starts x{slower:g} later after a heal ({scaled}): "
                         "with slower probes a healed worker is seen Ready later")
    engines = scenario.engines
    if choice.kind == "vllm" and engines.transfer_timeout_s != VLLM_PULL_TIMEOUT_S:
        engines = replace(engines, transfer_timeout_s=VLLM_PULL_TIMEOUT_S)
        notes.append(f"transfer timeout taken as {VLLM_PULL_TIMEOUT_S:g} s: vLLM's NIXL decode has no pull "
                     "timeout of its own setting; a pull from a dead or replaced peer fails at its handshake "
                     "timeout (5 s, vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py)")
    if not choice.text_known and any(x.checker == "output" for x in expect):
        expect = tuple(x for x in expect if x.checker != "output")
        notes.append(OUTPUT_NOT_JUDGED)
    settles = [float(x.params["settle_s"]) for x in expect
               if x.checker == "availability" and isinstance(x.params.get("settle_s"), int | float)]
    if settles and max(settles) + AFTER_WINDOW_MIN_S > tail:
        tail = max(settles) + AFTER_WINDOW_MIN_S
        notes.append(f"load kept on {tail:g} s after the last fault ends (the after-window needs requests)")
    return replace(scenario, workload=replace(w, after_heal_s=tail), router=router, engines=engines,
                   expect=expect), notes
