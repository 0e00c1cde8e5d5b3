"""One prefill and one decode of an engine backend, up on loopback for the fidelity probes.

The engines are started by the backend's own fleet (`harness.worlds.real.backends.make_fleet`), so a probe
sees exactly what a scenario's router would: the fakes as `pdchaos-engine` processes, real vLLM with its
NIXL settings. Probes talk to each engine itself (for vLLM, its server behind the recording relay) and
fault it with process signals only, which every backend takes.
"""

from __future__ import annotations

import signal
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from harness.scenario import EngineSettings
from harness.topology import Topology, allocate
from harness.worlds.real.backends import VLLM_PULL_TIMEOUT_S, EngineChoice, make_fleet
from harness.worlds.real.engines import EngineFleet
from harness.worlds.real.processes import ProcessSupervisor

# The fakes are run with vLLM's own timeouts where the probes can see them: a NIXL decode gives up on a
# peer that does not answer its handshake after 5 s, while a pull from a peer that is there but silent
# (frozen) has no bound of its own in vLLM 0.32 (measured: no answer in 15 s); a Mooncake decode waits up
# to 480 s + 60 s (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT). 480 s stands for "past any probe's deadline".
VLLM_ABORT_TIMEOUT_S = 480.0
PROBE_SETTINGS = EngineSettings(transfer_timeout_s=VLLM_ABORT_TIMEOUT_S,
                                handshake_timeout_s=VLLM_PULL_TIMEOUT_S)
STOP_WAIT_S = 10.0


@dataclass
class EnginePair:
    """`async with EnginePair(choice, out_dir) as pair:` both engines serve; on exit every process goes."""

    choice: EngineChoice
    out_dir: Path
    connector: str = "nixl"
    transport: str = "http"
    fleet: EngineFleet | None = None
    ids: dict[str, str | None] = field(default_factory=dict)
    topo: Topology | None = None
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack)

    async def __aenter__(self) -> EnginePair:
        topo = self.topo = allocate("1p1d", self.connector, self.transport)
        # Registered first, so it runs last: the fleet closes once the supervisor has ended its processes.
        self._stack.push_async_callback(self._close_fleet)
        sup = await self._stack.enter_async_context(ProcessSupervisor(self.out_dir / "logs"))
        self.fleet = make_fleet(self.choice, topo, PROBE_SETTINGS, sup, self.out_dir, token=uuid.uuid4().hex,
                                ready_timeout_s=self.choice.start_budget_s())
        try:
            for role in ("prefill", "decode"):
                await self.fleet.start(self.name(role))
                await self._read_id(role)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _close_fleet(self) -> None:
        if self.fleet is not None:
            await self.fleet.close()

    def name(self, role: str) -> str:
        return f"{role}-0"

    def url(self, role: str) -> str:
        assert self.fleet is not None
        return self.fleet.direct_url(self.name(role))

    def grpc_target(self, role: str) -> str:
        assert self.fleet is not None
        return self.fleet.grpc_target(self.name(role))

    def bootstrap_addr(self) -> str:
        """Where the prefill's Mooncake bootstrap server answers `/query` (scheme included, as vLLM wants)."""
        assert self.topo is not None
        spec = self.topo.engine(self.name("prefill"))
        return f"http://{spec.host}:{spec.bootstrap_port}"

    def engine_id(self, role: str) -> str | None:
        return self.ids.get(role)

    async def _read_id(self, role: str) -> None:
        assert self.fleet is not None
        st = await self.fleet.state(self.name(role))
        self.ids[role] = str(st.get("engine_id")) if st and st.get("engine_id") else None

    async def kill(self, role: str) -> None:
        assert self.fleet is not None
        proc = self.fleet.procs[self.name(role)]
        proc.signal(signal.SIGKILL)
        await proc.wait(STOP_WAIT_S)

    async def restart(self, role: str) -> None:
        assert self.fleet is not None
        proc = self.fleet.procs.get(self.name(role))
        if proc is not None and proc.alive:
            await self.kill(role)
        await self.fleet.start(self.name(role), first_start=False)
        await self._read_id(role)

    async def pause(self, role: str) -> None:
        await self._signal(role, signal.SIGSTOP)

    async def resume(self, role: str) -> None:
        await self._signal(role, signal.SIGCONT)

    async def _signal(self, role: str, sig: int) -> None:
        assert self.fleet is not None
        self.fleet.procs[self.name(role)].signal(sig)
        await self.fleet.settle(self.name(role))
