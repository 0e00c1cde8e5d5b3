"""smg's worker registration with KV transfer facts, per release, without a network: the facts of an
engine, how each release takes them (labels in 1.10.x, spec fields in 1.11+), the `/query` engine id, the
launch argv of the default adapter and of the `smg-flags` variant, and the names the reports show."""

from __future__ import annotations

from typing import Any

import pytest

from harness.routers.gateways.adapters import ADAPTERS, SmgFlagsRouter, SmgRouter
from harness.routers.gateways.kv_facts import (
    KvFacts,
    engine_facts,
    engine_id_from_query,
    facts_style,
    registration_body,
)
from harness.routers.gateways.spec import parse_router_spec
from harness.scenario import RouterSettings
from harness.topology import allocate

SMG_FLAGS = frozenset({
    "--host", "--port", "--prometheus-host", "--prometheus-port", "--pd-disaggregation", "--prefill",
    "--decode", "--health-check-interval-secs", "--log-level", "--shutdown-grace-period-secs",
})
URL = "http://127.0.0.1:17100"
MOONCAKE_PREFILL = KvFacts("MooncakeConnector", "kv_producer", "eng-1", 17998)


@pytest.mark.parametrize(("version", "style"), [
    ("1.10.0", "labels"), ("1.10.1", "labels"), ("1.9.0", "labels"), ("1.11.0", "spec"), ("1.12.0", "spec"),
    ("1.13.0", "spec"), ("2.0.0", "spec"), (None, "both"),
])
def test_style_per_release(version: str | None, style: str) -> None:
    assert facts_style(version) == style


def test_labels_for_1_10() -> None:
    body = registration_body(URL, "prefill", MOONCAKE_PREFILL, facts_style("1.10.1"))
    assert body == {
        "url": URL, "worker_type": "prefill", "bootstrap_port": 17998,
        "labels": {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "kv_engine_id": "eng-1"},
    }


def test_spec_fields_for_1_11_and_later() -> None:
    body = registration_body(URL, "prefill", MOONCAKE_PREFILL, facts_style("1.13.0"))
    assert body == {
        "url": URL, "worker_type": "prefill", "bootstrap_port": 17998,
        "kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "kv_engine_id": "eng-1",
    }


def test_unknown_release_gets_both_spellings() -> None:
    body = registration_body(URL, "decode", KvFacts("NixlConnector", "kv_consumer"), "both")
    assert body["kv_connector"] == body["labels"]["kv_connector"] == "NixlConnector"
    assert body["kv_role"] == body["labels"]["kv_role"] == "kv_consumer"
    assert "kv_engine_id" not in body and "bootstrap_port" not in body


def test_no_engine_id_is_left_out_not_sent_empty() -> None:
    # An empty id reads as "unknown" in smg (legacy fallback) but a missing one says so more plainly.
    body = registration_body(URL, "prefill", KvFacts("MooncakeConnector", "kv_producer", None, 17998), "spec")
    assert "kv_engine_id" not in body
    assert body["kv_connector"] == "MooncakeConnector" and body["bootstrap_port"] == 17998


def test_dp_prefill_registers_the_base_id_and_its_size() -> None:
    body = registration_body(URL, "prefill", KvFacts("MooncakeConnector", "kv_producer", "eng", 1, 2), "spec")
    assert body["kv_engine_id"] == "eng" and body["labels"] == {"dp_size": "2"}


@pytest.mark.parametrize(("connector", "role", "want"), [
    ("mooncake", "prefill", KvFacts("MooncakeConnector", "kv_producer", "e-p", 9000)),
    ("mooncake", "decode", KvFacts("MooncakeConnector", "kv_consumer")),
    ("nixl", "prefill", KvFacts("NixlConnector", "kv_producer")),
    ("nixl", "decode", KvFacts("NixlConnector", "kv_consumer")),
])
def test_engine_facts(connector: str, role: str, want: KvFacts) -> None:
    answer = {"0": {"engine_id": "e-p", "worker_addr": {"0": {"0": "tcp://127.0.0.1:1"}}}}
    assert engine_facts(connector, role, 9000, answer) == want


def test_engine_facts_without_an_answer_has_no_engine_id() -> None:
    want = KvFacts("MooncakeConnector", "kv_producer", None, 9000)
    assert engine_facts("mooncake", "prefill", 9000, None) == want


def test_engine_facts_refuse_what_vllm_has_no_name_for() -> None:
    with pytest.raises(ValueError, match="no vLLM KV facts"):
        engine_facts("none", "prefill")


