"""A gateway profile runs only on the transports where it was compared with its release: `pdchaos run` skips
its other cells with the reason, and `pdchaos search` draws only those transports."""

from __future__ import annotations

import pytest

from harness.matrix import skip_reason
from harness.routers.profiles import PROFILES, ProfileRouter, profile_named
from harness.runner import Cell
from harness.scenario import Scenario
from harness.search.cli import _profile_transport


def test_a_profile_skips_the_cells_of_a_transport_it_does_not_model() -> None:
    router = ProfileRouter(profile_named("smg-1.10.1"))
    scenario = Scenario(name="s", description="d")
    assert skip_reason(router, scenario, Cell("1p1d", "mooncake", "grpc")) is None
    why = skip_reason(router, scenario, Cell("1p1d", "mooncake", "http"))
    assert why is not None and why.startswith("profile smg-1.10.1 models smg==1.10.1 over grpc only")


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_search_draws_the_profile_s_own_transports(name: str) -> None:
    transports = PROFILES[name].transports
    drawn = _profile_transport(f"profile:{name}", None)
    assert drawn == (transports[0] if len(transports) == 1 else None)
    for t in transports:
        assert _profile_transport(f"profile:{name}", t) == t


def test_the_reference_router_draws_what_it_is_told() -> None:
    assert _profile_transport("reference", None) is None
    assert _profile_transport("reference", "http") == "http"


@pytest.mark.parametrize("spec", ["smg==1.13.0", "vllm-router==0.1.17", "cmd:my-router --port {port}"])
def test_a_router_with_no_regular_mode_adapter_skips_regular_cells_with_the_reason(spec: str) -> None:
    from harness.routers import make_router_adapter

    router = make_router_adapter(spec)
    scenario = Scenario(name="s", description="d")
    why = skip_reason(router, scenario, Cell("2r", "mooncake", "http"))
    assert why is not None and "regular mode (2r) runs on the reference router" in why
    assert skip_reason(make_router_adapter("reference"), scenario, Cell("2r", "mooncake", "http")) is None
