"""The link and network-fault model (harness.scenario.links) and the real world's proxied view of a topology
(harness.worlds.real.links): validation, toxics, flap schedule, router view."""

from __future__ import annotations

import pytest

from harness.scenario import At, Restart, Scenario, ScenarioError, Step, load_scenarios, validate
from harness.scenario.links import (
    HealLink,
    LinkBandwidth,
    LinkFlap,
    LinkLatency,
    LinkRef,
    LinkReset,
    Partition,
    fault_kind,
    fault_params,
    flap_schedule,
    link_applies,
    links_in,
    toxics_for,
)
from harness.topology import build_topology
from harness.worlds.real.links import ProxiedTopology, proxy_name, router_view, upstream_port


def _scenario(*steps: Step, connectors: tuple[str, ...] = ("mooncake", "nixl"),
              topologies: tuple[str, ...] = ("2p1d",)) -> Scenario:
    return Scenario(name="net", description="", bugs=("x",), topologies=topologies, connectors=connectors,
                    timeline=steps)


def test_link_applies_per_role_and_connector() -> None:
    assert link_applies("decode-0", "serve", "nixl") is None
    assert link_applies("prefill-0", "bootstrap", "mooncake") is None
    assert "Mooncake" in (link_applies("prefill-0", "bootstrap", "nixl") or "")
    assert "Mooncake" in (link_applies("decode-0", "bootstrap", "mooncake") or "")
    assert link_applies("prefill-1", "side_channel", "nixl") is None
    assert "not a prefill" in (link_applies("decode-0", "side_channel", "mooncake") or "")
    assert "unknown link" in (link_applies("decode-0", "kv", "mooncake") or "")


