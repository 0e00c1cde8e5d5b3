"""Real vLLM engines in a real-time cell: one vLLM OpenAI API server per engine on the engine's own loopback
ports, NIXL KV transfer, the tiny model of `harness.vllm`.

What differs from the fakes, and why:
- No control API: process faults only (kill, SIGSTOP/SIGCONT, SIGTERM, restart). A restart is a new process
  with a new engine id, which is what a rollout gives; `Restart(mode="control")` runs that way too.
- The engine id is the harness's to choose (`kv_transfer_config.engine_id`): `<name>-g<generation>-<hex>`,
  so the state reports the id in force without asking the engine.
- Readiness is `/health` answering 200 (a loading vLLM refuses connections), under a long deadline: a
  start takes about 30-40 s on a 2-core machine.
- Provenance: vLLM keeps none a checker could read, so a recording relay sits on the engine's serving port
  (`harness.worlds.real.relay`) and `harness.vllm.provenance` joins what crossed it with each decode's NIXL
  log into the fakes' record format. The relay also writes the engine call records of every probe and
  metadata read it relays; the harness marks its own probes through the relay as its own
  (`X-Pdchaos-Caller: harness`), so the router's are told apart.
- On a gRPC topology the engine is vLLM's gRPC server (smg's VllmEngine service) behind a gRPC recording
  relay on the engine's gRPC port (`harness.worlds.real.grpc_relay`, the same legs file); readiness, state
  and warm-up go through `HealthCheck` and `Generate`.
- After a SIGKILL, vLLM's shared-memory queues stay in /dev/shm (hundreds of MB each): after each stop
  the fleet removes those it made that no process holds any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fake_engines.core.calls import is_call_record
from harness.topology import EngineSpec
from harness.vllm import VllmInstall, find_install
from harness.vllm.launch import SERVED_MODEL, core_for, vllm_argv, vllm_env
from harness.vllm.provenance import NixlLog, logging_config, records_from
from harness.worlds.real.engines import EngineFleet, NoControlApi
from harness.worlds.real.grpc_relay import GrpcRecordingRelay
from harness.worlds.real.probes import grpc_health_probe, http_probe
from harness.worlds.real.processes import ManagedProcess, ProcessStartError, log_tail
from harness.worlds.real.relay import RecordingRelay
from pdchaos.jsonl import read_jsonl
from pdchaos.waiting import poll_until

VLLM_READY_TIMEOUT_S = 240.0
WARM_UP_TIMEOUT_S = 120.0
WARM_UP_PROMPT = "pdchaos warm-up: " + "the router sits in front of the engines. " * 12
HEALTH_POLL_S = 0.5
OLD_GROUP_EXIT_S = 60.0
SHM_SWEEP_WAIT_S = 10.0
SHM_DIR = Path("/dev/shm")
SHM_PREFIXES = ("psm_", "sem.mp-")


@dataclass
class VllmFleet(EngineFleet):
    """The topology's engines as vLLM processes."""

    kind = "vllm"

    install: VllmInstall | None = None
    engine_ids: dict[str, str] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    relays: dict[str, RecordingRelay | GrpcRecordingRelay] = field(default_factory=dict)
    started_wall: float = field(default_factory=time.time)
    _watchers: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ready_timeout_s = max(self.ready_timeout_s, VLLM_READY_TIMEOUT_S)
        if self.install is None:
            self.install = find_install()

    def has_control(self) -> bool:
        return False

    @property
    def text_known(self) -> bool:
        return False

    def control(self, name: str, timeout_s: float = 5.0) -> Any:
        raise NoControlApi(f"{name} is a real vLLM engine: it has no fault control API")

    @property
    def serves_grpc(self) -> bool:
        return self.topo.transport == "grpc"

    def backend_port(self, name: str) -> int:
        """Where the vLLM server itself listens (the relay holds the engine's serving port)."""
        return self.relay(name).backend_port

    def direct_url(self, name: str) -> str:
        """The vLLM server itself, behind the recording relay on the engine's serving port."""
        return f"http://{self.topo.engine(name).host}:{self.backend_port(name)}"

    async def serving_probe(self, name: str, timeout_s: float) -> str:
        """A health check through the relay, on the surface the topology speaks (a vLLM gRPC server has no
        HTTP port), marked as the harness's own: the relay records it, and it is no probe of the router's."""
        spec = self.topo.engine(name)
        if self.serves_grpc:
            return await grpc_health_probe(f"{spec.host}:{spec.grpc_port}", timeout_s)
        return await http_probe(f"{spec.http_url}/health", timeout_s)

    def grpc_target(self, name: str) -> str:
        """The vLLM gRPC server itself, behind the recording relay on the engine's gRPC port."""
        return f"{self.topo.engine(name).host}:{self.backend_port(name)}"

    def relay(self, name: str) -> RecordingRelay | GrpcRecordingRelay:
        if name not in self.relays:
            spec = self.topo.engine(name)
            kind = GrpcRecordingRelay if self.serves_grpc else RecordingRelay
            self.relays[name] = kind(name, spec, self.legs_file(name), self.topo.connector)
        return self.relays[name]

    def legs_file(self, name: str) -> Path:
        return self.out_dir / "engines" / f"{name}.legs.jsonl"

    def nixl_log(self, name: str) -> Path:
        return self.out_dir / "engines" / f"{name}.nixl.log"

    def _logging_config(self, name: str) -> Path:
        path = self.out_dir / "engines" / f"{name}.logging.json"
        path.write_text(json.dumps(logging_config(self.nixl_log(name)), indent=1), encoding="utf-8")
        return path

    async def _health(self, name: str, timeout_s: float) -> str:
        if self.serves_grpc:
            return await grpc_health_probe(self.grpc_target(name), timeout_s)
        return await http_probe(f"{self.direct_url(name)}/health", timeout_s)

    def _position(self, name: str) -> int:
        return [s.name for s in self.topo.engines].index(name)

    def argv(self, name: str, first_start: bool = True) -> list[str]:
        assert self.install is not None
        spec = self.topo.engine(name)
        # The server listens on the relay's backend port, in place of the surface the topology speaks.
        backend = self.backend_port(name)
        http_port, grpc_port = (spec.http_port, backend) if self.serves_grpc else (backend, spec.grpc_port)
        inner = EngineSpec(spec.name, spec.role, spec.index, http_port, grpc_port, spec.control_port,
                           spec.bootstrap_port, spec.nixl_port, spec.host)
        return vllm_argv(self.install.python, self.install.model_dir, inner, self.engine_ids[name],
                         self.settings.for_engine(name), transport=self.topo.transport)

    async def start(self, name: str, first_start: bool = True) -> ManagedProcess:
        """A vLLM server with a fresh engine id; returns once `/health` answers 200 (ProcessStartError with
        the log's tail when it exits or the deadline passes first)."""
        self.records_file(name).parent.mkdir(parents=True, exist_ok=True)
        await self._wait_gone(name)
        self.generations[name] = self.generations.get(name, 0) + 1
        self.engine_ids[name] = f"{name}-g{self.generations[name]}-{uuid.uuid4().hex[:8]}"
        relay = self.relay(name)
        await relay.open()
        relay.engine_id, relay.generation = self.engine_ids[name], self.generations[name]
        spec = self.topo.engine(name)
        env = {**vllm_env(spec, core_for(self._position(name))),
               "VLLM_LOGGING_CONFIG_PATH": str(self._logging_config(name))}
        proc = await self.supervisor.spawn(name, self.argv(name, first_start), env=env)
        self.procs[name] = proc
        await self._wait_serving(name, proc)
        await self._warm_up(name, proc)
        watcher = asyncio.create_task(self._watch(name, proc))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        await relay.serve()
        proc.ready_info = await self.state(name)
        return proc

    async def _wait_gone(self, name: str) -> None:
        """Before a restart, every process of the engine's previous start is gone: vLLM's workers outlive
        their API server for a while after a SIGKILL (seen: a worker with SIGKILL pending, unscheduled
        for minutes beside a decode spinning on its core) and hold the NIXL side-channel port and a core."""
        old = self.procs.get(name)
        # signal 0 reaches what is left of the group (by the run's marker once the leader is reaped)
        if old is None or not old.signal(0):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OLD_GROUP_EXIT_S
        while old.signal(0):
            if loop.time() >= deadline:
                raise ProcessStartError(
                    f"vLLM engine {name}: processes of its previous start still run {OLD_GROUP_EXIT_S:g} s "
                    f"after SIGKILL (process group {old.pgid}); not starting a second one beside them",
                    name, old.log_path, old.returncode)
            old.signal(9)
            await asyncio.sleep(HEALTH_POLL_S)

    async def _watch(self, name: str, proc: ManagedProcess) -> None:
        """However the engine ends (a fault, a crash of its own, the teardown), its port refuses at once."""
        while await proc.wait(3600.0) is None:
            pass
        if self.procs.get(name) is proc:
            self.on_stopped(name)

    async def _wait_serving(self, name: str, proc: ManagedProcess) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        while loop.time() < deadline:
            if not proc.alive:
                raise ProcessStartError(
                    f"vLLM engine {name} exited with code {proc.returncode} while starting: "
                    + " | ".join(log_tail(proc.log_path).strip().splitlines()[-5:]),
                    name, proc.log_path, proc.returncode)
            if await self._health(name, 2.0) == "ok:200":
                return
            await asyncio.sleep(HEALTH_POLL_S)
        proc.signal(9)
        raise ProcessStartError(f"vLLM engine {name} did not serve within {self.ready_timeout_s:g} s: "
                                + " | ".join(log_tail(proc.log_path).strip().splitlines()[-5:]),
                                name, proc.log_path, proc.returncode)

    async def _warm_up(self, name: str, proc: ManagedProcess) -> None:
        """Two plain completions straight to the server before its port opens to the router: the first
        forward of a CPU build takes seconds, during which the engine core does not even answer NIXL
        handshakes (a decode's first handshake then times out). No router setting is about that."""
        if self.serves_grpc:
            await self._warm_up_grpc(name, proc)
            return
        url = f"{self.direct_url(name)}/v1/completions"
        body = {"model": SERVED_MODEL, "prompt": WARM_UP_PROMPT, "max_tokens": 2}
        timeout = aiohttp.ClientTimeout(total=WARM_UP_TIMEOUT_S)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                for _ in range(2):
                    async with http.post(url, json=body) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"HTTP {resp.status}")
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            proc.signal(9)
            raise ProcessStartError(f"vLLM engine {name} failed its warm-up completion: {exc}", name,
                                    proc.log_path, proc.returncode) from None

    async def _warm_up_grpc(self, name: str, proc: ManagedProcess) -> None:
        import grpc

        from fake_engines.core.tokenizer import encode
        from pdchaos.proto import vllm_engine_pb2 as pb
        from pdchaos.proto import vllm_engine_pb2_grpc as pbg

        tokens = pb.TokenizedInput(original_text=WARM_UP_PROMPT, input_ids=encode(WARM_UP_PROMPT))
        try:
            async with grpc.aio.insecure_channel(self.grpc_target(name)) as channel:
                for i in range(2):
                    req = pb.GenerateRequest(request_id=f"pdchaos-warm-up-{i}", tokenized=tokens,
                                             sampling_params=pb.SamplingParams(max_tokens=2))
                    async for _ in pbg.VllmEngineStub(channel).Generate(req, timeout=WARM_UP_TIMEOUT_S):
                        pass
        except grpc.aio.AioRpcError as exc:
            proc.signal(9)
            raise ProcessStartError(f"vLLM engine {name} failed its warm-up Generate: {exc.code().name} "
                                    f"{exc.details()}", name, proc.log_path, proc.returncode) from None

    async def state(self, name: str) -> dict[str, Any] | None:
        """What can be seen of the engine: the id it was started with, whether it serves, its process."""
        proc = self.procs.get(name)
        if proc is None or not proc.alive:
            return None
        health = await self._health(name, 1.0)
        if health in ("refused", "error"):
            return None
        return {"engine_id": self.engine_ids.get(name), "generation": self.generations.get(name, 0),
                "serving": health == "ok:200", "health": health, "pid": proc.pid,
                "side_channel_port": self.topo.engine(name).nixl_port, "faults": {}, "engine": "vllm"}

    def records(self) -> list[dict[str, Any]]:
        """The engine call records the relays wrote, as they are, and provenance records from the legs they
        saw and the decodes' NIXL logs."""
        calls: list[dict[str, Any]] = []
        legs: list[dict[str, Any]] = []
        nixl = NixlLog()
        for spec in sorted(self.topo.engines, key=lambda s: s.name):
            if self.legs_file(spec.name).exists():
                for line in read_jsonl(self.legs_file(spec.name)):
                    (calls if is_call_record(line) else legs).append(line)
            log = self.nixl_log(spec.name)
            if log.exists():
                with open(log, encoding="utf-8", errors="replace") as fh:
                    nixl.read(fh)
        return calls + records_from(legs, nixl)

    def on_stopped(self, name: str) -> None:
        """An engine's process group is gone: its relay refuses (as a dead engine's port does) and what it
        left in /dev/shm goes."""
        relay = self.relays.get(name)
        if relay is not None:
            relay.refuse()
        remove_unused_shm(self.started_wall)

    async def close(self) -> None:
        """The cell is over: relays closed; once the engines' last workers have exited (they outlive the
        group leader by seconds after a SIGKILL, and map vLLM's /dev/shm queues until then), the queues go."""
        for task in list(self._watchers):
            task.cancel()
        for relay in self.relays.values():
            await relay.close()
        await poll_until(lambda: not any(p.signal(0) for p in self.procs.values() if not p.alive),
                         SHM_SWEEP_WAIT_S, interval_s=HEALTH_POLL_S)
        remove_unused_shm(self.started_wall)


def _shm_in_use() -> set[str]:
    """Paths under /dev/shm that some process has open or mapped."""
    used: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(str(SHM_DIR)):
                        used.add(target)
        maps = f"/proc/{pid}/maps"
        with contextlib.suppress(OSError), open(maps, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if str(SHM_DIR) in line:
                    used.add(line.split(None, 5)[-1].strip().removesuffix(" (deleted)"))
    return used


def remove_unused_shm(since_wall: float, shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove vLLM's shared-memory files made since `since_wall` that no process holds; their names."""
    try:
        entries = [p for p in shm_dir.iterdir() if p.name.startswith(SHM_PREFIXES)]
    except OSError:
        return []
    fresh = []
    for p in entries:
        with contextlib.suppress(OSError):
            if p.stat().st_mtime >= since_wall - 1.0:
                fresh.append(p)
    if not fresh:
        return []
    used = _shm_in_use()
    removed = []
    for p in fresh:
        if str(p) not in used:
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p.name)
    return removed
