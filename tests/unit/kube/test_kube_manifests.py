"""The cluster backend's plan of a cell: pods and services as vLLM's and llm-d's PD deployments have them,
and each scenario action as cluster actions (or the reason it cannot be one)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.kube import manifests as m
from harness.kube.faults import Unsupported, actions_for
from harness.kube.options import parse_options
from harness.kube.plan import context, plan_cell, unsupported
from harness.routers import ReferenceRouter
from harness.scenario import Crash, Heal, Restart, Scenario, SlowStart, Wedge, load_scenarios
from harness.scenario.links import LinkLatency, Partition

NIXL = {"preset": "vllm-nixl-gpu", "namespace": "ns"}
FAKE = {"preset": "pdchaos-fake", "namespace": "ns"}


def scenario(name: str) -> Scenario:
    (s,) = [x for x in load_scenarios([name])]
    return s


def plan(name: str, topology: str = "2p2d", table: dict[str, Any] | None = None, transport: str = "http"):
    return plan_cell(scenario(name), f"{name} {topology}", topology, "nixl", transport, table or NIXL,
                     ReferenceRouter(), "pdchaos-router")


def by_kind(p, kind: str) -> list[dict[str, Any]]:
    return [d for d in p.manifests if d["kind"] == kind]


def test_a_2p2d_nixl_cell_has_four_gpu_engine_pods_each_behind_its_service_and_a_router() -> None:
    p = plan("prefill_restart_nixl")
    pods, services = by_kind(p, "Pod"), by_kind(p, "Service")
    engines = [d for d in pods if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    assert sorted(d["metadata"]["labels"]["pdchaos.io/engine"] for d in engines) == [
        "decode-0", "decode-1", "prefill-0", "prefill-1"]
    assert len(services) == 5  # four engines and the router
    for pod in engines:
        c = pod["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert c["image"].startswith("vllm/vllm-openai:")
        script = c["command"][2]
        assert '"kv_connector":"NixlConnector","kv_role":"kv_both"' in script
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"
        assert pod["spec"]["restartPolicy"] == "Never"
        assert c["readinessProbe"]["httpGet"]["path"] == "/health" and "startupProbe" in c
    router = next(d for d in pods if d["metadata"]["name"].endswith("-router"))
    args = router["spec"]["containers"][0]["args"]
    assert args[:3] == ["pdchaos-router", "--host", "0.0.0.0"]
    assert f"http://{p.cell_id}-prefill-1.ns.svc.cluster.local:8000" in args
    assert len({d["metadata"]["labels"][m.CELL_LABEL] for d in p.manifests}) == 1


def test_a_mooncake_prefill_gets_the_producer_role_and_its_bootstrap_port() -> None:
    ctx = context(scenario("prefill_restart_mooncake"), "k", "mooncake", "http",
                  parse_options({"preset": "vllm-mooncake-gpu"}))
    pod = m.engine_pod(ctx, "prefill-0")
    c = pod["spec"]["containers"][0]
    assert '"kv_role":"kv_producer"' in c["command"][2]
    assert {"name": "bootstrap", "containerPort": 8998, "protocol": "TCP"} in c["ports"]
    assert '"kv_role":"kv_consumer"' in m.engine_pod(ctx, "decode-0")["spec"]["containers"][0]["command"][2]


def test_restart_deletes_the_pod_and_creates_it_again_behind_the_same_service() -> None:
    ctx = context(scenario("prefill_restart_nixl"), "k", "nixl", "http", parse_options(NIXL))
    acts = actions_for(Restart("prefill-0", down_s=0.6), ctx)
    assert [a.verb for a in acts] == ["delete", "wait", "sleep", "apply", "wait"]
    assert acts[3].body is not None and acts[3].body["metadata"]["name"] == ctx.name("prefill-0")
    crash = actions_for(Crash("prefill-0"), ctx)
    assert crash[0].verb == "exec" and "kill -KILL" in crash[0].command[-1]
    assert [a.params.get("grace_period_seconds") for a in crash if a.verb == "delete"] == [0]
    slow = actions_for(SlowStart("prefill-0", refuse_s=1.5), ctx)
    init = slow[2].body["spec"]["initContainers"][0]  # type: ignore[index]
    assert init["command"] == ["sleep", "1.5"]


def test_a_frozen_process_is_sigstop_through_exec_and_a_heal_sends_sigcont() -> None:
    ctx = context(scenario("decode_process_frozen"), "k", "nixl", "http", parse_options(NIXL))
    (stop,) = actions_for(Wedge("decode-0", mode="sigstop"), ctx)
    assert stop.verb == "exec" and "kill -STOP" in stop.command[-1] and m.PID_FILE in stop.command[-1]
    assert "kill -CONT" in actions_for(Heal("decode-0"), ctx)[0].command[-1]
    assert "exec" in stop.describe() and ctx.name("decode-0") in stop.describe()


def test_link_faults_are_a_sidecar_proxy_or_a_network_policy() -> None:
    s = scenario("prefill_link_partitioned")
    ctx = context(s, "k", "nixl", "http", parse_options(NIXL))
    assert ("prefill-1", "serve") in ctx.proxied
    svc = m.engine_service(ctx, "prefill-1")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}["http"] == 18000
    pod = m.engine_pod(ctx, "prefill-1")
    assert [c["name"] for c in pod["spec"]["containers"]] == ["engine", "toxiproxy"]
    (down,) = actions_for(Partition("prefill-1", "serve", "down"), ctx)
    assert down.verb == "http" and down.body == {"enabled": False}
    wedge = actions_for(Partition("prefill-1", "serve", "timeout"), ctx, "cut")
    assert [(a.body or {}).get("type") for a in wedge] == ["timeout", "timeout"]
    assert (wedge[0].body or {})["name"] == "pdchaos-cut"
    # No proxy can stand in front of a vLLM side channel: a cut of it drops its packets instead.
    (cut,) = actions_for(Partition("prefill-0", "side_channel", "timeout"), ctx)
    policy = cut.body
    assert policy is not None and policy["kind"] == "NetworkPolicy"
    open_ports = policy["spec"]["ingress"][0]["ports"]
    assert all(not (p["port"] <= 5600 <= p.get("endPort", p["port"])) for p in open_ports)
    assert any(p["port"] <= 8000 <= p.get("endPort", p["port"]) for p in open_ports)
    lat = actions_for(LinkLatency("prefill-1", "serve", latency_ms=300), ctx)
    assert lat[0].body is not None and lat[0].body["type"] == "latency"


def test_what_the_backend_cannot_do_faithfully_is_unsupported_with_a_reason() -> None:
    ctx = context(scenario("prefill_restart_nixl"), "k", "nixl", "http", parse_options(NIXL))
    with pytest.raises(Unsupported, match="no fault control API"):
        actions_for(Wedge("decode-0", surface="generate"), ctx)
    with pytest.raises(Unsupported, match="advertises its own KV side-channel port"):
        actions_for(LinkLatency("prefill-0", "side_channel"), ctx)
    assert unsupported(scenario("side_channel_reset_during_pull"), "nixl", "http", NIXL) is not None
    assert unsupported(scenario("prefill_restart_nixl"), "nixl", "grpc", NIXL) is not None
    assert unsupported(scenario("prefill_restart_nixl"), "nixl", "http", NIXL) is None


def test_the_fake_engines_preset_runs_protocol_faults_through_their_control_api() -> None:
    s = scenario("wedged_decode_generate")
    ctx = context(s, "k", "mooncake", "grpc", parse_options(FAKE))
    (wedge,) = actions_for(Wedge("decode-0", surface="generate"), ctx)
    assert wedge.target.endswith(":8002/control/fault") and wedge.body == {"fault": "wedge",
                                                                             "surface": "generate"}
    pod = m.engine_pod(ctx, "prefill-0")
    c = pod["spec"]["containers"][0]
    assert "pdchaos-engine" in c["command"][2] and '--host "$POD_IP"' in c["command"][2]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert unsupported(s, "mooncake", "grpc", FAKE) is None


def test_fake_engine_pods_and_control_calls_share_the_token_secret() -> None:
    """An engine started without a token makes up a random one: the pods must read the Secret and the
    fault actions must present it, or every control call gets 401."""
    ctx = context(scenario("wedged_decode_generate"), "k", "mooncake", "grpc",
                  parse_options({**FAKE, "control_token_secret": "my-token"}))
    (wedge,) = actions_for(Wedge("decode-0", surface="generate"), ctx)
    assert wedge.params["bearer_secret"] == "my-token" and "Bearer" in wedge.describe()
    env = m.engine_pod(ctx, "decode-0")["spec"]["containers"][0]["env"]
    (tok,) = [e for e in env if e["name"] == "PDCHAOS_CONTROL_TOKEN"]
    assert tok["valueFrom"]["secretKeyRef"] == {"name": "my-token", "key": "token"}


def test_vllm_cells_say_which_checkers_cannot_judge_without_provenance_records() -> None:
    p = plan("prefill_restart_nixl")
    assert any("provenance" in n for n in p.notes)
    json.dumps(p.to_dict())  # the dry run prints it as JSON
