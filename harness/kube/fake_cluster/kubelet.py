"""The fake's kubelet: each pod a set of local processes, its status written back as a kubelet would.

A pod's life: admitted with a fresh loopback pod IP and its own folder under the fake's root (home and
working directory, `tmp/`, one folder per emptyDir volume, `logs/<container>.log`); init containers run
one after another, each to exit 0 (`Pending` meanwhile; one failing makes the pod `Failed`); then every
container starts (`Running`) and its probes decide when it is ready. `restartPolicy` is always treated as
`Never`: a container that exits stays terminated, and once all have exited the pod is `Succeeded` (all
exit 0) or `Failed`. A container whose Secret is missing waits with `CreateContainerConfigError` (the
pod stays `Pending`) and starts once the Secret exists. An image other than the project's own makes the
pod `Failed` with `ErrImagePull` at once, so a caller waiting for Ready fails fast.

Deletion: `deletionTimestamp` set and the pod unready at once, SIGTERM to each container's process group,
SIGKILL after the grace period (at once for 0); the object leaves the store when its last process has
been reaped. A container's leftover processes are killed when its main process exits (a container ends
with its PID 1), and so are an exec session's.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from harness.kube.fake_cluster import containers as cfg
from harness.kube.fake_cluster.pods import ContainerRun, PodRuntime, render_status
from harness.kube.fake_cluster.probes import ProbeTarget, run_probes
from harness.kube.fake_cluster.procs import exit_code, killpg, spawn
from harness.kube.fake_cluster.store import Store, bad_request, not_found, rfc3339
from pdchaos.waiting import wait_set

log = logging.getLogger(__name__)
NODE_NAME = "fake-node"
CONFIG_RETRY_S = 1.0
# After SIGKILL, how long reaping may take before the fake gives up waiting (and logs it).
REAP_DEADLINE_S = 10.0
Obj = dict[str, Any]


def _working_dir(spec: Obj, paths: cfg.PathMap, default: Path) -> Path:
    """`workingDir` translated, if that is a folder on the host (an image would create it; the host's
    filesystem is not the fake's to change); else the pod's folder."""
    workdir = spec.get("workingDir")
    if workdir:
        translated = Path(paths.translate(str(workdir)))
        if translated.is_dir():
            return translated
    return default


class Kubelet:
    def __init__(self, store: Store, root: Path, node_host: str,
                 session: Callable[[], aiohttp.ClientSession]) -> None:
        self.store = store
        self.root = root
        self.node_host = node_host
        self._session = session
        self.pods: dict[tuple[str, str], PodRuntime] = {}
        store.listeners.append(self._on_store_change)

    def _on_store_change(self, plural: str, obj: Obj) -> None:
        if plural == "secrets":
            for rt in self.pods.values():
                rt.wake.set()

    # ------------------------------------------------------------ admission

    def admit(self, obj: Obj, ip: str) -> None:
        """Take a stored pod: node, addresses, status; its processes start in a task."""
        meta, spec = obj["metadata"], obj["spec"]
        spec["nodeName"] = NODE_NAME
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        now = rfc3339()
        obj["status"] = {"phase": "Pending", "hostIP": self.node_host, "hostIPs": [{"ip": self.node_host}],
                         "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now, "qosClass": "BestEffort"}
        pod_dir = self.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        rt = PodRuntime(obj, pod_dir)
        for folder in (pod_dir / "logs", rt.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        self.pods[(rt.namespace, rt.name)] = rt
        self._render(rt)
        rt.lifecycle = asyncio.get_running_loop().create_task(self._live(rt), name=f"pod {rt.name}")

    def _cannot_run(self, rt: PodRuntime) -> str | None:
        """Why the pod fails before anything starts (bad image marks its container)."""
        for c in rt.containers:
            image = str(c.spec.get("image", ""))
            if not cfg.runnable(image):
                message = (f'the fake cluster runs only the {cfg.RUNNABLE_REPOSITORY} image '
                           f'(repository "{cfg.RUNNABLE_REPOSITORY}", e.g. pdchaos:0.1.0) and Toxiproxy\'s '
                           f'(as pdchaos-toxiproxy), not "{image}"')
                c.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
                return message
        return None

    # ------------------------------------------------------------ life

    async def _live(self, rt: PodRuntime) -> None:
        try:
            problem = self._cannot_run(rt)
            folders, vol_problem = cfg.volume_folders(rt.obj, rt.dir)
            if problem or vol_problem:
                rt.failure = ("ErrImagePull" if problem else "UnsupportedVolume", str(problem or vol_problem))
                self._render(rt)
                return
            for folder in folders.values():
                folder.mkdir(parents=True, exist_ok=True)
            for c in rt.init:
                if not await self._configure(rt, c, folders) or not await self._launch(rt, c):
                    return
                await self._watch(rt, c)
                if rt.deleting or c.exit_code != 0:
                    return
            for c in rt.app:
                if not await self._configure(rt, c, folders):
                    return
            started = [c for c in rt.app if await self._launch(rt, c)]
            await asyncio.gather(*(self._watch(rt, c) for c in started))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug of the fake: the pod fails visibly instead of hanging
            log.exception("pod %s/%s", rt.namespace, rt.name)
            rt.failure = ("InternalError", f"the fake kubelet failed: {e!r}")
            self._render(rt)
        finally:
            await self._reap(rt)

    async def _reap(self, rt: PodRuntime) -> None:
        for c in rt.containers:
            if c.probes is not None:
                c.probes.cancel()
        procs = rt.live_processes()
        for proc in procs:
            killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), REAP_DEADLINE_S)
            except TimeoutError:
                log.error("pod %s: process %d not reaped after SIGKILL", rt.name, proc.pid)

    async def _configure(self, rt: PodRuntime, c: ContainerRun, folders: dict[str, Path]) -> bool:
        """Environment and argv; waits (CreateContainerConfigError) while a Secret or key is missing."""
        paths = cfg.container_paths(c.spec, folders)
        while True:
            if rt.deleting:
                return False
            rt.wake.clear()
            try:
                own = cfg.container_env(rt.obj, c.spec, lambda n: self.store.find("secrets", rt.namespace, n))
                break
            except cfg.ConfigError as e:
                waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
                if c.state != waiting:
                    c.state = waiting
                    self._render(rt)
            await wait_set(rt.wake, CONFIG_RETRY_S)
        c.env = cfg.process_env(cfg.base_env(rt.obj, rt.dir, rt.tmp), own, paths)
        c.paths = paths
        c.argv = cfg.container_argv(c.spec, own, paths, rt.ip)
        c.cwd = _working_dir(c.spec, paths, rt.dir)
        if not c.argv:
            rt.failure = ("RunContainerError", f'container "{c.name}": the fake cluster\'s '
                          f"{cfg.RUNNABLE_REPOSITORY} image has no entrypoint: give command or args")
            c.state = {"waiting": {"reason": "RunContainerError", "message": rt.failure[1]}}
            self._render(rt)
            return False
        return True

    async def _launch(self, rt: PodRuntime, c: ContainerRun) -> bool:
        if rt.deleting:
            return False
        argv = c.argv
        try:
            with c.log_path.open("ab") as out:
                c.proc = await spawn(argv, c.env, c.cwd, out, asyncio.subprocess.STDOUT)
        except OSError as e:
            c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "finishedAt": rfc3339(),
                                      "message": f'exec: "{argv[0]}": {e.strerror or e}'}}
            if c.init:
                rt.failure = ("StartError", c.state["terminated"]["message"])
            self._render(rt)
            return False
        c.state = {"running": {"startedAt": rfc3339()}}
        if rt.deleting:  # deleted while it was being started: it must not outlive the pod
            killpg(c.proc.pid, signal.SIGKILL)
        elif not c.init:
            c.probes = asyncio.get_running_loop().create_task(self._probe(rt, c))
        self._render(rt)
        return True

    async def _probe(self, rt: PodRuntime, c: ContainerRun) -> None:
        ports = {str(p["name"]): int(p["containerPort"]) for p in c.spec.get("ports") or () if p.get("name")}

        def set_started() -> None:
            c.started = True
            self._render(rt)

        def set_ready(ready: bool) -> None:
            c.ready = ready and c.running
            self._render(rt)

        def startup_failed() -> None:
            if c.proc is not None and c.proc.returncode is None:
                killpg(c.proc.pid, signal.SIGKILL)

        target = ProbeTarget(rt.ip, ports, self._session(), functools.partial(self.run_command, rt, c))
        await run_probes(c.spec, target, set_started, set_ready, startup_failed)

    async def _watch(self, rt: PodRuntime, c: ContainerRun) -> None:
        assert c.proc is not None
        returncode = await c.proc.wait()
        killpg(c.proc.pid, signal.SIGKILL)  # what the main process left behind ends with the container
        if c.probes is not None:
            c.probes.cancel()
        code = exit_code(returncode)
        started = c.state.get("running", {}).get("startedAt")
        c.state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                  "startedAt": started, "finishedAt": rfc3339(),
                                  "containerID": f"fake://{c.proc.pid}"}}
        c.ready = False
        if c.init and code != 0:
            rt.failure = ("InitContainerFailed", f'init container "{c.name}" exited with code {code}')
        self._render(rt)

    async def run_command(self, rt: PodRuntime, c: ContainerRun, argv: list[str], timeout: float) -> int:
        """A command in the container (exec probes), output discarded; 128+9 past its timeout."""
        try:
            proc = await spawn([c.paths.translate(a) for a in argv], c.env, c.cwd,
                               asyncio.subprocess.DEVNULL, asyncio.subprocess.DEVNULL)
        except OSError:
            return 127
        rt.exec_groups.add(proc.pid)
        try:
            return exit_code(await asyncio.wait_for(proc.wait(), timeout))
        except TimeoutError:
            return 137
        finally:
            killpg(proc.pid, signal.SIGKILL)
            if proc.returncode is None:
                await proc.wait()
            rt.exec_groups.discard(proc.pid)

    # ------------------------------------------------------------ status

    def _render(self, rt: PodRuntime) -> None:
        render_status(rt)
        self.store.touch("pods", rt.obj)

    # ------------------------------------------------------------ deletion

    def delete(self, namespace: str, name: str, grace: int | None) -> Obj:
        obj = self.store.get("pods", namespace, name)
        rt = self.pods.get((namespace, name))
        if grace is None:
            grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
        grace = max(0, int(grace))
        if rt is None or rt.obj is not obj:  # not the kubelet's (cannot happen): just drop it
            self.store.remove("pods", obj)
            return obj
        meta = obj["metadata"]
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=grace)
        if rt.deleting:
            # A second delete may only shorten the grace period, as on a real API server.
            if grace < int(meta.get("deletionGracePeriodSeconds", grace + 1)):
                meta.update(deletionTimestamp=rfc3339(deadline), deletionGracePeriodSeconds=grace)
                rt.arm_kill(grace)
                self.store.touch("pods", obj)
            return obj
        rt.deleting = True
        rt.wake.set()
        meta.update(deletionTimestamp=rfc3339(deadline), deletionGracePeriodSeconds=grace)
        self._render(rt)
        rt.signal_all(signal.SIGKILL if grace == 0 else signal.SIGTERM)
        rt.arm_kill(grace)
        rt.deletion = asyncio.get_running_loop().create_task(self._terminate(rt), name=f"delete {name}")
        return obj

    async def _terminate(self, rt: PodRuntime) -> None:
        assert rt.lifecycle is not None
        killer = asyncio.get_running_loop().create_task(rt.kill_now.wait())
        try:
            # The lifecycle ends when the pod's last container process has exited.
            await asyncio.wait({rt.lifecycle, killer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            killer.cancel()
        rt.signal_all(signal.SIGKILL)
        await asyncio.wait({rt.lifecycle}, timeout=REAP_DEADLINE_S)
        if not rt.lifecycle.done():
            log.error("pod %s/%s: processes still running %.0f s after SIGKILL", rt.namespace, rt.name,
                      REAP_DEADLINE_S)
            rt.lifecycle.cancel()
        if rt.kill_timer is not None:
            rt.kill_timer.cancel()
        if self.pods.get((rt.namespace, rt.name)) is rt:
            del self.pods[(rt.namespace, rt.name)]
        self.store.remove("pods", rt.obj)

    # ------------------------------------------------------------ exec, logs, teardown

    def target(self, namespace: str, name: str, container: str | None,
               for_exec: bool) -> tuple[PodRuntime, ContainerRun]:
        """The container an exec or log request names; the API's 400s when it names none or a wrong one."""
        self.store.get("pods", namespace, name)
        rt = self.pods.get((namespace, name))
        if rt is None:
            raise not_found("pods", name)
        if container is None:
            if len(rt.app) != 1:
                names = " ".join(c.name for c in rt.containers)
                raise bad_request(f"a container name must be specified for pod {name}, "
                                  f"choose one of: [{names}]")
            container = rt.app[0].name
        c = rt.container(container)
        if c is None:
            raise bad_request(f"container {container} is not valid for pod {name}")
        if for_exec:
            phase = rt.obj["status"]["phase"]
            if phase in ("Succeeded", "Failed"):
                raise bad_request("cannot exec into a container in a completed pod; "
                                  f"current phase is {phase}")
            if not c.running:
                raise bad_request(f'cannot exec in a stopped container: container "{container}" in pod '
                                  f'"{name}" is not running')
        return rt, c

    def pod_processes(self) -> list[int]:
        # Called from other threads too (running_fake_cluster): list() copies the dict in one step.
        return [p.pid for rt in list(self.pods.values()) for p in rt.live_processes()]

    async def close(self) -> None:
        """SIGKILL every pod's processes (pods mid-deletion too) and wait for them to be reaped."""
        tasks: set[asyncio.Task[None]] = set()
        for rt in list(self.pods.values()):
            rt.deleting = True
            rt.wake.set()
            rt.kill_now.set()
            rt.signal_all(signal.SIGKILL)
            tasks |= {t for t in (rt.lifecycle, rt.deletion) if t is not None}
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=REAP_DEADLINE_S)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.pods.clear()
