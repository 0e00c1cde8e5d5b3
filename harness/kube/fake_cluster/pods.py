"""A pod as the fake kubelet keeps it: its containers' states, and the status it posts from them.

`render_status` computes phase, conditions and container statuses from the containers alone, so the
status is always the same function of what the processes are doing (no incremental edits to drift).
Conditions keep their lastTransitionTime while their value stays.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.kube.fake_cluster import containers as cfg
from harness.kube.fake_cluster.procs import killpg
from harness.kube.fake_cluster.store import invalid, rfc3339

Obj = dict[str, Any]


@dataclass
class ContainerRun:
    spec: Obj
    init: bool
    log_path: Path
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    ready: bool = False
    started: bool = False
    proc: asyncio.subprocess.Process | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    paths: cfg.PathMap = field(default_factory=lambda: cfg.PathMap({}))
    cwd: Path = Path("/")
    probes: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and "running" in self.state

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])

    def status(self) -> Obj:
        out = {"name": self.name, "image": str(self.spec.get("image", "")), "imageID": "",
               "ready": self.ready, "restartCount": 0, "started": self.started, "state": self.state,
               "lastState": {}}
        if self.proc is not None:
            out["containerID"] = f"fake://{self.proc.pid}"
        return out


class PodRuntime:
    def __init__(self, obj: Obj, pod_dir: Path) -> None:
        self.obj = obj
        self.dir = pod_dir
        self.tmp = pod_dir / "tmp"
        spec = obj["spec"]
        logs = pod_dir / "logs"
        self.init = [ContainerRun(c, True, logs / f"{c['name']}.log")
                     for c in spec.get("initContainers") or ()]
        self.app = [ContainerRun(c, False, logs / f"{c['name']}.log") for c in spec["containers"]]
        self.failure: tuple[str, str] | None = None
        self.deleting = False
        # Set on deletion and when a Secret changes: wakes a container waiting for its configuration.
        self.wake = asyncio.Event()
        self.kill_now = asyncio.Event()
        self.kill_timer: asyncio.TimerHandle | None = None
        self.exec_groups: set[int] = set()
        self.lifecycle: asyncio.Task[None] | None = None
        self.deletion: asyncio.Task[None] | None = None
        self.transitions: dict[str, tuple[str, str]] = {}

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def ip(self) -> str:
        return str(self.obj["status"]["podIP"])

    @property
    def containers(self) -> list[ContainerRun]:
        return self.init + self.app

    def container(self, name: str) -> ContainerRun | None:
        return next((c for c in self.containers if c.name == name), None)

    def live_processes(self) -> list[asyncio.subprocess.Process]:
        return [c.proc for c in self.containers if c.proc is not None and c.proc.returncode is None]

    def signal_all(self, sig: int) -> None:
        for proc in self.live_processes():
            killpg(proc.pid, sig)
        for pgid in list(self.exec_groups):
            killpg(pgid, sig)

    def arm_kill(self, grace: float) -> None:
        if self.kill_timer is not None:
            self.kill_timer.cancel()
        self.kill_timer = asyncio.get_running_loop().call_later(grace, self.kill_now.set)


def validate_pod(obj: Obj) -> None:
    """What the real API server rejects with 422 before a pod is stored."""
    name = obj["metadata"]["name"]
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not spec.get("containers"):
        raise invalid("Pod", name, "spec.containers: Required value")
    volumes = {v.get("name") for v in spec.get("volumes") or ()}
    seen: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or ()):
            where = f"spec.{group}[{i}]"
            if not isinstance(c, dict) or not c.get("name"):
                raise invalid("Pod", name, f"{where}.name: Required value")
            if not c.get("image"):
                raise invalid("Pod", name, f"{where}.image: Required value")
            if c["name"] in seen:
                raise invalid("Pod", name, f'{where}.name: Duplicate value: "{c["name"]}"')
            seen.add(c["name"])
            for j, m in enumerate(c.get("volumeMounts") or ()):
                if m.get("name") not in volumes:
                    raise invalid("Pod", name,
                                  f'{where}.volumeMounts[{j}].name: Not found: "{m.get("name")}"')
                if not str(m.get("mountPath", "")).startswith("/"):
                    raise invalid("Pod", name, f"{where}.volumeMounts[{j}].mountPath: Required value")


def phase(rt: PodRuntime) -> str:
    """restartPolicy Never's phases: Failed once anything failed for good, Pending until the init
    containers are done and an app container runs, Succeeded or Failed once all have exited."""
    if rt.failure is not None or any((c.exit_code or 0) != 0 for c in rt.init):
        return "Failed"
    if any(c.exit_code is None for c in rt.init):
        return "Pending"
    codes = [c.exit_code for c in rt.app]
    if all(code is not None for code in codes):
        return "Succeeded" if all(code == 0 for code in codes) else "Failed"
    return "Running" if any(c.running for c in rt.app) else "Pending"


def _condition(rt: PodRuntime, kind: str, value: bool, reason: str = "", message: str = "") -> Obj:
    status = "True" if value else "False"
    prev = rt.transitions.get(kind)
    if prev is None or prev[0] != status:
        rt.transitions[kind] = prev = (status, rfc3339())
    out: Obj = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": prev[1]}
    if not value and reason:
        out.update(reason=reason, message=message)
    return out


def render_status(rt: PodRuntime) -> None:
    """Write the pod's status from what its containers are doing, as the kubelet posts it."""
    st = rt.obj["status"]
    st["phase"] = phase(rt)
    init_done = all(c.exit_code == 0 for c in rt.init)
    unready = [c.name for c in rt.app if not c.ready]
    ready = not unready and not rt.deleting and st["phase"] == "Running"
    not_ready = f"containers with unready status: [{' '.join(unready)}]"
    st["conditions"] = [
        _condition(rt, "PodScheduled", True),
        _condition(rt, "Initialized", init_done, "ContainersNotInitialized",
                   "containers with incomplete status: "
                   f"[{' '.join(c.name for c in rt.init if c.exit_code != 0)}]"),
        _condition(rt, "ContainersReady", not unready, "ContainersNotReady", not_ready),
        _condition(rt, "Ready", ready, "ContainersNotReady" if unready else "PodTerminating",
                   not_ready if unready else "the pod is being deleted"),
    ]
    st["containerStatuses"] = [c.status() for c in rt.app]
    if rt.init:
        st["initContainerStatuses"] = [c.status() for c in rt.init]
    if rt.failure is not None:
        st["reason"], st["message"] = rt.failure
