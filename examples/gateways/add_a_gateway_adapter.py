"""A gateway adapter, as docs/howto/add-a-gateway-adapter.md builds it.

The "gateway" here is `pdchaos-router`, the project's own router, standing in for yours so that the file runs
anywhere: swap the executable, the flags and the readiness path for your gateway's.

    python examples/gateways/add_a_gateway_adapter.py        # one cell through the adapter, real time
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import aiohttp

from harness.routers.base import RouterLaunch
from harness.routers.gateways.adapters import GatewayAdapter
from harness.scenario import RouterSettings
from harness.scenario.settings import whole_seconds
from harness.topology import Topology


class MyGatewayRouter(GatewayAdapter):
    """my-gateway: PD over HTTP, workers from its flags, settings in whole seconds."""

    package = "my-gateway"  # the name in reports: my-gateway-<version>
    policies = frozenset({"round_robin", "random"})  # the scenario policies it has
    transports = ("http",)  # a gRPC cell is skipped with transport_reason()

    def help_argv(self) -> tuple[str, ...]:
        return (self.executable, "--help")  # flags the help does not name are left out

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        del events_file  # no event log: the checkers judge from the engines' records
        self.dropped = []
        s = settings
        argv = [self.executable, "--host", "127.0.0.1", "--port", str(topo.router_port),
                "--pd-disaggregation", "--connector", topo.connector]
        for p in topo.prefills:
            if p.name in registered:
                argv += ["--prefill", p.url(topo.transport)]
                if topo.connector == "mooncake":
                    argv.append(str(p.bootstrap_port))
        for d in topo.decodes:
            if d.name in registered:
                argv += ["--decode", d.url(topo.transport)]
        pairs = [
            ("--health-check-interval-secs", [str(whole_seconds(s.health_interval_s))]),
            ("--health-check-timeout-secs", [str(whole_seconds(s.health_timeout_s))]),
            ("--health-failure-threshold", [str(s.failure_threshold)]),
            ("--health-success-threshold", [str(s.success_threshold)]),
            ("--request-timeout-secs", [str(whole_seconds(s.request_timeout_s))]),
            ("--prefill-policy", [s.prefill_policy]),
            ("--decode-policy", [s.decode_policy]),
        ]
        if s.circuit_breaker_failures is not None:
            pairs += [("--cb-failure-threshold", [str(s.circuit_breaker_failures)]),
                      ("--cb-timeout-duration-secs", [str(whole_seconds(s.circuit_breaker_open_s))])]
        argv += self._filter(pairs)  # a flag this release lacks goes to self.dropped
        return RouterLaunch(argv=argv + self.extra_args)

    async def wait_ready(self, session: aiohttp.ClientSession, topo: Topology, timeout_s: float) -> None:
        await self._poll_until_answer(session, topo, "/health", timeout_s)  # any answer: it serves

    def contract(self, settings: RouterSettings) -> dict[str, Any]:
        out = super().contract(settings)  # whole seconds; smg's defaults for the flags left out
        if settings.circuit_breaker_failures is None:
            out["circuit_breaker_failures"] = None  # its own default: no breaker (smg's: 10 / 60 s)
        return out

    def rules(self) -> dict[str, Any]:
        return {}  # what it documents differently from the reference contract (none here)


if __name__ == "__main__":
    import asyncio

    from harness.runner import run_scenario
    from harness.suite import load_named

    [scenario] = load_named(["prefill_restart_mooncake"])
    adapter = MyGatewayRouter(str(Path(sys.executable).parent / "pdchaos-router"), version="0.1.0")
    out = Path("runs") / "my-gateway"
    result = asyncio.run(run_scenario(scenario, "1p1d", "mooncake", "http", adapter, out))
    print(f"{result.status.upper()}  {result.overall.reason}  ({out})")
    sys.exit(0 if result.status == "pass" else 1)
