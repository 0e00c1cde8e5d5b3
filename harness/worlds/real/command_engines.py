"""Engines driven by command templates (`--engines command:FILE`): engines on other hosts, started and
faulted through ssh, kubectl or a scheduler, judged by the same session as local ones.

The file (TOML):

    serves = "vllm"            # what answers: "vllm" (output text not known in advance) or "fake"
    ready_timeout_s = 300      # start -> /health 200
    command_timeout_s = 30     # each kill/stop/pause/resume command
    start = "ssh gpu-{index} 'exec vllm serve ... --port {http_port} ...'"
    kill = "ssh gpu-{index} pkill -KILL -f 'port {http_port}'"
    stop = "..."               # graceful (SIGTERM-like); default: kill
    pause = "..."              # freeze (SIGSTOP-like); no pause: wedges are not applicable
    resume = "..."

Placeholders: {name} {role} {kv_role} {index} {host} {http_port} {grpc_port} {nixl_port} {bootstrap_port}
{control_port} {connector} {engine_id} (fresh at each start: a restart is a new id) {generation} {run_dir}
(the cell's engines folder) {python} (the harness's interpreter) {records} (a fake engine's records file)
and the scenario's engine settings {transfer_timeout_s} {kv_abort_timeout_s} {load_failure_policy}.
Values are shell-quoted where they are put.

Addresses: pdchaos stays on loopback, so the router reaches every engine at 127.0.0.1 on the engine's ports:
a remote engine is brought there by the start command itself (`ssh -L`, `kubectl port-forward`), which then
runs in the foreground for the engine's life. The start command runs under the harness's process supervisor
(own process group, killed with the cell); `kill`, `stop`, `pause` and `resume` run each under its deadline.
An engine counts as gone when its serving port refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.worlds.real.engines import EngineFleet, NoControlApi
from harness.worlds.real.probes import http_probe, port_closed
from harness.worlds.real.processes import ManagedProcess, ProcessStartError, log_tail
from pdchaos.waiting import poll_until

SERVES = ("vllm", "fake")
_KEYS = {"serves", "ready_timeout_s", "command_timeout_s", "start", "kill", "stop", "pause", "resume"}
HEALTH_POLL_S = 0.25


class TemplateError(ValueError):
    """A command templates file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class CommandTemplates:
    start: str
    kill: str | None = None
    stop: str | None = None
    pause: str | None = None
    resume: str | None = None
    serves: str = "vllm"
    ready_timeout_s: float = 300.0
    command_timeout_s: float = 30.0
    source: str = ""

    def for_signal(self, sig: int) -> str | None:
        if sig == signal.SIGKILL:
            return self.kill
        if sig in (signal.SIGTERM, signal.SIGINT):
            return self.stop or self.kill
        if sig == signal.SIGSTOP:
            return self.pause
        if sig == signal.SIGCONT:
            return self.resume
        return None


def load_templates(path: Path) -> CommandTemplates:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not TOML, or not UTF-8 text
        raise TemplateError(f"{path}: {e}") from None
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise TemplateError(f"{path}: unknown keys {unknown} (known: {sorted(_KEYS)})")
    if not isinstance(data.get("start"), str) or not data["start"].strip():
        raise TemplateError(f"{path}: `start` (the command that starts one engine) is required")
    for key in ("kill", "stop", "pause", "resume"):
        if key in data and not isinstance(data[key], str):
            raise TemplateError(f"{path}: `{key}` must be a string")
    serves = data.get("serves", "vllm")
    if serves not in SERVES:
        raise TemplateError(f"{path}: serves must be one of {SERVES}, got {serves!r}")
    nums = {}
    for key in ("ready_timeout_s", "command_timeout_s"):
        if key in data:
            v = data[key]
            if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
                raise TemplateError(f"{path}: {key} must be a positive number")
            nums[key] = float(v)
    t = CommandTemplates(start=data["start"], kill=data.get("kill"), stop=data.get("stop"),
                         pause=data.get("pause"), resume=data.get("resume"), serves=serves,
                         source=str(path), **nums)
    try:  # every placeholder must be known: a typo is said now, not when a fault fires
        for text in (t.start, t.kill, t.stop, t.pause, t.resume):
            if text:
                text.format(**_sample_values())
    except (KeyError, IndexError, ValueError) as e:
        raise TemplateError(f"{path}: bad placeholder {e}") from None
    return t


def _sample_values() -> dict[str, str]:
    names = ("name", "role", "kv_role", "index", "host", "http_port", "grpc_port", "nixl_port",
             "bootstrap_port", "control_port", "connector", "engine_id", "generation", "run_dir", "python",
             "records", "transfer_timeout_s", "kv_abort_timeout_s", "load_failure_policy")
    return {n: "x" for n in names}


