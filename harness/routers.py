"""Router adapters: how to start a router under test, know it is up, and read its workers and events.

`reference` drives `pdchaos-router` (CONTRACTS §2). `cmd:<template>` runs any command; the template is split
like a shell line, then each word is formatted with the placeholders in `PLACEHOLDERS`. A word that is exactly
`{prefill_args}`, `{decode_args}`, `{prefills}` or `{decodes}` expands to several words. Such routers are read
through the same worker API (`GET /workers`) when they have one; otherwise the harness judges from the
engines' side and the status-based checks come out `unknown`.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.scenario import RouterSettings
from harness.topology import Topology

READY_PREFIX = "PDCHAOS_ROUTER_READY"

PLACEHOLDERS = (
    "port", "host", "url", "prefills", "decodes", "prefill_args", "decode_args", "connector", "transport",
    "health_interval", "health_timeout", "failure_threshold", "success_threshold", "request_timeout",
    "events_file", "api_key", "prefill_policy", "decode_policy",
)
_LIST_PLACEHOLDERS = ("{prefills}", "{decodes}", "{prefill_args}", "{decode_args}")


class RouterAdapterError(ValueError):
    pass


@dataclass
class RouterLaunch:
    """What the runner needs to start a router: argv, env, and how readiness shows."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_prefix: str | None = None


def _fmt(x: float) -> str:
    return f"{x:g}"


class RouterAdapter:
    """Base adapter: worker API and events over HTTP on the router's port. Subclasses build the launch."""

    name = "router"
    has_events = False
    supports_inject_bug = False

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key

    # -- launching

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def wait_ready(self, session: aiohttp.ClientSession, topo: Topology, timeout_s: float) -> None:
        """Poll `/health` until any HTTP answer (a router with no Ready workers may say 503)."""
        await self._poll_until_answer(session, topo, "/health", timeout_s)

    async def _poll_until_answer(
        self,
        session: aiohttp.ClientSession,
        topo: Topology,
        path: str,
        timeout_s: float,
        statuses: Container[int] | None = None,
    ) -> None:
        """Poll `GET path` every 0.1 s until an answer whose status is in `statuses` (None: any status)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = "no answer"
        while loop.time() < deadline:
            try:
                async with session.get(
                    f"{topo.router_url}{path}", timeout=aiohttp.ClientTimeout(total=1.0)
                ) as resp:
                    await resp.read()
                    if statuses is None or resp.status in statuses:
                        return
                    last = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as e:
                last = f"{type(e).__name__}: {e}"
            await asyncio.sleep(0.1)
        raise TimeoutError(f"router {self.name} did not answer {path} within {timeout_s:g} s ({last})")

    # -- reading

    async def _get_json(
        self,
        session: aiohttp.ClientSession,
        url: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The JSON body of a 200 answer to `GET url`; None for any other status, bad JSON or no answer."""
        try:
            async with session.get(
                url, params=params, headers=headers, timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                if resp.status != 200:
                    return None
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def workers(self, session: aiohttp.ClientSession, topo: Topology) -> list[dict[str, Any]] | None:
        """The router's workers (CONTRACTS §2 W objects), or None when it has no such API."""
        body = await self._get_json(session, f"{topo.router_url}/workers", headers=self._headers())
        items = body.get("workers") if isinstance(body, dict) else body
        return [w for w in items if isinstance(w, dict)] if isinstance(items, list) else None

    async def events(
        self, session: aiohttp.ClientSession, topo: Topology, since: int
    ) -> tuple[list[dict[str, Any]], int] | None:
        if not self.has_events:
            return None
        body = await self._get_json(session, f"{topo.router_url}/events", params={"since": str(since)})
        evs = body.get("events") if isinstance(body, dict) else None
        nxt = body.get("next") if isinstance(body, dict) else None
        if not isinstance(evs, list) or not isinstance(nxt, int):
            return None
        return [e for e in evs if isinstance(e, dict)], nxt

    # -- worker API

    async def _call(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        body: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        async with session.request(
            method, url, json=None if body is None else dict(body), headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=3.0),
        ) as resp:
            try:
                data = await resp.json(content_type=None)
            except ValueError:
                data = await resp.text()
            return resp.status, data

    async def worker_id(self, session: aiohttp.ClientSession, topo: Topology, engine: str) -> str | None:
        for w in await self.workers(session, topo) or []:
            if topo.name_of_url(str(w.get("url", ""))) == engine:
                return str(w.get("id"))
        return None

    async def add_worker(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str
    ) -> tuple[int, Any]:
        spec = topo.engine(engine)
        body: dict[str, Any] = {"url": spec.url(topo.transport), "role": spec.role}
        body["connector"] = topo.connector
        if spec.role == "prefill" and topo.connector == "mooncake":
            body["bootstrap_port"] = spec.bootstrap_port
        return await self._call(session, "POST", f"{topo.router_url}/workers", body)

    async def remove_worker(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str
    ) -> tuple[int, Any]:
        wid = await self.worker_id(session, topo, engine)
        if wid is None:
            return 404, {"error": f"no worker for {engine}"}
        return await self._call(session, "DELETE", f"{topo.router_url}/workers/{wid}")

    async def patch_worker(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str, body: Mapping[str, Any]
    ) -> tuple[int, Any]:
        wid = await self.worker_id(session, topo, engine)
        if wid is None:
            return 404, {"error": f"no worker for {engine}"}
        return await self._call(session, "PATCH", f"{topo.router_url}/workers/{wid}", body)


def _router_executable() -> list[str]:
    # The harness's own interpreter, not whatever `pdchaos-router` PATH finds: the child must run this
    # checkout's code in this environment (a venv need not be activated).
    return [sys.executable, "-m", "reference_router"]


class ReferenceRouter(RouterAdapter):
    """The project's own router (`pdchaos-router`)."""

    name = "reference"
    has_events = True
    supports_inject_bug = True

    def __init__(self, api_key: str | None = "pdchaos-test-key", extra_bugs: tuple[str, ...] = ()) -> None:
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
            "--health-check-interval-secs", _fmt(settings.health_interval_s),
            "--health-check-timeout-secs", _fmt(settings.health_timeout_s),
            "--health-failure-threshold", str(settings.failure_threshold),
            "--health-success-threshold", str(settings.success_threshold),
            "--prefill-policy", settings.prefill_policy,
            "--decode-policy", settings.decode_policy,
            "--request-timeout-secs", _fmt(settings.request_timeout_s),
            "--events-file", events_file,
        ]
        if settings.max_concurrent_health_checks is not None:
            argv += ["--max-concurrent-health-checks", str(settings.max_concurrent_health_checks)]
        if settings.identity_check_interval_s is not None:
            argv += ["--identity-check-interval-secs", _fmt(settings.identity_check_interval_s)]
        if self.api_key:
            argv += ["--api-key", self.api_key]
        bugs = [b for b in (settings.inject_bug, *self.extra_bugs) if b]
        for bug in dict.fromkeys(bugs):
            argv += ["--inject-bug", bug]
        argv += list(settings.extra_args)
        return RouterLaunch(argv=argv, ready_prefix=READY_PREFIX)

    async def wait_ready(self, session: aiohttp.ClientSession, topo: Topology, timeout_s: float) -> None:
        # The ready line already said so (the supervisor waited for it); one /health answer confirms the port.
        await super().wait_ready(session, topo, timeout_s)


