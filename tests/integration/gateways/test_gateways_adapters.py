"""Gateway adapters without a gateway: flag mapping, flags a release lacks, skip reasons, adjustments, and
reading `/workers` and liveness from a small HTTP server shaped like smg's and vllm-router's answers."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.routers import RouterAdapterError
from harness.routers.gateways.adapters import (
    SmgFlagsRouter,
    SmgRouter,
    VllmRouter,
    help_flags,
    normalize_status,
    whole_seconds,
)
from harness.scenario import At, PatchWorker, RouterSettings, Scenario, Step
from harness.topology import Topology, allocate

SETTINGS = RouterSettings(
    health_interval_s=0.3, health_timeout_s=0.5, failure_threshold=2, success_threshold=3,
    request_timeout_s=8.0, prefill_policy="round_robin", decode_policy="power_of_two",
)
SMG_FLAGS = frozenset({
    "--host", "--port", "--prometheus-host", "--prometheus-port", "--pd-disaggregation", "--prefill",
    "--decode", "--health-check-interval-secs", "--health-check-timeout-secs", "--health-failure-threshold",
    "--health-success-threshold", "--prefill-policy", "--decode-policy", "--request-timeout-secs",
    "--log-level", "--api-key", "--shutdown-grace-period-secs", "--cb-failure-threshold",
    "--cb-timeout-duration-secs",
})


def _flag(argv: list[str], name: str) -> list[str]:
    """The values after each occurrence of a flag, up to the next flag."""
    out: list[str] = []
    for i, a in enumerate(argv):
        if a == name:
            j = i + 1
            vals = []
            while j < len(argv) and not argv[j].startswith("--"):
                vals.append(argv[j])
                j += 1
            out.append(" ".join(vals))
    return out


def test_whole_seconds_rounds_up_never_below_one() -> None:
    assert [whole_seconds(x) for x in (0.3, 1.0, 1.2, 8.0, 0.0)] == [1, 1, 2, 8, 1]


def test_smg_grpc_mooncake_flags() -> None:
    topo = allocate("2p1d", "mooncake", "grpc")
    a = SmgRouter("/opt/smg/bin/smg", version="1.13.0", flags=SMG_FLAGS)
    argv = a.launch(topo, SETTINGS, [e.name for e in topo.engines], "/dev/null").argv
    assert argv[:2] == ["/opt/smg/bin/smg", "launch"]
    assert _flag(argv, "--host") == ["127.0.0.1"]
    assert _flag(argv, "--port") == [str(topo.router_port)]
    assert _flag(argv, "--prometheus-host") == ["127.0.0.1"]
    prom = int(_flag(argv, "--prometheus-port")[0])
    assert prom not in (topo.router_port, 29000)
    assert "--pd-disaggregation" in argv
    assert _flag(argv, "--prefill") == [f"{p.url('grpc')} {p.bootstrap_port}" for p in topo.prefills]
    assert _flag(argv, "--decode") == [topo.decodes[0].url("grpc")]
    assert all(u.startswith("grpc://127.0.0.1:") for u in _flag(argv, "--decode"))
    # smg takes whole seconds, at least 1: 0.3 s / 0.5 s become 1 s.
    assert _flag(argv, "--health-check-interval-secs") == ["1"]
    assert _flag(argv, "--health-check-timeout-secs") == ["1"]
    assert _flag(argv, "--health-failure-threshold") == ["2"]
    assert _flag(argv, "--health-success-threshold") == ["3"]
    assert _flag(argv, "--prefill-policy") == ["round_robin"]
    assert _flag(argv, "--decode-policy") == ["power_of_two"]
    assert _flag(argv, "--request-timeout-secs") == ["8"]
    assert _flag(argv, "--shutdown-grace-period-secs") == ["1"]
    assert "--api-key" not in argv
    assert a.name == "smg-1.13.0"


def test_smg_nixl_http_unregistered_and_api_key() -> None:
    # Over HTTP the worker flags are the `smg-flags` variant's (the default registers through the API).
    topo = allocate("1p2d", "nixl", "http")
    a = SmgFlagsRouter("smg", api_key="k-123", flags=SMG_FLAGS)
    argv = a.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null").argv
    assert _flag(argv, "--prefill") == [f"{topo.prefills[0].url('http')} none"]
    assert _flag(argv, "--decode") == [topo.decodes[0].url("http")]
    assert _flag(argv, "--api-key") == ["k-123"]
    assert a.name == "smg-flags"


def test_flags_a_release_lacks_are_dropped_and_noted() -> None:
    topo = allocate("1p1d", "mooncake", "grpc")
    lacks = {"--shutdown-grace-period-secs", "--decode-policy"}
    old = SmgRouter("smg", version="1.0.0", flags=SMG_FLAGS - lacks)
    argv = old.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null").argv
    assert "--shutdown-grace-period-secs" not in argv and "--decode-policy" not in argv
    assert "power_of_two" not in argv
    assert sorted(old.dropped) == ["--decode-policy", "--shutdown-grace-period-secs"]


def test_a_release_without_prometheus_host_is_refused() -> None:
    topo = allocate("1p1d", "mooncake", "grpc")
    a = SmgRouter("smg", version="0.1.0", flags=SMG_FLAGS - {"--prometheus-host"})
    with pytest.raises(RouterAdapterError, match=r"would bind 0\.0\.0\.0"):
        a.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null")


def test_vllm_router_flags() -> None:
    topo = allocate("1p1d", "mooncake", "http")
    flags = frozenset({*SMG_FLAGS, "--vllm-pd-disaggregation", "--kv-connector"})
    a = VllmRouter("/x/vllm-router", version="0.1.17", flags=flags)
    argv = a.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null").argv
    assert argv[0] == "/x/vllm-router" and "launch" not in argv
    assert "--vllm-pd-disaggregation" in argv and "--pd-disaggregation" not in argv
    assert _flag(argv, "--kv-connector") == ["mooncake"]
    assert _flag(argv, "--prefill") == [f"{topo.prefills[0].http_url} {topo.prefills[0].bootstrap_port}"]
    assert _flag(argv, "--prometheus-host") == ["127.0.0.1"]
    with pytest.raises(RouterAdapterError, match="cannot run grpc"):
        a.launch(allocate("1p1d", "mooncake", "grpc"), SETTINGS, ["prefill-0", "decode-0"], "/dev/null")


def _scenario(**kw: Any) -> Scenario:
    base = Scenario(name="s", description="d", topologies=("1p1d",), connectors=("mooncake",),
                    transports=("http", "grpc"), router=SETTINGS)
    return replace(base, **kw)


def test_skip_reasons() -> None:
    smg = SmgRouter("smg", flags=SMG_FLAGS)
    # A release with --kv-connector (one without it cannot run Mooncake: test_smg_kv_facts.py).
    vr = VllmRouter("vllm-router", flags=SMG_FLAGS | {"--kv-connector"})
    s = _scenario()
    assert smg.cannot_run(s, "1p1d", "mooncake", "grpc") is None
    assert smg.cannot_run(s, "1p1d", "mooncake", "http") is None
    assert vr.cannot_run(s, "1p1d", "mooncake", "http") is None
    why = vr.cannot_run(s, "1p1d", "mooncake", "grpc")
    assert why is not None and "Hugging Face" in why
    bug = _scenario(router=replace(SETTINGS, inject_bugs=("stale_engine_id",)))
    assert "stale_engine_id" in (smg.cannot_run(bug, "1p1d", "mooncake", "grpc") or "")
    ll = _scenario(router=replace(SETTINGS, decode_policy="least_load"))
    assert smg.cannot_run(ll, "1p1d", "mooncake", "grpc") is None
    assert vr.cannot_run(ll, "1p1d", "mooncake", "http") == "vllm-router has no decode policy 'least_load'"
    patch = _scenario(timeline=(Step("p", PatchWorker("prefill-0", {"priority": 3}), At(1.0)),))
    assert smg.cannot_run(patch, "1p1d", "mooncake", "grpc") is None
    assert "no worker API" in (vr.cannot_run(patch, "1p1d", "mooncake", "http") or "")
    late = _scenario(unregistered_engines=("decode-0",))
    assert "no worker API" in (vr.cannot_run(late, "1p1d", "mooncake", "http") or "")


def test_adjustments_list_what_is_approximate() -> None:
    smg = SmgRouter("smg", flags=SMG_FLAGS)
    adj = smg.adjustments(SETTINGS)
    assert "health interval 0.3 s -> 1 s (whole seconds, at least 1)" in adj
    assert any(a.startswith("health timeout 0.5 s -> 1 s") for a in adj)
    assert any("identity check" in a for a in adj)
    assert not any("request timeout" in a for a in adj)  # 8 s is exact
    exact = RouterSettings(health_interval_s=2.0, health_timeout_s=1.0, identity_check_interval_s=None,
                           request_timeout_s=5.0)
    assert smg.adjustments(exact) == []


def test_help_flags_from_a_binary(tmp_path: Path) -> None:
    exe = tmp_path / "gw"
    exe.write_text("#!/bin/sh\necho 'usage: gw [--host HOST] [--prometheus-host H]'\necho '  --port PORT'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert help_flags((str(exe), "--help")) == frozenset({"--host", "--prometheus-host", "--port"})
    assert help_flags((str(tmp_path / "missing"), "--help")) is None


@pytest.mark.parametrize(
    ("w", "status"),
    [
        ({"status": "ready"}, "ready"),
        ({"status": "NotReady"}, "not_ready"),
        ({"status": "not_ready", "is_healthy": True}, "not_ready"),
        ({"status": "Failed"}, "failed"),
        ({"status": "draining"}, "draining"),
        ({"is_healthy": True}, "ready"),
        ({"is_healthy": False}, "not_ready"),
        ({}, "unknown"),
    ],
)
def test_normalize_status(w: dict[str, Any], status: str) -> None:
    assert normalize_status(w) == status


class FakeGateway:
    """Answers `/liveness` and `/workers` the way smg 1.13.0 and vllm-router 0.1.17 were seen to."""

    def __init__(self, topo: Topology, kind: str) -> None:
        self.topo = topo
        self.kind = kind
        self.live_after = 2
        self.hits = 0
        self.auth: list[str | None] = []

    async def liveness(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(text="OK", status=200 if self.hits > self.live_after else 503)

    async def workers(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        p, d = self.topo.prefills[0], self.topo.decodes[0]
        if self.kind == "smg":
            ws = [
                {"id": "019a-p", "url": p.url(self.topo.transport), "worker_type": "prefill",
                 "status": "ready", "is_healthy": True, "kv_engine_id": "eng-p",
                 "bootstrap_port": p.bootstrap_port},
                {"id": "019a-d", "url": d.url(self.topo.transport), "worker_type": "decode",
                 "status": "not_ready", "is_healthy": False, "kv_engine_id": "eng-d"},
            ]
        else:
            ws = [
                {"url": p.http_url, "model_id": "unknown", "worker_type": "prefill", "is_healthy": True,
                 "connection_mode": "Http", "bootstrap_port": p.bootstrap_port},
                {"url": d.http_url, "model_id": "unknown", "worker_type": "decode", "is_healthy": False,
                 "connection_mode": "Http"},
            ]
        return web.json_response({"workers": ws, "total": 2, "stats": {}})


@pytest.fixture
async def served() -> AsyncIterator[tuple[Topology, dict[str, FakeGateway]]]:
    topo = allocate("1p1d", "mooncake", "grpc")
    gws = {"gw": FakeGateway(topo, "smg")}
    app = web.Application()

    async def liveness(r: web.Request) -> web.Response:
        return await gws["gw"].liveness(r)

    async def workers(r: web.Request) -> web.Response:
        return await gws["gw"].workers(r)

    app.router.add_get("/liveness", liveness)
    app.router.add_get("/workers", workers)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", topo.router_port)
    try:
        await site.start()
        yield topo, gws
    finally:
        await runner.cleanup()


async def test_smg_workers_and_liveness(served: tuple[Topology, dict[str, FakeGateway]]) -> None:
    topo, gws = served
    a = SmgRouter("smg", api_key="sekrit", flags=SMG_FLAGS)
    async with aiohttp.ClientSession() as session:
        await a.wait_ready(session, topo, 5.0)
        assert gws["gw"].hits == 3  # two 503s, then 200
        ws = await a.workers(session, topo)
        assert ws is not None
        by_role = {w["role"]: w for w in ws}
        assert by_role["prefill"]["status"] == "ready" and by_role["prefill"]["kv_engine_id"] == "eng-p"
        assert by_role["decode"]["status"] == "not_ready"
        assert topo.name_of_url(by_role["prefill"]["url"]) == "prefill-0"
        assert await a.worker_id(session, topo, "decode-0") == "019a-d"
    assert gws["gw"].auth[0] == "Bearer sekrit"


async def test_vllm_router_workers_have_url_ids(served: tuple[Topology, dict[str, FakeGateway]]) -> None:
    topo, gws = served
    gws["gw"] = FakeGateway(topo, "vllm-router")
    a = VllmRouter("vllm-router", flags=SMG_FLAGS)
    async with aiohttp.ClientSession() as session:
        ws = await a.workers(session, topo)
    assert ws is not None
    assert [(w["id"], w["role"], w["status"], w["kv_engine_id"]) for w in ws] == [
        (topo.prefills[0].http_url, "prefill", "ready", None),
        (topo.decodes[0].http_url, "decode", "not_ready", None),
    ]


async def test_liveness_timeout_says_what_it_saw(served: tuple[Topology, dict[str, FakeGateway]]) -> None:
    topo, gws = served
    gws["gw"].live_after = 10_000
    a = SmgRouter("smg", flags=SMG_FLAGS)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError, match="HTTP 503"):
            await a.wait_ready(session, topo, 0.5)


def test_adjustments_name_flags_the_release_lacks() -> None:
    lacks = {"--decode-policy", "--shutdown-grace-period-secs"}
    old = SmgRouter("smg", version="1.0.0", flags=SMG_FLAGS - lacks)
    adj = old.adjustments(SETTINGS)
    assert "--decode-policy: not in this release, left out" in adj
    assert "--shutdown-grace-period-secs: not in this release, left out" in adj
    assert not any("--prefill-policy" in a for a in adj)
    vr = VllmRouter("vllm-router", flags=SMG_FLAGS)
    assert "--kv-connector: not in this release, left out" in vr.adjustments(SETTINGS)


def test_extra_args_go_last_verbatim() -> None:
    topo = allocate("1p1d", "mooncake", "grpc")
    extra = ["--disable-circuit-breaker", "--cb-failure-threshold", "3"]
    a = SmgRouter("smg", flags=SMG_FLAGS, extra_args=extra)
    argv = a.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null").argv
    assert argv[-3:] == ["--disable-circuit-breaker", "--cb-failure-threshold", "3"]


def test_each_router_names_the_flag_value_that_selects_it_again() -> None:
    """What a replay command passes as --router: the spec the CLI parses back to the same gateway and release
    (the adapter's display name `smg-1.13.0` is no spec: `--router smg-1.13.0` is refused)."""
    from harness.routers import CommandRouter, ProfileRouter, ReferenceRouter
    from harness.routers.gateways.adapters import SmgOperatorRouter
    from harness.routers.gateways.spec import parse_router_spec
    from harness.routers.profiles import profile_named

    for adapter, spec in (
        (SmgRouter("smg", version="1.13.0"), "smg==1.13.0"),
        (SmgFlagsRouter("smg", version="1.12.0"), "smg-flags==1.12.0"),
        (SmgOperatorRouter("smg", version="1.13.0"), "smg-operator==1.13.0"),
        (VllmRouter("vllm-router", version="0.1.17"), "vllm-router==0.1.17"),
        (SmgRouter("smg"), "smg"),
    ):
        assert adapter.cli_spec() == spec
        parsed = parse_router_spec(spec)
        assert parsed.gateway is not None and parsed.version == adapter.version
        assert (parsed.gateway.name or parsed.gateway.package) == spec.split("==")[0]
    # Arguments passed verbatim (bisect --gateway-arg): no --router value says them, so no replay command.
    tuned = SmgRouter("smg", version="1.13.0", extra_args=["--disable-circuit-breaker"])
    assert tuned.cli_spec() is None
    from harness.runner import replay_command
    from harness.scenario import load_scenarios

    (s,) = load_scenarios(["sole_prefill_down"])
    assert replay_command(s, "1p1d", "mooncake", "grpc", tuned.cli_spec(), 0, "real", "scaled") == ""
    assert CommandRouter("my-router --port {port}").cli_spec() == "cmd:my-router --port {port}"
    assert ReferenceRouter().cli_spec() == "reference"
    assert ProfileRouter(profile_named("smg-1.12.0")).cli_spec() == "profile:smg-1.12.0"


def test_the_contract_a_gateway_is_held_to_is_what_it_took() -> None:
    topo = allocate("1p1d", "mooncake", "grpc")
    a = SmgRouter("smg", version="1.13.0", flags=SMG_FLAGS)
    a.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null")
    c = a.contract(SETTINGS)
    # Whole seconds as passed; its own breaker (none asked); no identity checks.
    assert (c["health_interval_s"], c["health_timeout_s"], c["request_timeout_s"]) == (1.0, 1.0, 8.0)
    assert (c["failure_threshold"], c["success_threshold"]) == (2, 3)
    assert (c["circuit_breaker_failures"], c["circuit_breaker_open_s"]) == (10, 60.0)
    assert c["identity_check_interval_s"] is None
    asked = replace(SETTINGS, circuit_breaker_failures=4, circuit_breaker_open_s=2.5)
    a.launch(topo, asked, ["prefill-0", "decode-0"], "/dev/null")
    took = a.contract(asked)
    assert (took["circuit_breaker_failures"], took["circuit_breaker_open_s"]) == (4, 3.0)
    # A flag this release lacks: the gateway's own default is what it runs with.
    old = SmgRouter("smg", version="1.0.0", flags=SMG_FLAGS - {"--health-failure-threshold"})
    old.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null")
    assert old.contract(SETTINGS)["failure_threshold"] == 3
    off = SmgRouter("smg", version="1.13.0", flags=SMG_FLAGS, extra_args=["--disable-circuit-breaker"])
    off.launch(topo, SETTINGS, ["prefill-0", "decode-0"], "/dev/null")
    assert off.contract(SETTINGS)["circuit_breaker_failures"] is None