def test_valid_network_timeline_passes_validation() -> None:
    validate(_scenario(
        Step("cut", Partition("prefill-1"), At(1.0)),
        Step("slow", LinkLatency("prefill-0", "side_channel", latency_ms=50, jitter_ms=10), At(1.5)),
        Step("cap", LinkBandwidth("prefill-0", "side_channel", rate_kb_s=10), At(1.6)),
        Step("reset", LinkReset("prefill-1", "side_channel"), At(1.7)),
        Step("flap", LinkFlap("decode-0", down_s=0.2, up_s=0.2, cycles=2), At(2.0)),
        Step("heal", HealLink("prefill-1"), At(3.0)),
    ))


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Partition("prefill-0", mode="sideways"), "partition mode"),
        (Partition("prefill-0", link="kv"), "unknown link"),
        (Partition("decode-0", link="side_channel"), "not a prefill"),
        (Partition("prefill-0", link="bootstrap"), "Mooncake prefill"),  # the scenario also runs NIXL
        (LinkLatency("prefill-0", latency_ms=-1), "must be >= 0"),
        (LinkLatency("prefill-0", latency_ms=10, jitter_ms=20), "jitter_ms must not exceed"),
        (LinkLatency("prefill-0", stream="sideways"), "stream 'sideways'"),
        (LinkReset("prefill-0", timeout_ms=-5), "timeout_ms"),
        (LinkBandwidth("prefill-0", rate_kb_s=0), "rate_kb_s must be > 0"),
        (LinkFlap("prefill-0", down_s=0), "down_s and up_s"),
        (LinkFlap("prefill-0", cycles=0), "cycles"),
        (HealLink("prefill-0", link="nope"), "unknown link"),
    ],
)
def test_bad_network_actions_are_scenario_errors(action: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        validate(_scenario(Step("bad", action, At(1.0))))  # type: ignore[arg-type]


def test_target_must_be_in_every_topology() -> None:
    with pytest.raises(ScenarioError, match="not in 1p1d"):
        validate(_scenario(Step("cut", Partition("prefill-1"), At(1.0)), topologies=("2p1d", "1p1d")))


def test_bootstrap_link_is_fine_for_a_mooncake_only_scenario() -> None:
    validate(_scenario(Step("cut", Partition("prefill-0", "bootstrap"), At(1.0)), connectors=("mooncake",)))


def test_links_in_keeps_first_mention_order_and_skips_other_actions() -> None:
    steps = (
        Step("a", LinkLatency("prefill-0", "side_channel"), At(1)),
        Step("b", Restart("prefill-0"), At(2)),
        Step("c", Partition("decode-0"), At(3)),
        Step("d", HealLink("prefill-0", "side_channel"), At(4)),
        Step("e", HealLink("decode-0"), At(5)),  # all links: names none
        Step("f", Partition("prefill-0", "bootstrap"), At(6)),
    )
    assert links_in(steps) == [LinkRef("prefill-0", "side_channel"), LinkRef("decode-0", "serve"),
                               LinkRef("prefill-0", "bootstrap")]
    # Under NIXL a prefill has no bootstrap link: left out.
    assert LinkRef("prefill-0", "bootstrap") not in links_in(steps, "nixl")
    assert links_in((Step("b", Restart("prefill-0"), At(2)),)) == []


def test_toxics_and_kinds() -> None:
    assert toxics_for(Partition("p", mode="down"), "cut") == []
    wedge = toxics_for(Partition("p", mode="timeout"), "w")
    assert {(t.type, t.stream) for t in wedge} == {("timeout", "downstream"), ("timeout", "upstream")}
    assert all(t.attributes == {"timeout": 0} for t in wedge)
    assert len({t.name for t in wedge}) == 2 and all(t.name.startswith("pdchaos-w") for t in wedge)
    lat = toxics_for(LinkLatency("p", latency_ms=120, jitter_ms=30, stream="upstream"), "slow")[0]
    assert lat.body() == {"name": "pdchaos-slow", "type": "latency", "stream": "upstream", "toxicity": 1.0,
                          "attributes": {"latency": 120, "jitter": 30}}
    assert toxics_for(LinkReset("p", timeout_ms=7), "r")[0].attributes == {"timeout": 7}
    assert toxics_for(LinkBandwidth("p", rate_kb_s=5), "b")[0].attributes == {"rate": 5}
    assert toxics_for(LinkFlap("p"), "f") == []
    kinds = [fault_kind(a) for a in (Partition("p"), Partition("p", mode="timeout"), LinkLatency("p"),
                                     LinkReset("p"), LinkBandwidth("p"), LinkFlap("p"))]
    assert kinds == ["link_down", "link_timeout", "link_latency", "link_reset", "link_bandwidth", "link_flap"]
    assert fault_params(LinkLatency("p", "side_channel", 5)) == {"link": "side_channel", "latency_ms": 5,
                                                                "jitter_ms": 0, "stream": "downstream"}
    with pytest.raises(TypeError):
        fault_kind(HealLink("p"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        toxics_for(Restart("p"), "x")  # type: ignore[arg-type]


def test_flap_schedule_alternates_and_ends_up() -> None:
    assert flap_schedule(0.5, 0.25, 2) == [(0.0, False), (0.5, True), (0.75, False), (1.25, True)]
    assert flap_schedule(1.0, 1.0, 1) == [(0.0, False), (1.0, True)]


def _topo(transport: str = "http", connector: str = "mooncake"):  # type: ignore[no-untyped-def]
    return build_topology("1p1d", connector, transport, list(range(20000, 20011)))


def test_router_view_swaps_proxied_ports_and_maps_both_urls_back() -> None:
    topo = _topo()
    p, d = topo.engine("prefill-0"), topo.engine("decode-0")
    view = router_view(topo, {LinkRef("prefill-0", "serve"): 30001, LinkRef("prefill-0", "bootstrap"): 30002,
                              LinkRef("prefill-0", "side_channel"): 30003})
    assert isinstance(view, ProxiedTopology)
    vp = view.engine("prefill-0")
    assert vp.http_port == 30001 and vp.bootstrap_port == 30002
    assert vp.grpc_port == p.grpc_port and vp.control_port == p.control_port
    assert view.engine("decode-0") == d
    assert view.url_of("prefill-0") == "http://127.0.0.1:30001"
    assert view.name_of_url("http://127.0.0.1:30001") == "prefill-0"
    assert view.name_of_url(topo.url_of("prefill-0")) == "prefill-0"  # the real address still maps
    assert view.name_of_url("http://127.0.0.1:1") is None
    assert view.router_url == topo.router_url


def test_router_view_grpc_and_unchanged() -> None:
    topo = _topo("grpc")
    view = router_view(topo, {LinkRef("decode-0", "serve"): 30009})
    assert view.engine("decode-0").grpc_port == 30009
    assert view.engine("decode-0").http_port == topo.engine("decode-0").http_port
    # Only a side channel proxied: the router sees the topology unchanged.
    assert router_view(topo, {LinkRef("prefill-0", "side_channel"): 30010}) is topo
    assert router_view(topo, {}) is topo


def test_upstream_ports_and_names() -> None:
    topo = _topo("grpc")
    p = topo.engine("prefill-0")
    assert upstream_port(p, "serve", "grpc", None) == p.grpc_port
    assert upstream_port(p, "serve", "http", None) == p.http_port
    assert upstream_port(p, "bootstrap", "grpc", None) == p.bootstrap_port
    assert upstream_port(p, "side_channel", "grpc", 4242) == 4242
    assert upstream_port(p, "side_channel", "grpc", None) is None
    assert proxy_name("run1-", LinkRef("prefill-0", "serve")) == "run1-prefill-0.serve"


def test_shipped_network_scenarios_load() -> None:
    names = {"prefill_link_partitioned", "decode_link_wedged", "side_channel_reset_during_pull",
             "slow_side_channel", "side_channel_bandwidth_cap", "prefill_link_flapping"}
    found = {s.name: s for s in load_scenarios(sorted(names))}
    assert set(found) == names
    for s in found.values():
        assert s.bugs and links_in(s.timeline), s.name
    assert "slow" in found["prefill_link_flapping"].tags
