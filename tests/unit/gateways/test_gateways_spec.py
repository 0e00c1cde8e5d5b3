"""Router specs: `smg`, `smg==X.Y.Z`, `smg==latest`, `vllm-router`, `reference`, `cmd:` and bad input."""

from __future__ import annotations

import pytest

from harness.routers import RouterAdapterError
from harness.routers.gateways.cache import parse_index_versions
from harness.routers.gateways.spec import gateway_name, parse_router_spec, version_key


@pytest.mark.parametrize(
    ("spec", "kind", "package", "version", "label"),
    [
        ("reference", "reference", None, None, "reference"),
        ("", "reference", None, None, "reference"),
        ("smg", "gateway", "smg", None, "smg"),
        ("smg==1.12.0", "gateway", "smg", "1.12.0", "smg-1.12.0"),
        ("  SMG==Latest ", "gateway", "smg", "latest", "smg-latest"),
        ("vllm-router==0.1.17", "gateway", "vllm-router", "0.1.17", "vllm-router-0.1.17"),
        ("vllm_router", "gateway", "vllm-router", None, "vllm-router"),
        ("smg==1.0.0rc1", "gateway", "smg", "1.0.0rc1", "smg-1.0.0rc1"),
        ("cmd:my-router --port {port}", "cmd", None, None, "cmd"),
    ],
)
def test_parse_good_specs(spec: str, kind: str, package: str | None, version: str | None, label: str) -> None:
    rs = parse_router_spec(spec)
    assert rs.kind == kind
    assert (rs.gateway.package if rs.gateway else None) == package
    assert rs.version == version
    assert rs.label == label


def test_cmd_spec_keeps_template() -> None:
    assert parse_router_spec("cmd:x --port {port}").template == "x --port {port}"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nginx", "unknown router 'nginx'"),
        ("smg==", "empty version"),
        ("smg==abc", "not a release version"),
        ("smg>=1.2", "only NAME or NAME==VERSION"),
        ("smg @ 1.2", "only NAME or NAME==VERSION"),
        ("cmd:   ", "empty router command template"),
        ("vllm-router==1.0; rm -rf /", "not a release version"),
    ],
)
def test_parse_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(RouterAdapterError, match=match):
        parse_router_spec(spec)


def test_gateway_name() -> None:
    assert gateway_name("smg==1.2.3") == "smg"
    assert gateway_name("VLLM_ROUTER") == "vllm-router"
    assert gateway_name("reference") is None
    assert gateway_name("cmd:smg") is None


def test_version_order_is_numeric() -> None:
    vs = ["1.9.0", "1.10.1", "1.10.0", "1.2.0", "1.13.0"]
    assert sorted(vs, key=version_key, reverse=True) == ["1.13.0", "1.10.1", "1.10.0", "1.9.0", "1.2.0"]


def test_parse_pip_index_output() -> None:
    out = (
        "WARNING: pip index is currently an experimental command.\n"
        "smg (1.13.0)\n"
        "Available versions: 1.13.0, 1.12.0, 1.9.0, 1.10.1\n"
        "  INSTALLED: 1.13.0\n  LATEST:    1.13.0\n"
    )
    assert parse_index_versions(out, "smg") == ["1.13.0", "1.12.0", "1.10.1", "1.9.0"]
    # Only one release: older pips print just the header line.
    assert parse_index_versions("smg (0.1.0)\n", "smg") == ["0.1.0"]
    assert parse_index_versions("ERROR: No matching distribution found for smg\n", "smg") == []
