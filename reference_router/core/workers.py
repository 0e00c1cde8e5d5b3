"""Worker model: what was configured (WorkerSpec) apart from what the router has learned (WorkerRuntime).

Keeping the two apart is what makes a property update safe (bug #7): an update rebuilds the spec's labels and
priority only, and the engine id in force lives in the runtime, which the worker API shows (bug #14).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any
from urllib.parse import urlsplit

from .bugs import API_REPORTS_FIRST_ID, PATCH_DROPS_KV_CONFIG

MOONCAKE_DEFAULT_BOOTSTRAP_PORT = 8998


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    REGULAR = "regular"


class Transport(StrEnum):
    HTTP = "http"
    GRPC = "grpc"


class Connector(StrEnum):
    MOONCAKE = "mooncake"
    NIXL = "nixl"
    NONE = "none"


class ProbeStage(StrEnum):
    """Which part of a probe holds the worker's probe slot."""

    PROBE = "probe"
    REREAD = "reread"  # the engine-id re-read that follows a successful probe


class Status(StrEnum):
    PENDING = "pending"
    READY = "ready"
    NOT_READY = "not_ready"
    FAILED = "failed"
    DRAINING = "draining"


class BreakerState(StrEnum):
    """A worker's circuit breaker (core.breaker)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# Members that per-worker loops compare with (every leg of every request visits each worker of its role):
# on Python 3.11 reading a member as `Status.READY` costs about 140 ns, reading a module global about 10.
READY = Status.READY
BREAKER_CLOSED = BreakerState.CLOSED
BREAKER_OPEN = BreakerState.OPEN
PROBE_REREAD = ProbeStage.REREAD
MOONCAKE = Connector.MOONCAKE


def _enum_value(enum: type[Enum], value: Any, what: str) -> Any:
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum(value.strip().lower())
        except ValueError:
            pass
    allowed = ", ".join(str(m.value) for m in enum)  # type: ignore[attr-defined]
    raise ValueError(f"unknown {what} {value!r}; expected one of: {allowed}")


def parse_role(value: Any) -> Role:
    """Role from its name (case-insensitive); ValueError with the allowed names."""
    return _enum_value(Role, value, "role")  # type: ignore[no-any-return]


def parse_connector(value: Any) -> Connector:
    """Connector from its name; also accepts vLLM's class names (MooncakeConnector, NixlConnector) and ""."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        aliases = {"mooncakeconnector": "mooncake", "nixlconnector": "nixl", "": "none"}
        value = aliases.get(lowered, lowered)
    return _enum_value(Connector, value, "connector")  # type: ignore[no-any-return]


def _check_port(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"{what} must be an integer in 1..65535, got {value!r}")
    return value


def _check_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be an integer, got {value!r}")
    return value


@dataclass(frozen=True)
class WorkerSpec:
    """What the operator configured. Build with make_worker_spec() / spec_from_json(), which validate.

    connector None means "not known yet": a gRPC PD worker whose connector is learned from GetServerInfo.
    """

    url: str
    role: Role
    transport: Transport
    connector: Connector | None
    host: str
    port: int
    kv_role: str | None = None
    bootstrap_port: int | None = None
    dp_size: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    engine_id: str | None = None

    @property
    def is_pd(self) -> bool:
        return self.role is not Role.REGULAR