@pytest.mark.parametrize(("answer", "want"), [
    ({"0": {"engine_id": "abc"}}, ("abc", None)),
    ({"0": {"engine_id": "abc_dp0"}, "1": {"engine_id": "abc_dp1"}}, ("abc", 2)),
    ({"1": {"engine_id": "abc_dp1"}, "0": {"engine_id": "abc_dp0"}}, ("abc", 2)),
    ({"0": {"engine_id": "abc_dp0"}, "1": {"engine_id": "xyz_dp1"}}, (None, None)),
    ({"0": {"engine_id": "a"}, "2": {"engine_id": "b"}}, (None, None)),
    ({"0": {"engine_id": ""}}, (None, None)),
    ({"x": {"engine_id": "a"}}, (None, None)),
    ({}, (None, None)),
    ([], (None, None)),
    ("nope", (None, None)),
])
def test_engine_id_from_query(answer: Any, want: tuple[str | None, int | None]) -> None:
    assert engine_id_from_query(answer) == want


def _flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_http_launch_has_no_worker_flags_and_grpc_keeps_them() -> None:
    settings = RouterSettings()
    http = allocate("1p1d", "mooncake", "http")
    a = SmgRouter("smg", version="1.13.0", flags=SMG_FLAGS)
    argv = a.launch(http, settings, ["prefill-0", "decode-0"], "/dev/null").argv
    assert "--pd-disaggregation" in argv
    assert _flag(argv, "--prefill") == [] and _flag(argv, "--decode") == []
    grpc = allocate("1p1d", "mooncake", "grpc")
    argv = a.launch(grpc, settings, ["prefill-0", "decode-0"], "/dev/null").argv
    assert _flag(argv, "--prefill") == [grpc.prefills[0].url("grpc")]
    assert _flag(argv, "--decode") == [grpc.decodes[0].url("grpc")]


def test_flags_variant_keeps_http_worker_flags() -> None:
    http = allocate("1p1d", "mooncake", "http")
    a = SmgFlagsRouter("smg", version="1.12.0", flags=SMG_FLAGS)
    argv = a.launch(http, RouterSettings(), ["prefill-0", "decode-0"], "/dev/null").argv
    assert _flag(argv, "--prefill") == [http.prefills[0].url("http")]
    assert _flag(argv, "--decode") == [http.decodes[0].url("http")]


def test_flags_variant_worker_body_has_no_facts() -> None:
    http = allocate("1p1d", "mooncake", "http")
    a = SmgFlagsRouter("smg", version="1.13.0", flags=SMG_FLAGS)
    assert a.worker_body(http, "prefill-0", None) == {
        "url": http.prefills[0].url("http"), "worker_type": "prefill",
        "bootstrap_port": http.prefills[0].bootstrap_port,
    }


@pytest.mark.parametrize(("spec", "name", "label", "adapter"), [
    ("smg==1.13.0", "smg-1.13.0", "smg-1.13.0", SmgRouter),
    ("smg-flags==1.13.0", "smg-flags-1.13.0", "smg-flags-1.13.0", SmgFlagsRouter),
    ("smg-flags", "smg-flags", "smg-flags", SmgFlagsRouter),
])
def test_variant_names_in_reports(spec: str, name: str, label: str, adapter: type[SmgRouter]) -> None:
    rs = parse_router_spec(spec)
    assert rs.gateway is not None and rs.gateway.package == "smg"  # same releases, same cache
    assert rs.label == label
    cls = ADAPTERS[rs.gateway.adapter]
    assert cls is adapter
    assert cls("smg", version=rs.version, flags=SMG_FLAGS).name == name


def test_vllm_router_without_kv_connector_flag_skips_mooncake() -> None:
    from harness.routers.gateways.adapters import VllmRouter
    from harness.scenario import Scenario

    s = Scenario(name="x", description="x", topologies=("1p1d",), connectors=("mooncake", "nixl"),
                 transports=("http",))
    old = VllmRouter("vllm-router", version="0.1.0", flags=SMG_FLAGS)
    assert "no --kv-connector flag" in (old.cannot_run(s, "1p1d", "mooncake", "http") or "")
    assert old.cannot_run(s, "1p1d", "nixl", "http") is None
    new = VllmRouter("vllm-router", version="0.1.17", flags=SMG_FLAGS | {"--kv-connector"})
    assert new.cannot_run(s, "1p1d", "mooncake", "http") is None
