"""Adapters for real PD gateways: smg (`smg launch`) and vllm-router.

Each maps the scenario's `RouterSettings` and the topology onto the gateway's own flags (docs/GATEWAYS.md),
knows its liveness check, reads its `/workers` into the CONTRACTS §2 shape the observers expect (`role`,
`status`, `kv_engine_id`), and says which scenario cells it cannot run and why (`cannot_run`: reported as
skipped, never as passed). Settings a gateway cannot express exactly are rounded to what it takes and
listed by `adjustments` (e.g. smg's health interval is whole seconds, at least 1).
"""

from __future__ import annotations

import asyncio
import functools
import re
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from harness.routers.base import RouterAdapter, RouterAdapterError, RouterLaunch
from harness.routers.gateways.engine_id_operator import EngineIdOperator, Reregistration
from harness.routers.gateways.kv_facts import (
    KvFacts,
    engine_facts,
    engine_id_from_query,
    facts_style,
    read_query,
    registration_body,
)
from harness.scenario import AddWorker, PatchWorker, RemoveWorker, RouterSettings, Scenario, mistaken_body
from harness.scenario.settings import whole_seconds
from harness.session.events import WorldNote
from harness.topology import TRANSPORTS, Topology
from pdchaos.ports import free_port

SMG_POLICIES = frozenset({
    "random", "round_robin", "cache_aware", "power_of_two", "least_load", "manual", "consistent_hashing",
    "prefix_hash",
})
VLLM_ROUTER_POLICIES = frozenset({
    "random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
    "sticky_least_loaded",
})
_STATUS = {"ready": "ready", "notready": "not_ready", "not_ready": "not_ready", "failed": "failed",
           "draining": "draining", "pending": "pending", "healthy": "ready", "unhealthy": "not_ready"}


# What smg and vllm-router run with where no flag says otherwise (their `--help` defaults).
GATEWAY_DEFAULTS: dict[str, Any] = {
    "health_interval_s": 60.0, "health_timeout_s": 5.0, "failure_threshold": 3, "success_threshold": 2,
    "request_timeout_s": 1800.0, "circuit_breaker_failures": 10, "circuit_breaker_open_s": 60.0,
}