class CommandRouter(RouterAdapter):
    """Any router, from a command template (`cmd:smg --port {port} {prefill_args} ...`)."""

    name = "cmd"
    has_events = False

    def __init__(self, template: str, api_key: str | None = None, name: str = "cmd") -> None:
        super().__init__(api_key)
        if not template.strip():
            raise RouterAdapterError("empty router command template")
        words = shlex.split(template)
        for w in words:
            try:
                w.format(**{k: "" for k in PLACEHOLDERS})
            except (KeyError, IndexError, ValueError) as e:
                raise RouterAdapterError(
                    f"router template word {w!r}: unknown placeholder {e} (known: {', '.join(PLACEHOLDERS)})"
                ) from None
        self.template = template
        self.words = words
        self.name = name

    def values(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> tuple[dict[str, str], dict[str, list[str]]]:
        prefills = [p for p in topo.prefills if p.name in registered]
        decodes = [d for d in topo.decodes if d.name in registered]
        prefill_args: list[str] = []
        for p in prefills:
            prefill_args += ["--prefill", p.url(topo.transport)]
            if topo.connector == "mooncake":
                prefill_args.append(str(p.bootstrap_port))
        decode_args: list[str] = []
        for d in decodes:
            decode_args += ["--decode", d.url(topo.transport)]
        scalars = {
            "port": str(topo.router_port),
            "host": "127.0.0.1",
            "url": topo.router_url,
            "connector": topo.connector,
            "transport": topo.transport,
            "health_interval": _fmt(settings.health_interval_s),
            "health_timeout": _fmt(settings.health_timeout_s),
            "failure_threshold": str(settings.failure_threshold),
            "success_threshold": str(settings.success_threshold),
            "request_timeout": _fmt(settings.request_timeout_s),
            "events_file": events_file,
            "api_key": self.api_key or "",
            "prefill_policy": settings.prefill_policy,
            "decode_policy": settings.decode_policy,
            "prefills": " ".join(p.url(topo.transport) for p in prefills),
            "decodes": " ".join(d.url(topo.transport) for d in decodes),
            "prefill_args": " ".join(prefill_args),
            "decode_args": " ".join(decode_args),
        }
        lists = {
            "{prefills}": [p.url(topo.transport) for p in prefills],
            "{decodes}": [d.url(topo.transport) for d in decodes],
            "{prefill_args}": prefill_args,
            "{decode_args}": decode_args,
        }
        return scalars, lists

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        scalars, lists = self.values(topo, settings, registered, events_file)
        argv: list[str] = []
        for w in self.words:
            if w in _LIST_PLACEHOLDERS:
                argv += lists[w]
            else:
                argv.append(w.format(**scalars))
        return RouterLaunch(argv=argv, ready_prefix=None)


def make_router_adapter(spec: str | RouterAdapter) -> RouterAdapter:
    """`reference` (default), `cmd:<template>`; an adapter passes through."""
    if isinstance(spec, RouterAdapter):
        return spec
    if spec in ("reference", "", "pdchaos-router"):
        return ReferenceRouter()
    if spec.startswith("cmd:"):
        return CommandRouter(spec[4:])
    # A gateway (smg, smg==1.12.0, vllm-router): its adapter may install that release on first use.
    from harness.gateways import gateway_name, make_gateway_adapter

    if gateway_name(spec) is not None:
        return make_gateway_adapter(spec)
    raise RouterAdapterError(
        f"unknown router {spec!r}: use 'reference', 'smg[==X.Y.Z]', 'vllm-router[==X.Y.Z]' "
        "or 'cmd:<command template>'"
    )
