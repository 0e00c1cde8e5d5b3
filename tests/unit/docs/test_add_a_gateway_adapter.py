"""The adapter the gateway how-to builds (examples/gateways/add_a_gateway_adapter.py): its launch line, what
its contract() declares, and the cells it skips, as the guide says. Pure: no process is started."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from harness.scenario import RouterSettings
from harness.suite import load_named
from harness.topology import build_topology

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "gateways" / "add_a_gateway_adapter.py"
GUIDE = ROOT / "docs" / "howto" / "add-a-gateway-adapter.md"
FLAGS = frozenset({
    "--host", "--port", "--pd-disaggregation", "--connector", "--prefill", "--decode",
    "--health-check-interval-secs", "--health-check-timeout-secs", "--health-failure-threshold",
    "--health-success-threshold", "--prefill-policy", "--decode-policy", "--cb-failure-threshold",
    "--cb-timeout-duration-secs",
})  # a release whose --help lacks --request-timeout-secs


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("add_a_gateway_adapter", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_adapter_passes_whole_seconds_and_leaves_out_a_flag_the_release_lacks() -> None:
    adapter = _example().MyGatewayRouter("/opt/my-gateway/bin/my-gateway", version="0.1.0", flags=FLAGS)
    assert adapter.name == "my-gateway-0.1.0"
    topo = build_topology("1p1d", "mooncake", "http", list(range(20000, 20100)))
    settings = RouterSettings(health_interval_s=0.3, health_timeout_s=1.0, request_timeout_s=8.0)
    argv = adapter.launch(topo, settings, ["prefill-0", "decode-0"], "events.jsonl").argv
    prefill, decode = topo.engine("prefill-0"), topo.engine("decode-0")
    assert argv[:8] == ["/opt/my-gateway/bin/my-gateway", "--host", "127.0.0.1", "--port",
                        str(topo.router_port), "--pd-disaggregation", "--connector", "mooncake"]
    assert argv[8:13] == ["--prefill", prefill.url("http"), str(prefill.bootstrap_port), "--decode",
                          decode.url("http")]
    assert argv[argv.index("--health-check-interval-secs") + 1] == "1"
    assert "--request-timeout-secs" not in argv and adapter.dropped == ["--request-timeout-secs"]
    contract = adapter.contract(settings)
    assert contract["health_interval_s"] == 1.0
    assert contract["request_timeout_s"] == 1800.0  # the flag was left out: the gateway default
    assert contract["circuit_breaker_failures"] is None and contract["identity_check_interval_s"] is None
    assert contract["rules"] == {}
    asked = RouterSettings(circuit_breaker_failures=5, circuit_breaker_open_s=2.5)
    assert adapter.contract(asked)["circuit_breaker_failures"] == 5
    assert adapter.contract(asked)["circuit_breaker_open_s"] == 3.0


def test_the_adapter_skips_what_the_gateway_cannot_run() -> None:
    adapter = _example().MyGatewayRouter("/opt/my-gateway/bin/my-gateway", flags=FLAGS)
    [scenario] = load_named(["prefill_restart_mooncake"])
    assert adapter.cannot_run(scenario, "1p1d", "mooncake", "http") is None
    why = adapter.cannot_run(scenario, "1p1d", "mooncake", "grpc")
    assert why == "my-gateway does not serve grpc workers"


def test_the_guide_shows_the_adapter_s_class_head_and_contract_as_they_are() -> None:
    source = EXAMPLE.read_text(encoding="utf-8")
    guide = GUIDE.read_text(encoding="utf-8")
    head = "class MyGatewayRouter" + source.split("class MyGatewayRouter", 1)[1].split("\n\n    def ", 1)[0]
    contract = "    def contract" + source.split("    def contract", 1)[1].split("\n\n", 1)[0]
    assert head in guide
    assert contract in guide
