"""The bundles made with real gateway releases give the plan an engineer would write by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.incident.bundle import read_bundle
from harness.incident.infer import infer
from harness.incident.plan import Plan

pytestmark = pytest.mark.unit

BUNDLES = Path(__file__).resolve().parents[2] / "data" / "incidents"


def plan_of(name: str) -> Plan:
    return infer(read_bundle([BUNDLES / name]))


def test_smg_1_10_1_restart_never_back() -> None:
    p = plan_of("smg-1.10.1-mooncake-restart")
    assert (p.release, p.topology, p.connector, p.transport) == ("smg==1.10.1", "1p1d", "mooncake", "grpc")
    assert p.router["health_interval_s"] == 1.0 and p.router["request_timeout_s"] == 8.0
    assert p.sources["router.health_interval_s"] == "gateway.cmdline:1"
    assert p.transfer_timeout_s == 2.0 and p.sources["transfer_timeout_s"] == "decode-0.log:1"
    (f,) = p.faults
    assert (f.action, f.target, f.params, f.cite) == (
        "Restart",
        "prefill-0",
        {"down_s": 0.6},
        "prefill-0.log:2",
    )
    assert 1.5 < f.at_s - p.load_start < 2.5
    assert [s.checker for s in p.symptoms] == ["recovery"]
    assert p.symptoms[0].cite.startswith("gateway.log.gz:")
    assert any("circuit_breaker" in d for d in p.defaults)


def test_smg_1_13_0_restart_between_probes_waits_the_transfer_timeout() -> None:
    p = plan_of("smg-1.13.0-restart-between-probes")
    assert p.release == "smg==1.13.0"  # from the banner of a JSON log
    (f,) = p.faults
    assert (f.action, f.params) == ("Restart", {"down_s": 0.0})
    # No probe saw the restart: a correct router mints the old id until its identity check too, so the
    # symptom is judged with the handoff checker's grace, not by transfer_timeout (which has none).
    assert [s.checker for s in p.symptoms] == ["handoff", "availability"]
    assert "waited out the 2 s KV transfer timeout" in p.symptoms[0].why


def test_vllm_router_hung_decode() -> None:
    p = plan_of("vllm-router-0.1.17-hung-decode")
    assert p.release == "vllm-router==0.1.17" and p.sources["release"] == "incident.toml:[gateway]"
    assert (p.topology, p.transport) == ("1p2d", "http")
    assert p.router["circuit_breaker_failures"] == 2 and p.router["request_timeout_s"] == 1.0
    assert [(f.action, f.target) for f in p.faults] == [("Wedge", "decode-0"), ("Heal", "decode-0")]
    assert p.faults[0].params == {"surface": "generate"}
    (s,) = p.symptoms
    assert s.checker == "availability" and s.params["during"] == 0.9
    # No client request at info level: the load is a named default, and long enough to judge the heal.
    assert any(d.startswith("load:") for d in p.defaults)
    assert p.duration_s > p.faults[1].at_s - p.load_start + s.params["settle_s"]


def test_kubernetes_events_give_a_process_restart(tmp_path: Path) -> None:
    """Gateway flags, pod events and what clients saw: no engine log at all."""
    (tmp_path / "gw.cmdline").write_text(
        "smg launch --pd-disaggregation --prefill grpc://10.0.0.5:8000 8998 --decode grpc://10.0.0.6:8000 "
        "--decode grpc://10.0.0.7:8000 --health-check-interval-secs 5\n"
    )
    events = {
        "kind": "EventList",
        "items": [
            {
                "kind": "Event",
                "reason": reason,
                "involvedObject": {"kind": "Pod", "name": pod},
                "lastTimestamp": at,
                "message": reason,
            }
            for reason, pod, at in [
                ("Killing", "llama-prefill-6c8f9-zx2", "2026-12-06T09:30:48Z"),
                ("Started", "llama-prefill-6c8f9-zx2", "2026-12-06T09:31:08Z"),
                ("Killing", "llama-decode-5b7d-q1", "2026-12-06T09:32:00Z"),
            ]
        ],
    }
    (tmp_path / "events.json").write_text(json.dumps(events))
    (tmp_path / "incident.toml").write_text('[symptom]\nclients_saw = ["hang"]\n')
    p = infer(read_bundle([tmp_path]))
    assert p.topology == "1p2d" and p.transport == "grpc"
    (f,) = p.faults
    assert (f.action, f.target, f.params) == ("Restart", "prefill-0", {"down_s": 20.0, "mode": "process"})
    assert f.cite == "events.json:items[0], events.json:items[1]"
    # Two decodes: the pod's name does not say which one.
    assert any("llama-decode-5b7d-q1" in s for s in p.skipped)
    assert [s.checker for s in p.symptoms] == ["transfer_timeout"]


def test_real_vllm_nixl_prefill_killed() -> None:
    """vLLM 0.32's own logs (a SIGKILL logs nothing; the respawn is a new log file on the same port), smg
    reaching each engine through a proxy that incident.toml names."""
    p = plan_of("smg-1.10.1-vllm-nixl-prefill-killed")
    assert (p.topology, p.connector, p.transport) == ("1p1d", "nixl", "http")
    assert p.sources["connector"].split(":")[0] in ("prefill-0.log", "decode-0.log")
    assert p.sources["transport"].startswith("gateway.log.gz:")  # smg's load monitor names it
    (f,) = p.faults
    assert f.action == "Restart" and f.target == "prefill-0" and f.params["mode"] == "process"
    # Down from the gateway's first failed probe to the new process's listen line (vLLM starts slowly).
    assert 30 < f.params["down_s"] < 45
    assert f.cite.startswith("gateway.log.gz:") and f.cite.endswith("prefill-0.2.log:78 (up)")
    assert [s.checker for s in p.symptoms] == ["recovery"]
