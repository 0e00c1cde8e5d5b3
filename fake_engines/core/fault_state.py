"""Protocol fault state of one fake engine (pure). The control API applies/clears; the servers query.

Surfaces: ``health`` (/health, HealthCheck, grpc.health), ``metadata`` (GetModelInfo, GetServerInfo, GetLoads,
GetTokenizer, /v1/models, /version), ``server_info`` (GetServerInfo only), ``generate`` (completions,
Generate, Abort), ``side_channel`` (Mooncake bootstrap + side channel, NIXL handshake + pull); ``all`` covers
every one.
Servers ask with the most specific surface they serve (GetServerInfo asks ``server_info``, which ``metadata``
also covers).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

# The one source of the fault vocabulary: the control API, the CLI help and the harness's scenarios use these.
SURFACES: tuple[str, ...] = ("all", "health", "metadata", "server_info", "generate", "side_channel")
FAULT_KINDS: tuple[str, ...] = ("wedge", "fail_server_info", "no_engine_id", "fail_requests", "latency")

# surface -> broader surfaces that also cover it
_COVERED_BY = {
    "health": ("all",),
    "metadata": ("all",),
    "server_info": ("metadata", "all"),
    "generate": ("all",),
    "side_channel": ("all",),
    "all": (),
}


def _surface(params: Mapping[str, Any], default: str | None = None) -> str:
    s = params.get("surface", default)
    if s not in SURFACES:
        raise ValueError(f"surface must be one of {', '.join(SURFACES)}, got {s!r}")
    return str(s)


def _number(params: Mapping[str, Any], key: str, default: Any = None) -> float:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{key} must be a number, got {v!r}")
    if v < 0 or v != v:
        raise ValueError(f"{key} must be >= 0, got {v!r}")
    return float(v)


def _int(params: Mapping[str, Any], key: str, default: Any, lo: int, hi: int | None = None) -> int:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key} must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{key} must be {bound}, got {v}")
    return v


class FaultState:
    """Active protocol faults. Mutators return ``changed``: ``{kind: {"old", "new"}}`` (empty if none)."""

    def __init__(self) -> None:
        self._wedged: set[str] = set()
        self._fail_server_info = False
        self._no_engine_id = False
        self._fail_count = 0
        self._fail_status = 500
        self._latency_ms: dict[str, float] = {}

    # -- views ---------------------------------------------------------------------------------------------
    def _view(self, kind: str) -> Any:
        if kind == "wedge":
            return sorted(self._wedged) or None
        if kind == "fail_server_info":
            return self._fail_server_info or None
        if kind == "no_engine_id":
            return self._no_engine_id or None
        if kind == "fail_requests":
            return {"count": self._fail_count, "status": self._fail_status} if self._fail_count else None
        if kind == "latency":
            return dict(sorted(self._latency_ms.items())) or None
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")

    def as_dict(self) -> dict[str, Any]:
        """Active faults only, JSON-ready (the control STATE's ``faults``)."""
        out = {}
        for kind in FAULT_KINDS:
            v = self._view(kind)
            if v is not None:
                out[kind] = copy.deepcopy(v)
        return out

    # -- mutators ------------------------------------------------------------------------------------------
    def apply(self, kind: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Activate a fault. ValueError (clear message) on unknown kind or bad params; state unchanged then.

        ``wedge {"surface"}`` adds a surface; ``fail_requests {"count": N>=1, "status": 400..599 (500)}``
        replaces the counter; ``latency {"surface", "ms"}`` sets that surface's added latency (0 removes it).
        """
        params = params or {}
        if not isinstance(params, Mapping):
            raise ValueError("fault params must be an object")
        old = copy.deepcopy(self._view(kind))  # also validates kind
        if kind == "wedge":
            self._wedged.add(_surface(params, "all"))
        elif kind == "fail_server_info":
            self._fail_server_info = True
        elif kind == "no_engine_id":
            self._no_engine_id = True
        elif kind == "fail_requests":
            count = _int(params, "count", 1, 1)
            status = _int(params, "status", 500, 400, 599)
            self._fail_count, self._fail_status = count, status
        elif kind == "latency":
            surface = _surface(params, "all")
            ms = _number(params, "ms")
            if ms == 0:
                self._latency_ms.pop(surface, None)
            else:
                self._latency_ms[surface] = ms
        return self._changed(kind, old)

    def apply_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """``{"fault": KIND, ...params}`` as posted to ``/control/fault``."""
        if not isinstance(spec, Mapping) or not isinstance(spec.get("fault"), str):
            raise ValueError("fault spec must be an object with a string 'fault'")
        params = {k: v for k, v in spec.items() if k != "fault"}
        return self.apply(spec["fault"], params)

    def clear(self, kind: str) -> dict[str, Any]:
        """Deactivate one fault kind entirely (every surface); ValueError on unknown kind."""
        old = copy.deepcopy(self._view(kind))
        if kind == "wedge":
            self._wedged.clear()
        elif kind == "fail_server_info":
            self._fail_server_info = False
        elif kind == "no_engine_id":
            self._no_engine_id = False
        elif kind == "fail_requests":
            self._fail_count = 0
            self._fail_status = 500
        elif kind == "latency":
            self._latency_ms.clear()
        return self._changed(kind, old)

    def clear_all(self) -> dict[str, Any]:
        """Deactivate everything; ``changed`` lists each kind that was active."""
        changed: dict[str, Any] = {}
        for kind in FAULT_KINDS:
            changed.update(self.clear(kind))
        return changed

    def _changed(self, kind: str, old: Any) -> dict[str, Any]:
        new = copy.deepcopy(self._view(kind))
        return {} if old == new else {kind: {"old": old, "new": new}}

    # -- queries -------------------------------------------------------------------------------------------
    def is_wedged(self, surface: str) -> bool:
        """True when requests on ``surface`` must be accepted and never answered."""
        if surface not in _COVERED_BY:
            raise ValueError(f"unknown surface {surface!r}")
        return surface in self._wedged or any(s in self._wedged for s in _COVERED_BY[surface])

    @property
    def fail_server_info(self) -> bool:
        """GetServerInfo must answer UNAVAILABLE (GetModelInfo still answers)."""
        return self._fail_server_info

    @property
    def no_engine_id(self) -> bool:
        """Report ``kv_engine_id`` as ""."""
        return self._no_engine_id

    def take_failure(self) -> int | None:
        """For one generate request: the HTTP status to fail it with (consuming one of N), or None."""
        if self._fail_count <= 0:
            return None
        self._fail_count -= 1
        return self._fail_status

    def gate_delay(self, surface: str) -> float | None:
        """What a request on ``surface`` meets at its gate: None while wedged (park it until the faults
        change, then ask again), else the added latency in seconds before it may be answered (0.0: none)."""
        if not self._wedged and not self._latency_ms:
            # Every request passes a gate or more, and almost always no fault is set: answer without the
            # surface's coverage walk (a simulated hour runs a quarter of a million gates).
            if surface not in _COVERED_BY:
                raise ValueError(f"unknown surface {surface!r}")
            return 0.0
        if self.is_wedged(surface):
            return None
        return self.latency_s(surface)

    def latency_s(self, surface: str) -> float:
        """Added latency for ``surface``: the largest of its own setting and the broader ones covering it."""
        if surface not in _COVERED_BY:
            raise ValueError(f"unknown surface {surface!r}")
        ms = [self._latency_ms.get(s, 0.0) for s in (surface, *_COVERED_BY[surface])]
        return max(ms) / 1000.0
