"""The fake engines of a real-time cell: one `pdchaos-engine` OS process per engine, on fixed loopback ports
(a restart or respawn keeps every serving port), driven through their control API."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fake_engines.control_client import ControlError, EngineControlClient
from harness.scenario import EngineSettings
from harness.topology import EngineSpec, Topology
from harness.worlds.real.processes import ManagedProcess, ProcessSupervisor

ENGINE_READY_PREFIX = "PDCHAOS_ENGINE_READY"


def _engine_executable() -> list[str]:
    # The harness's own interpreter, not whatever `pdchaos-engine` PATH finds: the child must run this
    # checkout's code in this environment (a venv need not be activated).
    return [sys.executable, "-m", "fake_engines"]


def engine_argv(
    spec: EngineSpec,
    connector: str,
    settings: dict[str, Any],
    records: Path,
    token: str | None,
    seed: int | None,
) -> list[str]:
    """The `pdchaos-engine` command line for one engine (both HTTP and gRPC served; the router uses one)."""
    argv = [
        *_engine_executable(),
        "--name", spec.name, "--role", spec.role, "--connector", connector, "--host", spec.host,
        "--http-port", str(spec.http_port), "--grpc-port", str(spec.grpc_port),
        "--control-port", str(spec.control_port), "--records", str(records),
        "--transfer-timeout-s", f"{settings['transfer_timeout_s']:g}",
        "--kv-abort-timeout-s", f"{settings['kv_abort_timeout_s']:g}",
        "--handshake-timeout-s", f"{settings['handshake_timeout_s']:g}",
        "--load-failure-policy", str(settings["load_failure_policy"]),
    ]
    if connector == "mooncake" and spec.role == "prefill":
        argv += ["--bootstrap-port", str(spec.bootstrap_port)]
    if connector == "nixl":
        argv += ["--nixl-port", str(spec.nixl_port)]
    if settings.get("load_time_s"):
        argv += ["--load-time-s", f"{settings['load_time_s']:g}"]
    argv += ["--ttft-ms", f"{settings['ttft_ms']:g}", "--itl-ms", f"{settings['itl_ms']:g}"]
    if settings.get("advertise_side_channel_port"):
        # A proxied side channel (harness.worlds.real.links): decodes are told the proxy's port.
        argv += ["--advertise-side-channel-port", str(settings["advertise_side_channel_port"])]
    if token:
        argv += ["--control-token", token]
    if seed is not None:
        argv += ["--seed", str(seed)]
    for bug in settings.get("inject_bugs") or ():
        argv += ["--inject-bug", str(bug)]
    return argv


@dataclass
class EngineFleet:
    """The topology's engines as processes."""

    topo: Topology
    settings: EngineSettings
    supervisor: ProcessSupervisor
    out_dir: Path
    token: str | None = None
    seed: int | None = None
    ready_timeout_s: float = 20.0
    procs: dict[str, ManagedProcess] = field(default_factory=dict)

    def records_file(self, name: str) -> Path:
        return self.out_dir / "engines" / f"{name}.records.jsonl"

    def argv(self, name: str, first_start: bool = True) -> list[str]:
        per = self.settings.for_engine(name)
        if not first_start:
            # A respawned engine does not replay its initial loading delay unless asked by a SlowStart.
            per = {**per, "load_time_s": 0.0}
        return engine_argv(
            self.topo.engine(name), self.topo.connector, per, self.records_file(name), self.token, self.seed
        )

    def control(self, name: str, timeout_s: float = 5.0) -> EngineControlClient:
        return EngineControlClient(self.topo.engine(name).control_url, self.token, timeout_s)

    async def start(self, name: str, first_start: bool = True) -> ManagedProcess:
        """Start the engine's process; returns once it serves (its ready line carries its state)."""
        self.records_file(name).parent.mkdir(parents=True, exist_ok=True)
        load = self.settings.load_time(name) if first_start else 0.0
        proc = await self.supervisor.spawn(
            name,
            self.argv(name, first_start),
            ready_prefix=ENGINE_READY_PREFIX,
            ready_timeout_s=self.ready_timeout_s + load,
        )
        self.procs[name] = proc
        return proc

    async def state(self, name: str) -> dict[str, Any] | None:
        """What the engine reports of itself (None: it does not answer)."""
        try:
            st = await self.control(name, timeout_s=1.0).state()
        except (ControlError, aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return st if isinstance(st, dict) else None
