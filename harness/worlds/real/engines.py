"""The fake engines of a real-time cell: one `pdchaos-engine` OS process per engine, on fixed loopback ports
(a restart or respawn keeps every serving port), driven through their control API.

`EngineFleet` is also what the real world asks of any engine backend (`harness.worlds.real.backends`):
start an engine and return once it serves, say what it is (`state`), clear its faults, tell whether it is
frozen, hand over its provenance records. Real vLLM (`vllm_engines`) and command templates
(`command_engines`) are subclasses that start other processes and answer from what they can see.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fake_engines.control_client import ControlError, EngineControlClient
from harness.scenario import EngineSettings
from harness.scenario.links import LinkRef
from harness.topology import EngineSpec, Topology
from harness.worlds.real.probes import http_probe, process_state
from harness.worlds.real.processes import ManagedProcess, ProcessSupervisor
from pdchaos.jsonl import read_jsonl

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
    connector = spec.engine_connector(connector)
    argv = [
        *_engine_executable(),
        "--name", spec.name, "--role", spec.engine_role, "--connector", connector, "--host", spec.host,
        "--http-port", str(spec.http_port), "--grpc-port", str(spec.grpc_port),
        "--control-port", str(spec.control_port), "--records", str(records),
    ]
    if connector == "mooncake" and spec.role == "prefill":
        argv += ["--bootstrap-port", str(spec.bootstrap_port)]
    if connector == "nixl":
        argv += ["--nixl-port", str(spec.nixl_port)]
    argv += setting_args(settings, seed)
    if token:
        argv += ["--control-token", token]
    return argv


def setting_args(settings: dict[str, Any], seed: int | None) -> list[str]:
    """The scenario's engine settings as `pdchaos-engine` flags (also what an engine pod is given)."""
    argv = [
        "--transfer-timeout-s", f"{settings['transfer_timeout_s']:g}",
        "--kv-abort-timeout-s", f"{settings['kv_abort_timeout_s']:g}",
        "--handshake-timeout-s", f"{settings['handshake_timeout_s']:g}",
        "--load-failure-policy", str(settings["load_failure_policy"]),
    ]
    if settings.get("load_time_s"):
        argv += ["--load-time-s", f"{settings['load_time_s']:g}"]
    argv += ["--ttft-ms", f"{settings['ttft_ms']:g}", "--itl-ms", f"{settings['itl_ms']:g}"]
    if settings.get("advertise_side_channel_port"):
        # A proxied side channel (harness.worlds.real.links): decodes are told the proxy's port.
        argv += ["--advertise-side-channel-port", str(settings["advertise_side_channel_port"])]
    if seed is not None:
        argv += ["--seed", str(seed)]
    for bug in settings.get("inject_bugs") or ():
        argv += ["--inject-bug", str(bug)]
    return argv


class NoControlApi(RuntimeError):
    """A fault that needs the fake engines' control API was asked of an engine that has none."""


@dataclass
class EngineFleet:
    """The topology's engines as processes (the fake engines; the base of every engine backend)."""

    kind = "fake"

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

    def direct_url(self, name: str) -> str:
        """The engine's own HTTP address (what a router is given, unless a relay or proxy sits in front)."""
        return self.topo.engine(name).http_url

    async def serving_probe(self, name: str, timeout_s: float) -> str:
        """What a router's health check of the engine sees on its serving port (`http_probe` words); the
        fakes always serve HTTP beside gRPC."""
        return await http_probe(f"{self.topo.engine(name).http_url}/health", timeout_s)

    def grpc_target(self, name: str) -> str:
        """The engine's own gRPC address, `host:port` (the VllmEngine service)."""
        spec = self.topo.engine(name)
        return f"{spec.host}:{spec.grpc_port}"

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

    def has_control(self) -> bool:
        """Whether the engines take the fakes' control API (protocol faults, control-mode restarts)."""
        return True

    @property
    def text_known(self) -> bool:
        """Whether a correct completion's text is known in advance (the fakes' output is a function of the
        prompt; a real model's is not)."""
        return True

    async def clear_faults(self, name: str, kind: str | None) -> None:
        """Clear one fault kind, or every fault (None), through the control API (engines without one carry no
        injected protocol fault); an engine that does not answer keeps whatever it has (the caller reads the
        state afterwards)."""
        if not self.has_control():
            return
        client = self.control(name)
        with contextlib.suppress(ControlError, aiohttp.ClientError, TimeoutError):
            await (client.clear() if kind is None else client.clear_fault(kind))

    def is_paused(self, name: str) -> bool:
        """The engine's process is stopped (SIGSTOP)."""
        proc = self.procs.get(name)
        return proc is not None and process_state(proc.pid) == "T"

    async def settle(self, name: str) -> bool | None:
        """Wait for a fault command still running against the engine (None: none; a signal is immediate)."""
        return None

    async def prepare(self, links: Sequence[LinkRef] = ()) -> Topology:
        """Before any engine starts: set up what the backend needs; the topology as the router and the
        harness reach the engines (the fleet's own, unless the backend puts them elsewhere). `links`: the
        links the timeline faults."""
        return self.topo

    def network(self, refs: list[LinkRef], seed: int) -> Any:
        """What puts the link faults in place: Toxiproxy on this host, in front of the engines."""
        from harness.worlds.real.links import NetworkLinks

        return NetworkLinks(refs, self.topo, seed=seed)

    async def stop_all(self) -> None:
        """The run is over: every engine stops at once (SIGINT: nobody will pull the KV they hold, so a
        graceful drain would only wait)."""
        for proc in list(self.procs.values()):
            proc.signal(signal.SIGINT)

    async def close(self) -> None:
        """The cell is over (its processes are gone or going): release what the backend holds."""
        return None

    def records(self) -> list[dict[str, Any]]:
        """Every engine's provenance records (the `--records` files survive crashes and respawns)."""
        out: list[dict[str, Any]] = []
        for spec in sorted(self.topo.engines, key=lambda s: s.name):
            path = self.records_file(spec.name)
            if path.exists():
                out.extend(read_jsonl(path))
        return out
