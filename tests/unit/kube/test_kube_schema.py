"""Every manifest the GPU-cluster sweep would apply, checked against the Kubernetes API schema as the
official client ships it (its generated models); and the check itself catches what it should."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("kubernetes", reason="the schema check needs the kubernetes client: the k8s extra")

from harness.kube.schema import schema_problems
from harness.sweep.dryrun import dry_run_document
from harness.sweep.plan import plan_sweep
from harness.sweep.spec import load_sweep


@pytest.fixture(scope="module")
def gpu_doc() -> dict:
    return dry_run_document(plan_sweep(load_sweep("gpu-cluster")), jobs=1)


def test_every_manifest_of_the_gpu_cluster_sweep_is_valid(gpu_doc: dict) -> None:
    docs = gpu_doc["namespaces"] + [m for c in gpu_doc["cluster"] for m in c["manifests"]]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "Pod", "Service"} <= kinds
    problems = [p for d in docs for p in schema_problems(d)]
    assert problems == []
    assert gpu_doc["schema"]["problems"] == [] and gpu_doc["schema"]["manifests"] == len(docs)


def test_the_network_policies_a_cut_would_apply_are_valid(gpu_doc: dict) -> None:
    from harness.kube import manifests as m
    from harness.kube.options import parse_options
    from harness.kube.plan import context
    from harness.scenario import load_scenarios

    (s,) = load_scenarios(["prefill_link_partitioned"])
    for connector, preset in (("nixl", "vllm-nixl-gpu"), ("mooncake", "vllm-mooncake-gpu")):
        ctx = context(s, "k", connector, "http", parse_options({"preset": preset}))
        for link in ("serve", "side_channel"):
            assert schema_problems(m.cut_policy(ctx, "prefill-0", link)) == []


def test_the_check_catches_a_wrong_type_an_unknown_field_and_a_missing_required_one(gpu_doc: dict) -> None:
    pod = copy.deepcopy(next(m for c in gpu_doc["cluster"] for m in c["manifests"] if m["kind"] == "Pod"))
    bad_type = copy.deepcopy(pod)
    bad_type["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    assert any("containerPort" in p for p in schema_problems(bad_type))
    unknown = copy.deepcopy(pod)
    unknown["spec"]["containers"][0]["gpu"] = 1
    assert any("containers[0].gpu: no such field" in p for p in schema_problems(unknown))
    nameless = copy.deepcopy(pod)
    del nameless["spec"]["containers"][0]["name"]
    assert schema_problems(nameless) != []
    assert schema_problems({"apiVersion": "v9", "kind": "Pod"})[0].startswith("no model")