@dataclass
class CommandFleet(EngineFleet):
    """The topology's engines, each started and faulted by the templates."""

    kind = "command"

    templates: CommandTemplates = field(default_factory=lambda: CommandTemplates(start="false"))
    engine_ids: dict[str, str] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    _pending: dict[str, asyncio.Task[bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ready_timeout_s = max(self.ready_timeout_s, self.templates.ready_timeout_s)

    def has_control(self) -> bool:
        return False

    @property
    def text_known(self) -> bool:
        return self.templates.serves == "fake"

    def control(self, name: str, timeout_s: float = 5.0) -> Any:
        raise NoControlApi(f"{name} is driven by command templates: it has no fault control API")

    def values(self, name: str) -> dict[str, str]:
        spec = self.topo.engine(name)
        raw = {
            "name": spec.name, "role": spec.role, "index": spec.index, "host": spec.host,
            "kv_role": "kv_producer" if spec.role == "prefill" else "kv_consumer",
            "http_port": spec.http_port, "grpc_port": spec.grpc_port, "nixl_port": spec.nixl_port,
            "bootstrap_port": spec.bootstrap_port, "control_port": spec.control_port,
            "connector": self.topo.connector, "engine_id": self.engine_ids.get(name, ""),
            "generation": self.generations.get(name, 0), "run_dir": self.out_dir / "engines",
            "python": sys.executable, "records": self.records_file(name),
        }
        per = self.settings.for_engine(name)
        for key in ("transfer_timeout_s", "kv_abort_timeout_s", "load_failure_policy"):
            raw[key] = per.get(key, "")
        return {k: shlex.quote(str(v)) for k, v in raw.items()}

    def argv(self, name: str, first_start: bool = True) -> list[str]:
        return ["/bin/sh", "-c", self.templates.start.format(**self.values(name))]

    async def start(self, name: str, first_start: bool = True) -> ManagedProcess:
        (self.out_dir / "engines").mkdir(parents=True, exist_ok=True)
        self.generations[name] = self.generations.get(name, 0) + 1
        self.engine_ids[name] = f"{name}-g{self.generations[name]}-{uuid.uuid4().hex[:8]}"
        proc = await self.supervisor.spawn(name, self.argv(name, first_start))
        proc = TemplateProcess.adopt(proc, self, name)
        self.procs[name] = proc
        self.paused.discard(name)
        url = f"{self.topo.engine(name).http_url}/health"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        while loop.time() < deadline:
            if await http_probe(url, 2.0) == "ok:200":
                proc.ready_info = await self.state(name)
                return proc
            if not proc.alive and proc.returncode != 0:
                break
            await asyncio.sleep(HEALTH_POLL_S)
        tail = " | ".join(log_tail(proc.log_path).strip().splitlines()[-5:])
        waited = self.ready_timeout_s - max(0.0, deadline - loop.time())
        why = (f"its start command failed (exit {proc.returncode}) after {waited:.1f} s"
               if not proc.alive and proc.returncode != 0
               else f"did not serve within {self.ready_timeout_s:g} s")
        raise ProcessStartError(f"engine {name} (command template): {why}: {tail}",
                                name, proc.log_path, proc.returncode)

    async def state(self, name: str) -> dict[str, Any] | None:
        health = await http_probe(f"{self.topo.engine(name).http_url}/health", 1.0)
        if health in ("refused",) or health.startswith("error"):
            return None
        return {"engine_id": self.engine_ids.get(name), "generation": self.generations.get(name, 0),
                "serving": health == "ok:200", "health": health, "faults": {}, "engine": "command"}

    def is_paused(self, name: str) -> bool:
        return name in self.paused

    def run_template(self, name: str, sig: int) -> bool:
        """Start the template for this signal in the background (False: the file has none)."""
        text = self.templates.for_signal(sig)
        if text is None:
            return False
        task = asyncio.get_running_loop().create_task(self._run(name, sig, text.format(**self.values(name))))
        self._pending[name] = task
        return True

    async def _run(self, name: str, sig: int, cmd: str) -> bool:
        log = self.out_dir / "engines" / f"{name}.commands.log"
        with open(log, "ab") as fh:  # noqa: ASYNC230 - a local log file
            fh.write(f"$ {cmd}\n".encode())
            fh.flush()
            proc = await asyncio.create_subprocess_shell(cmd, stdout=fh, stderr=fh, start_new_session=True)
            code: int | None = None
            try:
                code = await asyncio.wait_for(proc.wait(), self.templates.command_timeout_s)
            except TimeoutError:
                pass
            finally:
                if proc.returncode is None:
                    # Past its time, or the run is cancelled: the whole group (the shell and what it
                    # started, an ssh or a kubectl) goes, not only the shell.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), 5.0)
            fh.write(f"# exit {code}\n".encode())
        ok = code == 0
        if ok and sig == signal.SIGSTOP:
            self.paused.add(name)
        elif ok and sig == signal.SIGCONT:
            self.paused.discard(name)
        return ok

    async def settle(self, name: str) -> bool | None:
        """Wait (bounded) for the engine's last template command; its success (None: none ran)."""
        task = self._pending.pop(name, None)
        if task is None:
            return None
        return await task

    async def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()


class TemplateProcess(ManagedProcess):
    """An engine's start command as a process the fault actions can signal: each signal runs its template
    (the local start process is signalled only when the file has no template for it)."""

    fleet: CommandFleet
    engine: str

    @classmethod
    def adopt(cls, proc: ManagedProcess, fleet: CommandFleet, engine: str) -> TemplateProcess:
        new = cls(name=proc.name, pid=proc.pid, argv=proc.argv, log_path=proc.log_path,
                  ready_info=proc.ready_info, marker=proc.marker, _proc=proc._proc)
        new.fleet, new.engine = fleet, engine
        return new

    def signal(self, sig: int) -> bool:
        if self.fleet.run_template(self.engine, sig):
            return True
        return super().signal(sig)

    async def wait(self, timeout_s: float) -> int | None:
        """Once the last template command ended and the engine's port refuses: the start command's exit
        code (0 when it had detached), else None after timeout_s."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        pending = self.fleet._pending.get(self.engine)
        if pending is not None:
            await asyncio.wait({pending}, timeout=timeout_s)
        port = self.fleet.topo.engine(self.engine).http_port
        gone = await poll_until(lambda: port_closed(port), max(0.0, end - loop.time()))
        if not gone:
            return None
        local = await super().wait(max(0.05, min(2.0, end - loop.time())))
        return local if local is not None else 0
