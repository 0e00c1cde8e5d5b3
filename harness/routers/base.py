"""The router-under-test interface: how the real world starts a router, knows it is up, and reads its workers
and events. `reference` (the project's router), `command` (any command line) and `gateways` (smg,
vllm-router releases) implement it."""

from __future__ import annotations

from collections.abc import Callable, Container, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.router_metrics import counters_of_text
from harness.scenario import RouterSettings, mistaken_body
from harness.topology import Topology, parse_topology, registration_body
from pdchaos.waiting import poll_until

READY_PREFIX = "PDCHAOS_ROUTER_READY"

# The key the harness gives a router it starts (`{api_key}` in a cmd: template) and sends on its worker API.
RUN_API_KEY = "pdchaos-test-key"


class RouterAdapterError(ValueError):
    pass


@dataclass
class RouterLaunch:
    """What the runner needs to start a router: argv, env, and how readiness shows."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_prefix: str | None = None


def fmt_seconds(x: float) -> str:
    return f"{x:g}"


class RouterAdapter:
    """Base adapter: worker API and events over HTTP on the router's port. Subclasses build the launch."""

    name = "router"
    has_events = False
    supports_inject_bug = False
    # Whether it can run a topology of regular engines (`Nr`: the router in regular mode, no handoff).
    regular_mode = False

    def mode_problem(self, topology: str) -> str | None:
        """Why this router cannot run a topology's mode (None: it can): regular mode (`Nr`) needs an adapter
        that launches the router in it."""
        if self.regular_mode or parse_topology(topology).pd:
            return None
        return (f"its adapter runs PD topologies (NpMd) only; regular mode ({topology}) runs on the "
                "reference router")

    def cli_spec(self) -> str | None:
        """The `--router` value that selects this router again (a replay command names it); None when no
        `--router` value can (a configuration `pdchaos run` has no flag for)."""
        return self.name

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        # Why the last `workers()` read gave nothing ("" when it gave a list): the run says it.
        self.workers_problem = ""

    # -- launching

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        raise NotImplementedError

    def contract(self, settings: RouterSettings) -> dict[str, Any] | None:
        """What this router took of `settings` as the contract checkers judge it, after `launch` (None: the
        settings as told): its probe and timeout numbers, its breaker, its identity checks, and under `rules`
        what it documents differently from the reference router (`harness.contract.settings`)."""
        del settings
        return None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def companion(
        self, session: aiohttp.ClientSession, topo: Topology, emit: Callable[[Any], None]
    ) -> Coroutine[Any, Any, None] | None:
        """What runs beside the router for as long as it serves (an operator that registers workers again),
        or None. The world starts it once the router serves and cancels it before the router stops; it
        reports what it did through `emit` (history events)."""
        del session, topo, emit
        return None

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
        last = "no answer"

        async def answered() -> bool:
            nonlocal last
            try:
                async with session.get(
                    f"{topo.router_url}{path}", timeout=aiohttp.ClientTimeout(total=1.0)
                ) as resp:
                    await resp.read()
                    if statuses is None or resp.status in statuses:
                        return True
                    last = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as e:
                last = f"{type(e).__name__}: {e}"
            return False

        if not await poll_until(answered, timeout_s, interval_s=0.1):
            raise TimeoutError(f"router {self.name} did not answer {path} within {timeout_s:g} s ({last})")

    # -- reading

    async def _fetch_json(
        self,
        session: aiohttp.ClientSession,
        url: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[Any, str]:
        """(the JSON body of a 200 answer to `GET url`, ""), or (None, what came instead)."""
        try:
            async with session.get(
                url, params=params, headers=headers, timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                if resp.status != 200:
                    return None, f"answered {resp.status}"
                return await resp.json(content_type=None), ""
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return None, f"{type(e).__name__}: {e}".rstrip(": ")

    async def workers(self, session: aiohttp.ClientSession, topo: Topology) -> list[dict[str, Any]] | None:
        """The router's workers (CONTRACTS §2 W objects), or None when it has no such API (why: in
        `workers_problem`)."""
        body, problem = await self._fetch_json(session, f"{topo.router_url}/workers", headers=self._headers())
        items = body.get("workers") if isinstance(body, dict) else body
        if isinstance(items, list):
            self.workers_problem = ""
            return [w for w in items if isinstance(w, dict)]
        self.workers_problem = problem or "not a worker list"
        if (problem == "answered 401" or problem == "answered 403") and self.api_key is None:
            self.workers_problem += " (an API key: a cmd: template passes the run's with {api_key})"
        return None

    async def events(
        self, session: aiohttp.ClientSession, topo: Topology, since: int
    ) -> tuple[list[dict[str, Any]], int] | None:
        if not self.has_events:
            return None
        url = f"{topo.router_url}/events"
        body, problem = await self._fetch_json(session, url, params={"since": str(since)})
        if body is None and not problem.startswith("answered"):
            # Not read this time (a timeout, a refused connect: a router stopped or busy), which says
            # nothing of its events: nothing new, and the same cursor at the next poll.
            return [], since
        evs = body.get("events") if isinstance(body, dict) else None
        nxt = body.get("next") if isinstance(body, dict) else None
        if not isinstance(evs, list) or not isinstance(nxt, int):
            return None
        return [e for e in evs if isinstance(e, dict)], nxt

    async def counters(
        self, session: aiohttp.ClientSession, topo: Topology
    ) -> list[tuple[str, dict[str, str], float]] | None:
        """The counters of the router's Prometheus `GET /metrics` (None: no such text to read)."""
        try:
            async with session.get(f"{topo.router_url}/metrics", headers=self._headers(),
                                   timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None
        try:
            return counters_of_text(text)
        except ValueError:
            return None

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
        self, session: aiohttp.ClientSession, topo: Topology, engine: str,
        mistake: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        """POST /workers for `engine`; `mistake`: fields laid over the body (a call to be refused)."""
        body = registration_body(topo.engine(engine), topo.connector, topo.transport)
        return await self._call(session, "POST", f"{topo.router_url}/workers", mistaken_body(body, mistake))

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
