"""Router process settings (from the CLI), and how they become the core's HealthConfig, BreakerConfig,
DispatchLimits, leg policies and worker specs; `argv()` is the command line that gives them back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .core import (
    BreakerConfig,
    DispatchLimits,
    HealthConfig,
    LegPolicies,
    Role,
    WorkerSpec,
    make_worker_spec,
)
from .core.worker_urls import url_problem


class WorkerArg(NamedTuple):
    url: str
    bootstrap_port: int | None = None


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 0
    model: str | None = None
    api_key: str | None = None
    events_file: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    pd: bool = True
    prefill: tuple[WorkerArg, ...] = ()
    decode: tuple[str, ...] = ()
    regular: tuple[str, ...] = ()
    connector: str | None = None
    prefill_policy: str = "round_robin"
    decode_policy: str = "round_robin"
    request_timeout_s: float = 600.0
    interval_s: float = 60.0
    probe_timeout_s: float = 5.0
    failure_threshold: int = 3
    success_threshold: int = 2
    max_probes_in_flight: int = 128
    identity_check_interval_s: float = 30.0
    # Circuit breaker (off by default, unlike smg's, so every scenario without it keeps its behaviour).
    cb_failure_threshold: int | None = None
    cb_open_s: float = 60.0
    seed: int | None = None
    bugs: frozenset[str] = field(default_factory=frozenset)
    # Non-loopback worker hosts the worker API and the command line may name (`--allow-worker-host`).
    allowed_worker_hosts: tuple[str, ...] = ()

    def health(self) -> HealthConfig:
        return HealthConfig(
            failure_threshold=self.failure_threshold,
            success_threshold=self.success_threshold,
            probe_timeout_s=self.probe_timeout_s,
            interval_s=self.interval_s,
            max_probes_in_flight=self.max_probes_in_flight,
            # The re-read rides inside the probe, so the probe timeout is its deadline (DESIGN §2).
            metadata_timeout_s=self.probe_timeout_s,
            identity_check_interval_s=self.identity_check_interval_s,
            bugs=self.bugs,
        )

    def breaker(self) -> BreakerConfig:
        return BreakerConfig(
            failure_threshold=self.cb_failure_threshold, open_s=self.cb_open_s, bugs=self.bugs
        )

    def limits(self) -> DispatchLimits:
        # A request waits for its prefill's running engine-id re-read as long as the read may take.
        return DispatchLimits(self.request_timeout_s, id_read_wait_s=self.probe_timeout_s)

    def policies(self) -> LegPolicies:
        return LegPolicies.make(self.prefill_policy, self.decode_policy, self.seed, self.bugs)

    def argv(self) -> list[str]:
        """The `pdchaos-router` flags that give this configuration (`cli.config_from_args` reads them)."""
        out = ["--host", self.host, "--port", str(self.port)]
        optional = (("--model", self.model), ("--api-key", self.api_key), ("--events-file", self.events_file),
                    ("--connector", self.connector), ("--seed", self.seed))
        for flag, value in optional:
            if value is not None:
                out += [flag, str(value)]
        if self.pd:
            out.append("--pd-disaggregation")
        for arg in self.prefill:
            out += ["--prefill", arg.url, *(() if arg.bootstrap_port is None else (str(arg.bootstrap_port),))]
        for url in self.decode:
            out += ["--decode", url]
        if self.regular:
            out += ["--worker-urls", *self.regular]
        out += [
            "--max-body-bytes", str(self.max_body_bytes),
            "--prefill-policy", self.prefill_policy,
            "--decode-policy", self.decode_policy,
            "--request-timeout-secs", repr(self.request_timeout_s),
            "--health-check-interval-secs", repr(self.interval_s),
            "--health-check-timeout-secs", repr(self.probe_timeout_s),
            "--health-failure-threshold", str(self.failure_threshold),
            "--health-success-threshold", str(self.success_threshold),
            "--max-concurrent-health-checks", str(self.max_probes_in_flight),
            "--identity-check-interval-secs", repr(self.identity_check_interval_s),
            "--cb-timeout-duration-secs", repr(self.cb_open_s),
        ]
        if self.cb_failure_threshold is not None:
            out += ["--cb-failure-threshold", str(self.cb_failure_threshold)]
        for host in self.allowed_worker_hosts:
            out += ["--allow-worker-host", host]
        for bug in sorted(self.bugs):
            out += ["--inject-bug", bug]
        return out

    def validate(self) -> None:
        """ValueError for settings no router could serve with."""
        if self.host != "127.0.0.1":
            raise ValueError("the reference router binds 127.0.0.1 only")
        if self.request_timeout_s <= 0:
            raise ValueError("--request-timeout-secs must be > 0")
        if self.max_body_bytes < 1024:
            raise ValueError("--max-body-bytes must be >= 1024")
        if self.pd and self.regular:
            raise ValueError("--worker-urls is for regular mode; PD mode takes --prefill/--decode")
        if not self.pd and (self.prefill or self.decode):
            raise ValueError("--prefill/--decode need --pd-disaggregation")
        for url in (*(a.url for a in self.prefill), *self.decode, *self.regular):
            problem = url_problem(url, self.port or None, self.allowed_worker_hosts)
            if problem is not None:
                raise ValueError(problem)
        self.health()
        self.breaker()


def initial_specs(cfg: RouterConfig) -> list[WorkerSpec]:
    """Worker specs from the command line; ValueError (with the flag's story) for a bad one."""
    specs: list[WorkerSpec] = []
    for arg in cfg.prefill:
        specs.append(make_worker_spec(arg.url, Role.PREFILL, connector=cfg.connector,
                                      bootstrap_port=arg.bootstrap_port))
    for url in cfg.decode:
        specs.append(make_worker_spec(url, Role.DECODE, connector=cfg.connector))
    for url in cfg.regular:
        specs.append(make_worker_spec(url, Role.REGULAR))
    return specs
