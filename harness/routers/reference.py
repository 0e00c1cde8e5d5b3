"""The project's own router (`pdchaos-router`) as the router under test."""

from __future__ import annotations

import sys
from dataclasses import replace

import aiohttp

from harness.routers.base import READY_PREFIX, RUN_API_KEY, RouterAdapter, RouterLaunch
from harness.scenario import RouterSettings
from harness.topology import Topology
from reference_router.config import RouterConfig, WorkerArg
from reference_router.core.bugs import validate_bugs


def reference_config(settings: RouterSettings, extra_bugs: tuple[str, ...] = ()) -> RouterConfig:
    """What the reference router is told for a scenario's router settings (no workers: the caller adds
    what it registers), in either world: the real one passes it as flags, the simulated one runs it."""
    defaults = RouterConfig()
    identity = settings.identity_check_interval_s
    return RouterConfig(
        pd=True,
        prefill_policy=settings.prefill_policy,
        decode_policy=settings.decode_policy,
        request_timeout_s=settings.request_timeout_s,
        interval_s=settings.health_interval_s,
        probe_timeout_s=settings.health_timeout_s,
        failure_threshold=settings.failure_threshold,
        success_threshold=settings.success_threshold,
        max_probes_in_flight=settings.max_concurrent_health_checks or defaults.max_probes_in_flight,
        identity_check_interval_s=defaults.identity_check_interval_s if identity is None else identity,
        cb_failure_threshold=settings.circuit_breaker_failures,
        cb_open_s=settings.circuit_breaker_open_s,
        bugs=validate_bugs((*settings.inject_bugs, *extra_bugs)),
    )


def _router_executable() -> list[str]:
    # The harness's own interpreter, not whatever `pdchaos-router` PATH finds: the child must run this
    # checkout's code in this environment (a venv need not be activated).
    return [sys.executable, "-m", "reference_router"]


class ReferenceRouter(RouterAdapter):
    """The project's own router (`pdchaos-router`)."""

    name = "reference"
    has_events = True
    supports_inject_bug = True
    regular_mode = True

    def __init__(self, api_key: str | None = RUN_API_KEY, extra_bugs: tuple[str, ...] = ()) -> None:
        super().__init__(api_key)
        self.extra_bugs = extra_bugs

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        cfg = replace(
            reference_config(settings, extra_bugs=self.extra_bugs),
            port=topo.router_port,
            api_key=self.api_key,
            events_file=events_file,
            connector=settings.told_connector(topo.connector, topo.transport),
            prefill=tuple(
                WorkerArg(p.url(topo.transport), p.bootstrap_port if topo.connector == "mooncake" else None)
                for p in topo.prefills
                if p.name in registered
            ),
            decode=tuple(d.url(topo.transport) for d in topo.decodes if d.name in registered),
            pd=topo.shape.pd,
            regular=tuple(r.url(topo.transport) for r in topo.regulars if r.name in registered),
        )
        return RouterLaunch(argv=[*_router_executable(), *cfg.argv(), *settings.extra_args],
                            ready_prefix=READY_PREFIX)

    async def wait_ready(self, session: aiohttp.ClientSession, topo: Topology, timeout_s: float) -> None:
        # The ready line already said so (the supervisor waited for it); one /health answer confirms the port.
        await super().wait_ready(session, topo, timeout_s)
