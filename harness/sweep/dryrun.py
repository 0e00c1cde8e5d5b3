"""`pdchaos sweep FILE --dry-run`: what a sweep would do, without doing it.

Every cell it would run and every cell it leaves out (with the reason); for cells whose engines are on a
cluster, every manifest it would apply (as JSON, what `kubectl apply -f` takes) and every action of the
set-up, of each timeline step and of the teardown. When the `kubernetes` client is installed each
manifest is also checked against the client's API models, and a manifest that does not pass is an error.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from harness.kube import manifests as km
from harness.kube.options import parse_options
from harness.kube.plan import KubeCellPlan, plan_cell
from harness.routers import CommandRouter, ReferenceRouter, RouterAdapter
from harness.scenario import apply_preset, preset
from harness.sweep.plan import SweepCell, SweepPlan


def offline_adapter(spec: str) -> tuple[RouterAdapter, str]:
    """(adapter, the executable in the router's image) without resolving or installing a gateway: its
    flags are all the dry run needs."""
    if spec in ("reference", "", "pdchaos-router"):
        return ReferenceRouter(), "pdchaos-router"
    if spec.startswith("cmd:"):
        adapter = CommandRouter(spec[4:])
        return adapter, adapter.words[0] if adapter.words else "router"
    from harness.routers.gateways.adapters import ADAPTERS
    from harness.routers.gateways.spec import parse_router_spec

    rs = parse_router_spec(spec)
    assert rs.gateway is not None
    return ADAPTERS[rs.gateway.adapter](rs.gateway.executable, version=rs.version), rs.gateway.executable


def cluster_plans(plan: SweepPlan) -> list[tuple[SweepCell, KubeCellPlan]]:
    out = []
    for c in plan.cells:
        if c.backend is None:
            continue
        adapter, exe = offline_adapter(c.router.spec)
        scenario = apply_preset(c.scenario, preset(c.key.settings))
        out.append((c, plan_cell(scenario, c.key.label, c.key.topology, c.key.connector, c.key.transport,
                                 c.backend.options, adapter, exe)))
    return out


def namespaces(plan: SweepPlan) -> list[dict[str, Any]]:
    seen = {}
    for c in plan.cells:
        if c.backend is not None:
            ns = parse_options(c.backend.options).namespace
            seen.setdefault(ns, km.namespace(ns))
    return list(seen.values())


def check_schemas(docs: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """(what checked them, the problems); ('', []) when the kubernetes client is not installed."""
    from harness.kube.schema import SchemaUnavailable, client_version, schema_problems

    problems: list[str] = []
    try:
        for d in docs:
            problems += schema_problems(d)
    except SchemaUnavailable:
        return "", []
    return f"kubernetes client {client_version()} API models", problems


def dry_run_document(plan: SweepPlan, jobs: int) -> dict[str, Any]:
    clusters = cluster_plans(plan)
    ns_docs = namespaces(plan)
    docs = ns_docs + [d for _, p in clusters for d in p.manifests]
    checker, problems = check_schemas(docs)
    spec = plan.spec
    return {
        "sweep": spec.name, "file": str(spec.path) if spec.path else None, "jobs": jobs,
        "cells": [{**c.key.to_dict(), "label": c.key.label, "router_spec": c.router.spec,
                   "bugs": list(c.bugs)} for c in plan.cells],
        "skipped": [s.to_dict() for s in plan.skipped],
        "namespaces": ns_docs,
        "cluster": [p.to_dict() for _, p in clusters],
        "schema": {"checked_with": checker or None, "manifests": len(docs) if checker else 0,
                   "problems": problems},
    }


def print_dry_run(doc: dict[str, Any], out: TextIO) -> None:
    w = out.write
    w(f"sweep {doc['sweep']} ({doc['file']}): {len(doc['cells'])} cells, {len(doc['skipped'])} left out; "
      f"{doc['jobs']} at once\n")
    w("cells:\n")
    for c in doc["cells"]:
        bugs = f"  (bugs put back: {', '.join(c['bugs'])})" if c["bugs"] else ""
        w(f"  {c['label']}{bugs}\n")
    if doc["skipped"]:
        w("left out:\n")
        for s in doc["skipped"]:
            w(f"  {s['scenario']} {s['topology']}-{s['connector']}-{s['transport']} "
              f"[{s['router']}, {s['world']}, {s['settings']}, {s['engines']}]: {s['reason']}\n")
    for ns in doc["namespaces"]:
        w(f"\n# namespace\n{json.dumps(ns, indent=2)}\n")
    for p in doc["cluster"]:
        w(f"\n=== cluster cell {p['cell']} ({p['cell_id']}, namespace {p['namespace']})\n")
        for m in p["manifests"]:
            w(f"# {m['kind']} {m['metadata']['name']}\n{json.dumps(m, indent=2)}\n")
        w("set-up:\n")
        for a in p["setup"]:
            w(f"  {a['describe']}\n")
        w("faults:\n")
        for step in p["steps"]:
            w(f"  step {step['step']}:\n")
            for a in step["actions"]:
                w(f"    {a['describe']}\n")
        w("teardown:\n")
        for a in p["teardown"]:
            w(f"  {a['describe']}\n")
        for n in p["notes"]:
            w(f"note: {n}\n")
    sch = doc["schema"]
    if sch["checked_with"]:
        state = "all valid" if not sch["problems"] else f"{len(sch['problems'])} problem(s)"
        w(f"\nschema: {sch['manifests']} manifests checked against the {sch['checked_with']}: {state}\n")
        for prob in sch["problems"]:
            w(f"  {prob}\n")
    elif doc["cluster"]:
        w("\nschema: not checked (pip install -e '.[k8s]' for the kubernetes client's API models)\n")