def make_worker_spec(
    url: str,
    role: Role | str,
    *,
    connector: Connector | str | None = None,
    kv_role: str | None = None,
    bootstrap_port: int | None = None,
    dp_size: int = 1,
    labels: Mapping[str, str] | None = None,
    priority: int = 0,
    engine_id: str | None = None,
) -> WorkerSpec:
    """Validate and build a spec; every problem is a ValueError whose message fits a 400 answer.

    Transport comes from the url scheme (http:// or grpc://). Without a connector: regular workers get none,
    HTTP PD workers get Mooncake, gRPC PD workers stay unknown (None) until GetServerInfo says. A Mooncake
    prefill without a bootstrap port gets 8998.
    """
    if not isinstance(url, str) or not url:
        raise ValueError("url must be a non-empty string like http://127.0.0.1:8000 or grpc://127.0.0.1:50051")
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("http", "grpc"):
        raise ValueError(f"url scheme must be http:// or grpc://, got {url!r}")
    transport = Transport(scheme)
    host = parts.hostname
    if not host:
        raise ValueError(f"url has no host: {url!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"url has a bad port: {url!r}") from exc
    if port is None:
        if transport is Transport.GRPC:
            raise ValueError(f"grpc url needs a port: {url!r}")
        port = 80
    _check_port(port, "url port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"url must be scheme://host:port with no path or query, got {url!r}")
    role_v = parse_role(role)
    conn: Connector | None
    if connector is not None:
        conn = parse_connector(connector)
    elif role_v is Role.REGULAR:
        conn = Connector.NONE
    elif transport is Transport.HTTP:
        conn = Connector.MOONCAKE
    else:
        conn = None
    if bootstrap_port is not None:
        _check_port(bootstrap_port, "bootstrap_port")
    elif conn is Connector.MOONCAKE and role_v is Role.PREFILL:
        bootstrap_port = MOONCAKE_DEFAULT_BOOTSTRAP_PORT
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"dp_size must be an integer >= 1, got {dp_size!r}")
    _check_priority(priority)
    lab = _check_labels(labels)
    if engine_id is not None and (not isinstance(engine_id, str) or not engine_id):
        raise ValueError("engine_id must be a non-empty string when given")
    if kv_role is not None and not isinstance(kv_role, str):
        raise ValueError("kv_role must be a string when given")
    return WorkerSpec(
        url=f"{scheme}://{parts.netloc}",
        role=role_v,
        transport=transport,
        connector=conn,
        host=host,
        port=port,
        kv_role=kv_role,
        bootstrap_port=bootstrap_port,
        dp_size=dp_size,
        labels=lab,
        priority=priority,
        engine_id=engine_id,
    )


def _check_labels(labels: Any) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise ValueError("labels must be an object of string -> string")
    for k, v in labels.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError("labels must be an object of string -> string")
    return dict(labels)


_SPEC_FIELDS = {"url", "role", "connector", "kv_role", "bootstrap_port", "dp_size", "labels", "priority",
                "engine_id"}


def spec_from_json(body: Any) -> WorkerSpec:
    """A spec from a `POST /workers` body {url, role, bootstrap_port?, connector?, labels?, priority?}."""
    if not isinstance(body, Mapping):
        raise ValueError("body must be a JSON object")
    unknown = sorted(set(body) - _SPEC_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    if "url" not in body or "role" not in body:
        raise ValueError("url and role are required")
    return make_worker_spec(
        body["url"],
        body["role"],
        connector=body.get("connector"),
        kv_role=body.get("kv_role"),
        bootstrap_port=body.get("bootstrap_port"),
        dp_size=body.get("dp_size", 1),
        labels=body.get("labels"),
        priority=body.get("priority", 0),
        engine_id=body.get("engine_id"),
    )


@dataclass(frozen=True)
class Counters:
    """Consecutive probe outcomes, as the status state machine counts them."""

    successes: int = 0
    failures: int = 0
    pending_probes: int = 0


@dataclass
class BreakerRuntime:
    """The circuit breaker's memory for one worker; only core.breaker changes it."""

    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # consecutive own failures while closed
    open_until: float | None = None  # while open: when the one trial request may go
    trial_request: str | None = None  # while half-open: the request holding the one trial


@dataclass
class WorkerRuntime:
    """What the router has learned about a worker; mutated by the server through the core's helpers."""

    status: Status = Status.PENDING
    counters: Counters = field(default_factory=Counters)
    engine_id: str | None = None
    engine_id_confirmed: bool = False
    # The first engine id the router knew (configured or read): what bug api_reports_first_id shows.
    first_engine_id: str | None = None
    learned_connector: Connector | None = None
    learned_dp_size: int | None = None
    probe_seq: int = 0
    probe_in_flight_since: float | None = None
    probe_stage: ProbeStage | None = None
    last_probe_at: float | None = None
    suspect_since: float | None = None  # a request leg failed without reaching it: probe now (core.retry)
    ready_since: float | None = None
    identity_seq: int = 0
    identity_in_flight_since: float | None = None
    last_identity_check_at: float | None = None
    last_uptime_s: float | None = None
    in_flight_requests: int = 0
    breaker: BreakerRuntime = field(default_factory=BreakerRuntime)

    @property
    def load(self) -> int:
        return self.in_flight_requests


@dataclass
class Worker:
    """One registered worker: its id, its configuration and what the router knows about it now."""

    id: str
    spec: WorkerSpec
    runtime: WorkerRuntime = field(default_factory=WorkerRuntime)

    @classmethod
    def new(cls, worker_id: str, spec: WorkerSpec) -> Worker:
        """A fresh Pending worker; the engine id in force starts at the spec's seed id (if any)."""
        return cls(id=worker_id, spec=spec,
                   runtime=WorkerRuntime(engine_id=spec.engine_id, first_engine_id=spec.engine_id))

    @property
    def status(self) -> Status:
        return self.runtime.status

    @property
    def role(self) -> Role:
        return self.spec.role

    @property
    def connector(self) -> Connector | None:
        """The connector in force: configured, else learned from metadata, else None (unknown yet)."""
        return self.spec.connector if self.spec.connector is not None else self.runtime.learned_connector

    @property
    def dp_size(self) -> int:
        return self.runtime.learned_dp_size or self.spec.dp_size

    @property
    def engine_id(self) -> str | None:
        """The engine id in force (not the one read at registration)."""
        return self.runtime.engine_id

    @property
    def bootstrap_port(self) -> int | None:
        """Configured, else the Mooncake default for a prefill whose connector turned out to be Mooncake."""
        if self.spec.bootstrap_port is not None:
            return self.spec.bootstrap_port
        if self.connector is Connector.MOONCAKE and self.spec.role is Role.PREFILL:
            return MOONCAKE_DEFAULT_BOOTSTRAP_PORT
        return None


_UPDATABLE = {"labels", "priority"}


def apply_property_update(spec: WorkerSpec, update: Any, bugs: frozenset[str] = frozenset()) -> WorkerSpec:
    """A new spec with labels/priority from a `PATCH /workers/{id}` body; everything else is kept (bug #7).

    Only `labels` and `priority` may change; other fields are a ValueError (so a PATCH cannot silently drop
    the connector, role, engine id or bootstrap port). The runtime is untouched.
    """
    if not isinstance(update, Mapping):
        raise ValueError("body must be a JSON object")
    bad = sorted(set(update) - _UPDATABLE)
    if bad:
        raise ValueError(f"only {sorted(_UPDATABLE)} can be updated, got {bad}")
    changes: dict[str, Any] = {}
    if "labels" in update:
        changes["labels"] = _check_labels(update["labels"])
    if "priority" in update:
        changes["priority"] = _check_priority(update["priority"])
    if PATCH_DROPS_KV_CONFIG in bugs:
        changes.update(connector=Connector.NONE, bootstrap_port=None)
    return dataclasses.replace(spec, **changes)


def worker_api_dict(worker: Worker, bugs: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The worker API record W of CONTRACTS.md §2; kv_engine_id is the id in force (bug #14)."""
    conn = worker.connector
    engine_id = worker.runtime.engine_id
    if API_REPORTS_FIRST_ID in bugs:
        engine_id = worker.runtime.first_engine_id
    return {
        "id": worker.id,
        "url": worker.spec.url,
        "role": worker.spec.role.value,
        "transport": worker.spec.transport.value,
        "connector": conn.value if conn is not None else None,
        "bootstrap_port": worker.bootstrap_port,
        "status": worker.runtime.status.value,
        "kv_engine_id": engine_id,
        "engine_id_confirmed": worker.runtime.engine_id_confirmed,
        "labels": dict(worker.spec.labels),
        "priority": worker.spec.priority,
        "dp_size": worker.dp_size,
        # As of the last step that looked at the clock (a health tick or a pick): an open breaker whose
        # period just ended shows open until then.
        "breaker": worker.runtime.breaker.state.value,
    }
