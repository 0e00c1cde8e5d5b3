"""What the systems of a cell are told: the router's settings, the engines' settings, the client workload."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal


@dataclass(frozen=True)
class RouterSettings:
    """What the router under test is told (adapters translate to their own flags)."""

    # Seconds between two health probes of a worker.
    health_interval_s: float = 0.3
    # How long a probe may take before it counts as failed.
    health_timeout_s: float = 1.0
    # Failed probes in a row that take a worker out; passed probes in a row that bring it back.
    failure_threshold: int = 1
    success_threshold: int = 1
    # Probes and engine-id reads open at once, over all workers (None: no limit).
    max_concurrent_health_checks: int | None = None
    # Seconds between identity checks of a healthy worker (an engine id read); None: none.
    identity_check_interval_s: float | None = 1.0
    # How a leg picks its worker: round_robin, random, power_of_two, least_load.
    prefill_policy: str = "round_robin"
    decode_policy: str = "round_robin"
    # A request's deadline at the router, in seconds.
    request_timeout_s: float = 10.0
    # Test-only router bug switches (reference_router.core.bugs; `--inject-bug`): the reference router only.
    inject_bugs: tuple[str, ...] = ()
    # More command-line arguments for the router, passed as they are.
    extra_args: tuple[str, ...] = ()
    # None: no circuit breaker (gateways' production setting: 10 failures, 60 s open).
    circuit_breaker_failures: int | None = None
    # Seconds an open breaker keeps its worker out before a trial request.
    circuit_breaker_open_s: float = 60.0
    # False: over gRPC the router is not told the KV connector and learns it from each engine's
    # GetServerInfo (HTTP workers are always told: nothing there says it). The reference router honours it.
    tell_connector: bool = True

    def told_connector(self, connector: str, transport: str) -> str | None:
        """The connector the router is told for its workers (None: it learns it from the engines)."""
        return connector if self.tell_connector or transport != "grpc" else None


@dataclass(frozen=True)
class EngineSettings:
    """Engine flags shared by every engine; `per_engine` overrides by engine name (e.g. a slow loader)."""

    transfer_timeout_s: float = 3.0
    kv_abort_timeout_s: float = 30.0
    handshake_timeout_s: float = 1.0
    load_failure_policy: Literal["fail", "recompute"] = "fail"
    load_time_s: float = 0.0
    # The fake engines' timing model (their own defaults): time to first token, inter-token latency.
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    per_engine: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Test-only engine bug switches (fake_engines.core.bugs; `--inject-bug`), on every engine
    # (`per_engine[name]["inject_bugs"]` replaces them for that engine).
    inject_bugs: tuple[str, ...] = ()

    def for_engine(self, name: str) -> dict[str, Any]:
        base: dict[str, Any] = {
            "transfer_timeout_s": self.transfer_timeout_s,
            "kv_abort_timeout_s": self.kv_abort_timeout_s,
            "handshake_timeout_s": self.handshake_timeout_s,
            "load_failure_policy": self.load_failure_policy,
            "load_time_s": self.load_time_s,
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
            "inject_bugs": tuple(self.inject_bugs),
        }
        base.update(self.per_engine.get(name, {}))
        return base

    def load_time(self, name: str) -> float:
        """Seconds the engine refuses connections at its first start ("loading")."""
        return float(self.for_engine(name).get("load_time_s") or 0.0)


@dataclass(frozen=True)
class Workload:
    """Client traffic through the router. Times are seconds from the timeline's zero (all workers Ready)."""

    # open: requests arrive at `rate_rps` whatever the answers; closed: `concurrency` clients, each sending
    # its next request when the last one ended (after `think_time_s`).
    mode: Literal["open", "closed"] = "closed"
    rate_rps: float = 20.0
    concurrency: int = 4
    # Seconds of traffic.
    duration_s: float = 4.0
    # The shares of requests that stream, and that use /v1/chat/completions (the rest: /v1/completions).
    stream_fraction: float = 0.3
    chat_fraction: float = 0.2
    # A prompt's length in words: drawn between the two.
    prompt_words: tuple[int, int] = (6, 30)
    max_tokens: int = 8
    # A client gives up on a request after this many seconds.
    deadline_s: float = 6.0
    think_time_s: float = 0.02
    # The share of requests carrying a client's mistake only an engine can refuse: a model name no engine
    # serves (HTTP: the engine answers 404, which the router must relay as the client's and never count
    # against the engine; gRPC carries no model name: served). 0 keeps every request right.
    mistake_fraction: float = 0.0
    # The share of chat requests that cap their length with `max_completion_tokens` (OpenAI's current name
    # for it) instead of `max_tokens`. 0 keeps every request as it was drawn before (same histories).
    completion_tokens_fraction: float = 0.0
    # The share of requests that carry a stop string. Half the first word of their own answer, so the answer
    # ends at its first token, as a chat client's stop sequence may (vLLM cuts the text where it begins); a
    # prefill leg that kept it would end short of its length cap and free its KV. Half "###", which no answer
    # holds: a router that holds back what may start a stop string must let it out. 0: none (same histories).
    stop_fraction: float = 0.0
    # The share of requests whose answer is empty: the model's first token is end of sequence (the client's
    # seed picks it, `fake_engines.core.generator.seed_for_length`). vLLM checks end of sequence before the
    # length cap, so a prefill leg not told `ignore_eos` (or `min_tokens` 1) would end there and free its KV.
    # 0: none (same histories).
    eos_fraction: float = 0.0
    # Closed loop: once no fault is active, the load goes on at least this long, however late the last heal
    # came (a loaded machine can take seconds to start an engine again), so what is judged after a heal
    # always has traffic. None: the load ends at `duration_s`.
    after_heal_s: float | None = None


def whole_seconds(x: float, minimum: int = 1) -> int:
    """Seconds for a flag that takes whole seconds: rounded up (never shorter than asked), >= `minimum`."""
    return max(minimum, math.ceil(x - 1e-9))


def as_passed(settings: RouterSettings) -> RouterSettings:
    """The settings as a gateway gets them: its probe interval, probe timeout and request timeout flags take
    whole seconds (rounded up, at least 1). What a gateway profile runs with, to judge like the release."""
    return replace(settings, health_interval_s=float(whole_seconds(settings.health_interval_s)),
                   health_timeout_s=float(whole_seconds(settings.health_timeout_s)),
                   request_timeout_s=float(whole_seconds(settings.request_timeout_s)))
