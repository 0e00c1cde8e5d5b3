"""The project's own router (`pdchaos-router`) as the router under test."""

from __future__ import annotations

import sys

import aiohttp

from harness.routers.base import READY_PREFIX, RUN_API_KEY, RouterAdapter, RouterLaunch, fmt_seconds
from harness.scenario import RouterSettings
from harness.topology import Topology


def _router_executable() -> list[str]:
    # The harness's own interpreter, not whatever `pdchaos-router` PATH finds: the child must run this
    # checkout's code in this environment (a venv need not be activated).
    return [sys.executable, "-m", "reference_router"]


class ReferenceRouter(RouterAdapter):
    """The project's own router (`pdchaos-router`)."""

    name = "reference"
    has_events = True
    supports_inject_bug = True

    def __init__(self, api_key: str | None = RUN_API_KEY, extra_bugs: tuple[str, ...] = ()) -> None:
        super().__init__(api_key)
        self.extra_bugs = extra_bugs

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        argv = [*_router_executable(), "--host", "127.0.0.1", "--port", str(topo.router_port)]
        argv += ["--pd-disaggregation", "--connector", topo.connector]
        for spec in topo.prefills:
            if spec.name not in registered:
                continue
            argv += ["--prefill", spec.url(topo.transport)]
            if topo.connector == "mooncake":
                argv.append(str(spec.bootstrap_port))
        for spec in topo.decodes:
            if spec.name in registered:
                argv += ["--decode", spec.url(topo.transport)]
        argv += [
            "--health-check-interval-secs", fmt_seconds(settings.health_interval_s),
            "--health-check-timeout-secs", fmt_seconds(settings.health_timeout_s),
            "--health-failure-threshold", str(settings.failure_threshold),
            "--health-success-threshold", str(settings.success_threshold),
            "--prefill-policy", settings.prefill_policy,
            "--decode-policy", settings.decode_policy,
            "--request-timeout-secs", fmt_seconds(settings.request_timeout_s),
            "--events-file", events_file,
        ]
        if settings.max_concurrent_health_checks is not None:
            argv += ["--max-concurrent-health-checks", str(settings.max_concurrent_health_checks)]
        if settings.identity_check_interval_s is not None:
            argv += ["--identity-check-interval-secs", fmt_seconds(settings.identity_check_interval_s)]
        if settings.circuit_breaker_failures is not None:
            argv += ["--cb-failure-threshold", str(settings.circuit_breaker_failures),
                     "--cb-timeout-duration-secs", fmt_seconds(settings.circuit_breaker_open_s)]
        if self.api_key:
            argv += ["--api-key", self.api_key]
        bugs = [*settings.inject_bugs, *self.extra_bugs]
        for bug in dict.fromkeys(bugs):
            argv += ["--inject-bug", bug]
        argv += list(settings.extra_args)
        return RouterLaunch(argv=argv, ready_prefix=READY_PREFIX)

    async def wait_ready(self, session: aiohttp.ClientSession, topo: Topology, timeout_s: float) -> None:
        # The ready line already said so (the supervisor waited for it); one /health answer confirms the port.
        await super().wait_ready(session, topo, timeout_s)
