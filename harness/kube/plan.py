"""One cell on a cluster, planned: its manifests, how it is set up, what each timeline step does to the
cluster, and how it is torn down. Pure: nothing here talks to a cluster (`harness.kube.cluster` does)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.kube import manifests as m
from harness.kube.faults import ClusterAction, Unsupported, actions_for, create_pod, proxiable
from harness.kube.options import KubeOptions, parse_options
from harness.kube.presets import BOOTSTRAP_PORT, CONTROL_PORT, GRPC_PORT, HTTP_PORT, NIXL_PORT
from harness.routers import RouterAdapter
from harness.scenario import Scenario
from harness.scenario.links import links_in
from harness.topology import EngineSpec, Topology, parse_topology

# Checkers that judge from the fake engines' handoff provenance records, which a vLLM engine does not keep.
RECORD_CHECKERS = ("handoff", "output", "transfer_timeout", "recovery")


@dataclass
class KubeCellPlan:
    cell_id: str
    key_label: str
    namespace: str
    manifests: list[dict[str, Any]] = field(default_factory=list)
    setup: list[ClusterAction] = field(default_factory=list)
    steps: list[tuple[str, list[ClusterAction]]] = field(default_factory=list)
    teardown: list[ClusterAction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id, "cell": self.key_label, "namespace": self.namespace,
            "manifests": self.manifests,
            "setup": [a.to_dict() for a in self.setup],
            "steps": [{"step": name, "actions": [a.to_dict() for a in acts]} for name, acts in self.steps],
            "teardown": [a.to_dict() for a in self.teardown],
            "notes": self.notes,
        }


def cell_id(key_label: str) -> str:
    """A short DNS-safe name for a cell (object names stay under 63 characters)."""
    return "pdc-" + hashlib.sha256(key_label.encode()).hexdigest()[:8]


def context(scenario: Scenario, key_label: str, connector: str, transport: str, options: KubeOptions,
            seed: int | None = None) -> m.CellContext:
    """The cell's context; the links its network faults name get a proxy sidecar where one can stand."""
    proxied = frozenset((ref.engine, ref.link) for ref in links_in(scenario.timeline, connector)
                        if proxiable(options, connector, ref.link))
    return m.CellContext(cell_id(key_label), key_label, options, connector, transport, proxied,
                         transfer_timeout_s=getattr(scenario.engines, "transfer_timeout_s", None),
                         engine_settings=scenario.engines, seed=seed)


def unsupported(scenario: Scenario, connector: str, transport: str, table: Mapping[str, Any]) -> str | None:
    """Why this backend cannot run the cell faithfully (None: it can)."""
    try:
        options = parse_options(table)
    except ValueError as e:
        return f"engine backend: {e}"
    preset = options.preset
    if preset.connector is not None and preset.connector != connector:
        return f"engine preset {preset.name} runs the {preset.connector} connector, not {connector}"
    if transport not in preset.transports:
        return f"engine preset {preset.name} serves {'/'.join(preset.transports)}, not {transport}"
    ctx = context(scenario, scenario.name, connector, transport, options)
    for step in scenario.timeline:
        try:
            actions_for(step.action, ctx, step.name)
        except Unsupported as e:
            return f"step {step.name!r}: {e}"
    return None


def registered_engines(scenario: Scenario, topo_names: list[str]) -> list[str]:
    left_out = set(scenario.unregistered_engines) | set(scenario.deferred_engines)
    return [n for n in topo_names if n not in left_out]


def cluster_topology(ctx: m.CellContext, topology: str) -> Topology:
    """The cell's topology as the router sees it on the cluster: each engine at its Service's name."""
    shape = parse_topology(topology)
    engines = []
    for role, count in (("prefill", shape.prefills), ("decode", shape.decodes)):
        for i in range(count):
            name = f"{role}-{i}"
            engines.append(EngineSpec(name, role, i, HTTP_PORT, GRPC_PORT, CONTROL_PORT,  # type: ignore[arg-type]
                                      BOOTSTRAP_PORT, NIXL_PORT, host=ctx.host(name)))
    return Topology(shape, ctx.connector, ctx.transport, tuple(engines), m.ROUTER_PORT)  # type: ignore[arg-type]


def router_argv(adapter: RouterAdapter, topo: Topology, scenario: Scenario, registered: list[str],
                executable: str) -> list[str]:
    """The router's command line in a pod: the adapter's own flags, the image's executable, every
    interface."""
    argv = adapter.launch(topo, scenario.router, registered, "/tmp/router-events.jsonl").argv
    start = argv.index("--host") if "--host" in argv else 1
    out = [executable, *argv[start:]]
    for i, word in enumerate(out[:-1]):
        if word == "--host":
            out[i + 1] = "0.0.0.0"
    return out


def plan_cell(scenario: Scenario, key_label: str, topology: str, connector: str, transport: str,
              table: Mapping[str, Any], adapter: RouterAdapter, router_executable: str) -> KubeCellPlan:
    """Everything the cell does to the cluster. `scenario` at the settings preset it runs at."""
    options = parse_options(table)
    ctx = context(scenario, key_label, connector, transport, options)
    topo = cluster_topology(ctx, topology)
    names = topo.names()
    plan = KubeCellPlan(ctx.cell_id, key_label, ctx.namespace)
    deferred = set(scenario.deferred_engines)
    for name in names:
        svc = m.engine_service(ctx, name)
        if options.router == "outside":
            svc["spec"]["type"] = options.service_type
        plan.manifests.append(svc)
        plan.setup.append(ClusterAction("apply", ctx.name(name), "Service", body=svc))
    for name in names:
        if name in deferred:
            plan.manifests.append(m.engine_pod(ctx, name))
            continue
        acts = create_pod(ctx, name)
        plan.manifests.append(dict(acts[0].body or {}))
        plan.setup += acts
    if options.router == "cluster":
        argv = router_argv(adapter, topo, scenario, registered_engines(scenario, names), router_executable)
        pod, svc = m.router_pod(ctx, options.router_image, argv), m.router_service(ctx)
        plan.manifests += [pod, svc]
        rname = ctx.name("router")
        plan.setup += [ClusterAction("apply", rname, "Pod", body=pod),
                       ClusterAction("apply", rname, "Service", body=svc),
                       ClusterAction("wait", rname, "Pod", params={"until": "ready", "timeout_s": 60})]
        if options.service_type == "ClusterIP":
            plan.setup.append(ClusterAction("port-forward", f"service/{rname}",
                                            params={"port": m.ROUTER_PORT},
                                            note="the harness's client reaches the router through it"))
    else:
        plan.notes.append("the router runs on the harness's host and reaches the engines through their "
                          f"{options.service_type} Services")
    for step in scenario.timeline:
        try:
            plan.steps.append((step.name, actions_for(step.action, ctx, step.name)))
        except Unsupported as e:
            plan.notes.append(f"step {step.name!r} cannot run here: {e}")
    plan.teardown.append(ClusterAction(
        "delete", f"-l {m.CELL_LABEL}={ctx.cell_id}", "Pod,Service,NetworkPolicy",
        params={"grace_period_seconds": 0}, note="every object of the cell, by its label"))
    if options.preset.kind == "vllm":
        used = sorted({x.checker for x in scenario.expect} & set(RECORD_CHECKERS))
        if used:
            plan.notes.append("vLLM keeps no handoff provenance records: " + ", ".join(used)
                              + " judge from the fake engines' records and will say unknown")
    return plan