@functools.lru_cache(maxsize=32)
def help_flags(argv: tuple[str, ...]) -> frozenset[str] | None:
    """The `--flags` a binary's help text names; None when the help cannot be read."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30.0, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    flags = frozenset(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", p.stdout + p.stderr))
    return flags or None


def normalize_status(w: dict[str, Any]) -> str:
    raw = w.get("status")
    if isinstance(raw, str) and raw:
        key = raw.strip().lower().replace("-", "_").replace(" ", "_")
        return _STATUS.get(key, _STATUS.get(key.replace("_", ""), key))
    healthy = w.get("is_healthy")
    if isinstance(healthy, bool):
        return "ready" if healthy else "not_ready"
    return "unknown"


class GatewayAdapter(RouterAdapter):
    """Shared part of the gateway adapters: flag filtering, liveness, worker reading, skip reasons."""

    package = "gateway"
    policies: frozenset[str] = frozenset()
    transports: tuple[str, ...] = TRANSPORTS
    has_worker_ids = True
    supports_inject_bug = False
    has_events = False
    # A named way of configuring the gateway (`smg-flags`), shown in its name and so in every report.
    variant = ""

    def __init__(
        self,
        executable: str,
        version: str | None = None,
        api_key: str | None = None,
        flags: frozenset[str] | None = None,
        log_level: str = "debug",
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(api_key)
        self.executable = executable
        # Passed last, verbatim: a gateway's own tuning (e.g. --disable-circuit-breaker) for an experiment.
        self.extra_args = list(extra_args)
        self.version = version
        self.flags = flags
        self.log_level = log_level
        variant = f"-{self.variant}" if self.variant else ""
        self.name = self.package + variant + (f"-{version}" if version else "")
        self._spec = self.package + variant + (f"=={version}" if version else "")
        self.dropped: list[str] = []

    def cli_spec(self) -> str | None:
        # Arguments passed verbatim (`pdchaos bisect --gateway-arg`) have no `pdchaos run` flag.
        return None if self.extra_args else self._spec

    # -- what it can run

    def cannot_run(self, scenario: Scenario, topology: str, connector: str, transport: str) -> str | None:
        """Why this gateway cannot run that cell (None: it can)."""
        if problem := self.mode_problem(topology):
            return problem
        if scenario.router.inject_bugs:
            return f"injects bug(s) {', '.join(scenario.router.inject_bugs)} into the reference router"
        if transport not in self.transports:
            return self.transport_reason(transport, connector)
        r = scenario.router
        for leg, pol in (("prefill", r.prefill_policy), ("decode", r.decode_policy)):
            if pol not in self.policies:
                return f"{self.package} has no {leg} policy {pol!r}"
        if not self.has_worker_ids:
            actions = [st.action for st in scenario.timeline]
            if scenario.unregistered_engines or any(
                isinstance(a, AddWorker | RemoveWorker | PatchWorker) for a in actions
            ):
                return f"{self.package} has no worker API to add, remove or update workers by id"
        return None

    def transport_reason(self, transport: str, connector: str) -> str:
        del connector
        return f"{self.package} does not serve {transport} workers"

    def adjustments(self, settings: RouterSettings) -> list[str]:
        """Settings this gateway takes only approximately (rounded, or with no flag at all)."""
        out = []
        for what, x in (("health interval", settings.health_interval_s),
                        ("health timeout", settings.health_timeout_s),
                        ("request timeout", settings.request_timeout_s)):
            if whole_seconds(x) != x:
                out.append(f"{what} {x:g} s -> {whole_seconds(x)} s (whole seconds, at least 1)")
        if settings.identity_check_interval_s is not None:
            out.append(f"identity check every {settings.identity_check_interval_s:g} s: no such flag")
        if settings.max_concurrent_health_checks is not None:
            out.append("max concurrent health checks: no such flag")
        if settings.extra_args:
            out.append(f"extra args {list(settings.extra_args)} are reference-router flags: not passed")
        known = self.known_flags()
        if known is not None:
            out += [f"{f}: not in this release, left out" for f in self.optional_flags() if f not in known]
        return out

    def contract(self, settings: RouterSettings) -> dict[str, Any]:
        """The numbers the gateway runs with: whole seconds, and its own default where a flag was not
        passed (none asked for, or this release has no such flag); no identity checks (no gateway has
        them)."""
        s, dropped = settings, set(self.dropped)
        asked: dict[str, tuple[str, Any]] = {
            "health_interval_s": ("--health-check-interval-secs", float(whole_seconds(s.health_interval_s))),
            "health_timeout_s": ("--health-check-timeout-secs", float(whole_seconds(s.health_timeout_s))),
            "failure_threshold": ("--health-failure-threshold", s.failure_threshold),
            "success_threshold": ("--health-success-threshold", s.success_threshold),
            "request_timeout_s": ("--request-timeout-secs", float(whole_seconds(s.request_timeout_s))),
        }
        out: dict[str, Any] = {key: GATEWAY_DEFAULTS[key] if flag in dropped else value
                               for key, (flag, value) in asked.items()}
        out["identity_check_interval_s"] = None
        out["max_concurrent_health_checks"] = None  # no gateway has the flag: it probes as it likes
        if "--disable-circuit-breaker" in self.extra_args:
            out["circuit_breaker_failures"] = None
        elif s.circuit_breaker_failures is None or "--cb-failure-threshold" in dropped:
            out["circuit_breaker_failures"] = GATEWAY_DEFAULTS["circuit_breaker_failures"]
            out["circuit_breaker_open_s"] = GATEWAY_DEFAULTS["circuit_breaker_open_s"]
        else:
            out["circuit_breaker_failures"] = s.circuit_breaker_failures
            out["circuit_breaker_open_s"] = float(whole_seconds(s.circuit_breaker_open_s))
        out["rules"] = self.rules()
        return out

    def rules(self) -> dict[str, Any]:
        """What this gateway documents differently from the reference router's contract."""
        return {}

    def optional_flags(self) -> list[str]:
        """Flags the launch passes only when the release's help names them."""
        return [f for f, _ in self.common_pairs(RouterSettings(circuit_breaker_failures=1))]

    # -- launching

    def help_argv(self) -> tuple[str, ...]:
        return (self.executable, "--help")

    def known_flags(self) -> frozenset[str] | None:
        if self.flags is None:
            self.flags = help_flags(self.help_argv())
        return self.flags

    def _filter(self, pairs: Iterable[tuple[str, list[str]]]) -> list[str]:
        """Flags this release knows (all when its help was unreadable); the rest are dropped and noted."""
        known = self.known_flags()
        out: list[str] = []
        for flag, values in pairs:
            if known is not None and flag not in known:
                self.dropped.append(flag)
                continue
            out += [flag, *values]
        return out

    def worker_args(self, topo: Topology, registered: list[str]) -> list[str]:
        argv: list[str] = []
        for p in topo.prefills:
            if p.name in registered:
                boot = str(p.bootstrap_port) if topo.connector == "mooncake" else "none"
                argv += ["--prefill", p.url(topo.transport), boot]
        for d in topo.decodes:
            if d.name in registered:
                argv += ["--decode", d.url(topo.transport)]
        return argv

    def common_pairs(self, settings: RouterSettings) -> list[tuple[str, list[str]]]:
        s = settings
        pairs: list[tuple[str, list[str]]] = [
            ("--health-check-interval-secs", [str(whole_seconds(s.health_interval_s))]),
            ("--health-check-timeout-secs", [str(whole_seconds(s.health_timeout_s))]),
            ("--health-failure-threshold", [str(s.failure_threshold)]),
            ("--health-success-threshold", [str(s.success_threshold)]),
            ("--prefill-policy", [s.prefill_policy]),
            ("--decode-policy", [s.decode_policy]),
            ("--request-timeout-secs", [str(whole_seconds(s.request_timeout_s))]),
            ("--log-level", [self.log_level]),
        ]
        if s.circuit_breaker_failures is not None:
            # Unset, the gateway keeps its own breaker (10 failures / 60 s): what its users run.
            pairs.append(("--cb-failure-threshold", [str(s.circuit_breaker_failures)]))
            pairs.append(("--cb-timeout-duration-secs", [str(whole_seconds(s.circuit_breaker_open_s))]))
        if self.api_key:
            pairs.append(("--api-key", [self.api_key]))
        return pairs

    def base_argv(self, topo: Topology) -> list[str]:
        known = self.known_flags()
        if known is not None and "--prometheus-host" not in known:
            # Without it the metrics listener binds every interface: not on this harness.
            raise RouterAdapterError(f"{self.name} has no --prometheus-host flag (it would bind 0.0.0.0)")
        return [
            "--host", "127.0.0.1", "--port", str(topo.router_port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        ]

    # -- readiness and reading

    async def wait_ready(self, session: aiohttp.ClientSession, topo: Topology, timeout_s: float) -> None:
        """`GET /liveness` answers 200: the gateway serves (its workers' readiness comes from `/workers`)."""
        await self._poll_until_answer(session, topo, "/liveness", timeout_s, statuses={200})

    def normalize_worker(self, w: dict[str, Any]) -> dict[str, Any]:
        out = dict(w)
        out.setdefault("id", w.get("url"))
        if "role" not in w:
            wt = w.get("worker_type")
            out["role"] = wt.lower() if isinstance(wt, str) else (str(wt) if wt is not None else "")
        out["status"] = normalize_status(w)
        out.setdefault("kv_engine_id", None)
        return out

    async def workers(self, session: aiohttp.ClientSession, topo: Topology) -> list[dict[str, Any]] | None:
        items = await super().workers(session, topo)
        if items is None:
            return None
        return [self.normalize_worker(w) for w in items]


# How long the adapter waits for a Mooncake prefill's bootstrap `/query` when it registers that worker.
QUERY_TIMEOUT_S = 3.0
# How long the operator waits for a prefill's `/query` on each pass (a down prefill must not hold the others).
OPERATOR_READ_S = 0.3
ACCEPTED = frozenset({200, 201, 202})


class SmgRouter(GatewayAdapter):
    """smg (`pip install smg`): `smg launch --pd-disaggregation`, configured as its users run it.

    gRPC workers come from `--prefill/--decode`: smg reads their KV transfer facts itself (`GetServerInfo`).
    HTTP workers are registered through the worker API after start, each with its facts (`kv_facts`): the
    flags alone give smg no connector, so it would pass requests through and every decode would compute the
    prompt itself. `smg-flags` (SmgFlagsRouter) is the flag-only way, which some users run.
    """

    package = "smg"
    policies = SMG_POLICIES
    # Register HTTP workers with their KV transfer facts through the worker API (False: `--prefill` flags).
    register_http_facts = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Set by launch when the workers are to be registered once smg serves: (router topology, engines).
        self._to_register: tuple[Topology, list[str]] | None = None
        # The `POST /workers` bodies sent, in order (what a report or a test can show of the registration).
        self.registrations: list[dict[str, Any]] = []
        # The Mooncake engine id each engine's worker was last registered with (None: registered without).
        self.registered_ids: dict[str, str | None] = {}

    def help_argv(self) -> tuple[str, ...]:
        return (self.executable, "launch", "--help")

    def optional_flags(self) -> list[str]:
        return [*super().optional_flags(), "--shutdown-grace-period-secs"]

    def registers_through_api(self, transport: str) -> bool:
        return self.register_http_facts and transport == "http"

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        del events_file
        self.dropped = []
        self.registrations = []
        self.registered_ids = {}
        argv = [self.executable, "launch", *self.base_argv(topo), "--pd-disaggregation"]
        if self.registers_through_api(topo.transport):
            # No worker flags: each worker goes in through `POST /workers` with its facts (wait_ready).
            self._to_register = (topo, list(registered))
        else:
            self._to_register = None
            argv += self.worker_args(topo, registered)
        # A short in-flight grace: the harness stops it with SIGTERM and SIGKILLs after about a second.
        argv += self._filter([*self.common_pairs(settings), ("--shutdown-grace-period-secs", ["1"])])
        return RouterLaunch(argv=argv + self.extra_args)

    async def wait_ready(self, session: aiohttp.ClientSession, topo: Topology, timeout_s: float) -> None:
        """Liveness, then (HTTP with facts) every worker of the launch registered within the same deadline."""
        started = time.monotonic()
        await super().wait_ready(session, topo, timeout_s)
        pending, self._to_register = self._to_register, None
        if pending is None:
            return
        rtopo, engines = pending
        for name in engines:
            left = timeout_s - (time.monotonic() - started)
            if left <= 0:
                raise TimeoutError(f"{self.name}: registering workers took over {timeout_s:g} s")
            status, body = await self._register(session, rtopo, name, min(QUERY_TIMEOUT_S, left))
            if status not in ACCEPTED:
                raise RouterAdapterError(f"{self.name} refused worker {name}: HTTP {status} {body}")

    async def kv_facts(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str, timeout_s: float
    ) -> KvFacts:
        """The engine's facts as its operator has them (the Mooncake engine id from the engine's `/query`)."""
        spec = topo.engine(engine)
        answer = None
        if topo.connector == "mooncake" and spec.role == "prefill":
            answer = await read_query(session, spec.host, spec.bootstrap_port, timeout_s)
        return engine_facts(topo.connector, spec.role, spec.bootstrap_port, answer)

    def worker_body(self, topo: Topology, engine: str, facts: KvFacts | None) -> dict[str, Any]:
        spec = topo.engine(engine)
        if facts is None:
            body: dict[str, Any] = {"url": spec.url(topo.transport), "worker_type": spec.role}
            if spec.role == "prefill" and topo.connector == "mooncake":
                body["bootstrap_port"] = spec.bootstrap_port
            return body
        return registration_body(spec.url(topo.transport), spec.role, facts, facts_style(self.version))

    async def _register(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str, timeout_s: float,
        mistake: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        facts = None
        if self.registers_through_api(topo.transport):
            facts = await self.kv_facts(session, topo, engine, timeout_s)
        body = mistaken_body(self.worker_body(topo, engine, facts), mistake)
        self.registrations.append(body)
        status, answer = await self._call(session, "POST", f"{topo.router_url}/workers", body)
        if status in ACCEPTED and mistake is None:
            self.registered_ids[engine] = facts.kv_engine_id if facts is not None else None
        return status, answer

    async def add_worker(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str,
        mistake: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        return await self._register(session, topo, engine, QUERY_TIMEOUT_S, mistake)


class SmgFlagsRouter(SmgRouter):
    """smg with its workers from `--prefill/--decode` only, over HTTP too: no KV transfer facts, so smg
    passes vLLM requests through and the decode computes the prompt (`--router smg-flags[==X.Y.Z]`)."""

    variant = "flags"
    register_http_facts = False


class SmgOperatorRouter(SmgRouter):
    """smg over HTTP as SmgRouter registers it, with an operator beside it that registers a Mooncake prefill
    again when its engine id changes (`engine_id_operator`): what a deployment restarting engines behind
    smg's HTTP mode needs, since smg never re-reads an HTTP worker's id (`--router smg-operator[==X.Y.Z]`).
    Over gRPC, or with NIXL, there is nothing to do: smg reads the id itself, or the prefill's answer
    carries it."""

    variant = "operator"
    # How long the operator keeps adding a removed worker back while smg still finishes its removal.
    READD_WINDOW_S = 5.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.operator: EngineIdOperator | None = None

    def companion(
        self, session: aiohttp.ClientSession, topo: Topology, emit: Callable[[Any], None]
    ) -> Coroutine[Any, Any, None] | None:
        if not self.registers_through_api(topo.transport) or topo.connector != "mooncake":
            return None

        async def read_id(engine: str) -> str | None:
            spec = topo.engine(engine)
            answer = await read_query(session, spec.host, spec.bootstrap_port, OPERATOR_READ_S)
            return None if answer is None else engine_id_from_query(answer)[0]

        async def reregister(engine: str) -> tuple[bool, str]:
            return await self._register_again(session, topo, engine)

        self.operator = EngineIdOperator(read_id, reregister)
        for name, eid in self.registered_ids.items():
            if topo.engine(name).role == "prefill":
                self.operator.watch(name, eid)

        def seen(engine: str, old: str | None, new: str) -> None:
            emit(WorldNote(f"operator saw {engine}'s engine id change: registering it again",
                           {"engine": engine, "old_engine_id": old, "new_engine_id": new}))

        def done(r: Reregistration) -> None:
            emit(WorldNote(f"operator registered {r.engine} again with its new engine id", r.fields()))

        return self.operator.run(done, seen)

    async def _register(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str, timeout_s: float,
        mistake: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        status, answer = await super()._register(session, topo, engine, timeout_s, mistake)
        if (self.operator is not None and mistake is None and status in ACCEPTED
                and topo.engine(engine).role == "prefill"):
            self.operator.watch(engine, self.registered_ids.get(engine))
        return status, answer

    async def remove_worker(
        self, session: aiohttp.ClientSession, topo: Topology, engine: str
    ) -> tuple[int, Any]:
        if self.operator is not None:
            self.operator.forget(engine)  # removed on purpose: the operator must not add it back
        return await super().remove_worker(session, topo, engine)

    async def _register_again(self, session: aiohttp.ClientSession, topo: Topology,
                              engine: str) -> tuple[bool, str]:
        """Remove the engine's worker, then add it with its facts read now; smg removes a worker in a
        background job, so the add is retried (until READD_WINDOW_S) while smg still has the old one."""
        removed, _ = await super().remove_worker(session, topo, engine)
        said = [f"DELETE: HTTP {removed}"]
        deadline = time.monotonic() + self.READD_WINDOW_S
        while True:
            status, body = await super()._register(session, topo, engine, QUERY_TIMEOUT_S)
            if status in ACCEPTED:
                return True, "; ".join([*said, f"POST: HTTP {status}"])
            if time.monotonic() >= deadline:
                return False, "; ".join([*said, f"POST: HTTP {status} {str(body)[:200]}"])
            await asyncio.sleep(0.1)


class VllmRouter(GatewayAdapter):
    """vllm-router (`pip install vllm-router`): HTTP workers only; `/workers` has no engine or worker ids."""

    package = "vllm-router"
    policies = VLLM_ROUTER_POLICIES
    transports = ("http",)
    has_worker_ids = False

    def optional_flags(self) -> list[str]:
        return ["--kv-connector", *super().optional_flags()]

    def cannot_run(self, scenario: Scenario, topology: str, connector: str, transport: str) -> str | None:
        why = super().cannot_run(scenario, topology, connector, transport)
        if why is not None:
            return why
        known = self.known_flags()
        if connector != "nixl" and known is not None and "--kv-connector" not in known:
            # Without the flag it assumes NIXL: a Mooncake cell would be run misconfigured, not as users do.
            return f"{self.name} has no --kv-connector flag (it speaks NIXL only)"
        return None

    def transport_reason(self, transport: str, connector: str) -> str:
        del connector
        return (f"vllm-router's {transport} mode speaks another gRPC service (GetServerInfo is 'Method not "
                "found' on VllmEngine) and fetches the tokenizer from the Hugging Face hub")

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        del events_file
        if topo.transport not in self.transports:
            raise RouterAdapterError(f"vllm-router cannot run {topo.transport} workers: "
                                     + self.transport_reason(topo.transport, topo.connector))
        self.dropped = []
        argv = [self.executable, *self.base_argv(topo), "--vllm-pd-disaggregation"]
        argv += self._filter([("--kv-connector", [topo.connector])])
        argv += self.worker_args(topo, registered)
        argv += self._filter(self.common_pairs(settings))
        return RouterLaunch(argv=argv + self.extra_args)

    def normalize_worker(self, w: dict[str, Any]) -> dict[str, Any]:
        out = super().normalize_worker(w)
        # Its status is `is_healthy` only: a worker it never probed yet shows up as ready.
        out["id"] = w.get("url")
        return out


ADAPTERS: dict[str, type[GatewayAdapter]] = {
    "smg": SmgRouter, "smg-flags": SmgFlagsRouter, "smg-operator": SmgOperatorRouter,
    "vllm-router": VllmRouter,
}
