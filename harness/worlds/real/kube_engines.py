"""Engines as pods on a Kubernetes cluster (`--engines k8s:FILE`, or `[engines.NAME] backend = "k8s"` in a
sweep): the real world's session, router and load, with each engine a pod behind its own Service.

The router under test and the harness run outside the cluster and reach every engine at a node's address
and its Service's node ports (or a LoadBalancer's address): the topology the router is given is made
from the Services once they exist (`prepare`). Engine-to-engine KV traffic stays inside the cluster (a
NIXL prefill advertises its pod IP; a Mooncake bootstrap address is the prefill's node port).

Faults are cluster actions (`harness.kube.faults`), carried out through the official client:
- SIGKILL / SIGTERM (crash, process restart, graceful stop): the signal goes to the engine process
  through exec; the pod's shell stays (manifests.engine_script), so the harness reads the engine's
  provenance records from the pod, then deletes it. A respawn is a new pod: a new pod IP and a new engine
  id behind the same Service address.
- SIGSTOP / SIGCONT: through exec, to the engine process.
- Protocol faults, control-mode wedges and restarts: the fake engines' control API, through the
  control port's node port (the `pdchaos-fake` preset; a vLLM pod has none).
- Link faults: a Toxiproxy sidecar in the engine's pod (`kube_links`), through the API server's service
  proxy. A link no sidecar can stand in front of (a Mooncake side channel: its port moves) would need a
  NetworkPolicy, which the cluster world does not run yet: such a cell is not applicable, with the reason.

Every object of a cell carries the cell's label and is deleted by it when the cell ends, on every exit
path (`close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.kube import manifests as m
from harness.kube.faults import ClusterAction, create_pod, proxiable, read_records, signal_engine
from harness.kube.options import KubeOptions, parse_options
from harness.kube.presets import BOOTSTRAP_PORT, GRPC_PORT, NIXL_PORT
from harness.scenario.links import LinkRef
from harness.topology import EngineSpec, Topology
from harness.worlds.real.engines import EngineFleet, NoControlApi
from harness.worlds.real.probes import http_probe, port_closed
from harness.worlds.real.processes import ManagedProcess
from pdchaos.waiting import poll_until

# Wait and exec polls against the API server.
POLL_S = 0.1
# An engine told to stop gracefully (SIGTERM) gets this long before it is killed.
STOP_GRACE_S = 30.0
EXEC_TIMEOUT_S = 30.0


class KubeFleetError(RuntimeError):
    """The cluster refused a step of the cell, or did not finish it in time."""


def load_backend_file(path: Path) -> dict[str, Any]:
    """An engines file for `--engines k8s:FILE`: the `[engines.NAME]` table of a sweep, as a TOML file of
    its own (`backend = "k8s"` optional), or the same table as a JSON object in a `.json` file (what a sweep
    writes for its cells' replay commands); ValueError naming every problem."""
    import json
    import tomllib

    try:
        text = path.read_text(encoding="utf-8")
        table = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as e:  # ValueError: not TOML/JSON, or not UTF-8 text
        raise ValueError(f"{path}: {e}") from e
    if not isinstance(table, dict):
        raise ValueError(f"{path}: not a table of engine settings")
    if table.pop("backend", "k8s") != "k8s":
        raise ValueError(f"{path}: backend must be \"k8s\"")
    parse_options(table)
    return table


def connect(options: Any) -> Any:
    """A client of the cluster `options` name (its kubeconfig read; nothing sent yet); KubeFleetError saying
    how to get one when there is none."""
    from harness.kube.cluster import KubeCluster

    try:
        return KubeCluster(options, None, poll_s=POLL_S)
    except Exception as e:  # no kubeconfig, a bad context, no client: say how to get one
        raise KubeFleetError(
            f"no cluster to reach ({type(e).__name__}: {_short(e)}): set kubeconfig (and context) in the "
            "engines table or KUBECONFIG; no cluster at hand? python -m harness.kube.fake_cluster --root DIR "
            "--kubeconfig DIR/kubeconfig") from e


def cluster_problem(table: Mapping[str, Any]) -> str | None:
    """Why the cluster an engines table names cannot be reached (its kubeconfig unread), None when it can:
    what `run --engines k8s:FILE` and a cluster sweep say before any cell starts."""
    try:
        connect(parse_options(dict(table)))
    except KubeFleetError as e:
        return str(e)
    return None


class _Respawned:
    """A respawned engine does not replay its first start's loading time (as on loopback)."""

    def __init__(self, settings: Any) -> None:
        self._settings = settings

    def for_engine(self, name: str) -> dict[str, Any]:
        return {**self._settings.for_engine(name), "load_time_s": 0.0}


@dataclass
class KubeFleet(EngineFleet):
    """The topology's engines as pods, each behind its own Service."""

    kind = "k8s"

    table: Mapping[str, Any] = field(default_factory=dict)
    cluster: Any = None  # a harness.kube.cluster.KubeCluster (made from the options when None)
    options: KubeOptions | None = None
    ctx: m.CellContext | None = None
    paused: set[str] = field(default_factory=set)
    generations: dict[str, int] = field(default_factory=dict)
    kept_records: list[dict[str, Any]] = field(default_factory=list)
    _pending: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    _prepared: bool = False
    _node: str | None = None

    # ------------------------------------------------------------ the cell's objects

    def cell_context(self) -> m.CellContext:
        assert self.ctx is not None, "prepare() first"
        return self.ctx

    async def do(self, action: ClusterAction) -> Any:
        try:
            return await asyncio.to_thread(self.cluster.apply, action)
        except Exception as e:
            raise KubeFleetError(f"{action.describe()}: {type(e).__name__}: {_short(e)}") from e

    async def prepare(self, links: Sequence[LinkRef] = ()) -> Topology:
        """Create the cell's Secret and Services; the topology the router and the harness use (each
        engine at its Service's outside address). `links`: the links the timeline faults, each served
        through a Toxiproxy sidecar in its engine's pod."""
        options = parse_options(dict(self.table))
        if options.router != "outside":
            raise KubeFleetError("the cluster world runs the router on the harness's host: set router = "
                                 "\"outside\" and service_type = \"NodePort\" or \"LoadBalancer\"")
        if options.preset.kind != "fake":
            raise KubeFleetError(f"engine preset {options.preset.name}: the cluster world runs the "
                                 "pdchaos-fake preset (a vLLM pod has no control API and keeps no records "
                                 "yet)")
        if self.cluster is None:
            self.cluster = await asyncio.to_thread(connect, options)
        # Unique per cell run (the token is): concurrent cells and runs share a namespace.
        cell = "pdc-" + hashlib.sha256(f"{self.token}|{self.out_dir}".encode()).hexdigest()[:8]
        options = replace(options, control_token_secret=f"{cell}-control")
        self.options = options
        proxied = frozenset((r.engine, r.link) for r in links
                            if proxiable(options, self.topo.connector, r.link))
        self.ctx = m.CellContext(cell, self.out_dir.name, options, self.topo.connector,
                                 self.topo.transport, proxied, engine_settings=self.settings, seed=self.seed)
        self._prepared = True
        try:
            await asyncio.to_thread(self._ensure_namespace)
            await asyncio.to_thread(self._create_secret)
        except Exception as e:
            raise KubeFleetError(f"namespace {self.ctx.namespace}: {type(e).__name__}: {_short(e)}") from e
        specs = []
        for spec in self.topo.engines:
            svc = m.engine_service(self.ctx, spec.name)
            svc["spec"]["type"] = options.service_type
            made = await self.do(ClusterAction("apply", self.ctx.name(spec.name), "Service", body=svc))
            specs.append(await asyncio.to_thread(self._outside_spec, spec, made))
        self.topo = replace(self.topo, engines=tuple(specs))
        return self.topo

    def _ensure_namespace(self) -> None:
        ns = self.cell_context().namespace
        try:
            self.cluster.core.read_namespace(ns)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise
            self.cluster.core.create_namespace(m.namespace(ns))

    def _create_secret(self) -> None:
        ctx = self.cell_context()
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": ctx.options.control_token_secret, "namespace": ctx.namespace,
                             "labels": m.labels(ctx, "control-token")},
                "stringData": {"token": self.token or ""}}
        self.cluster.core.create_namespaced_secret(ctx.namespace, body)

    def _node_address(self) -> str:
        assert self.options is not None
        if self.options.node_address:
            return self.options.node_address
        if self._node is None:
            self._node = self._first_node_address()
        return self._node

    def _first_node_address(self) -> str:
        for node in self.cluster.core.list_node().items:
            addresses = {a.type: a.address for a in (node.status.addresses or ())}
            for kind in ("ExternalIP", "InternalIP"):
                if addresses.get(kind):
                    return str(addresses[kind])
        raise KubeFleetError("no node has an address to reach NodePort Services at (set node_address)")

    def _outside_spec(self, spec: EngineSpec, made: Any) -> EngineSpec:
        """The engine as seen from outside: a node's address and node ports, or a load balancer's."""
        ports = {p.name: p for p in made.spec.ports}
        if self.cell_context().options.service_type == "LoadBalancer":
            host = self._load_balancer_address(made.metadata.name)
            number = {name: p.port for name, p in ports.items()}
        else:
            host = self._node_address()
            number = {name: p.node_port for name, p in ports.items()}
        return replace(spec, host=host, http_port=number["http"], grpc_port=number.get("grpc", GRPC_PORT),
                       control_port=number.get("control", spec.control_port),
                       bootstrap_port=number.get("bootstrap", BOOTSTRAP_PORT), nixl_port=NIXL_PORT)

    def _load_balancer_address(self, name: str) -> str:
        import time

        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            svc = self.cluster.core.read_namespaced_service(name, self.cell_context().namespace)
            for ingress in (svc.status.load_balancer.ingress or ()) if svc.status.load_balancer else ():
                if ingress.ip or ingress.hostname:
                    return str(ingress.ip or ingress.hostname)
            time.sleep(1.0)
        raise KubeFleetError(f"service {name} got no load balancer address within 120 s")

    def network(self, refs: list[LinkRef], seed: int) -> Any:
        from harness.worlds.real.kube_links import KubeLinks

        return KubeLinks(refs, self)

    # ------------------------------------------------------------ engines

    async def start(self, name: str, first_start: bool = True) -> ManagedProcess:
        ctx = self.cell_context()
        if not first_start:
            ctx = replace(ctx, engine_settings=_Respawned(self.settings))
        self.generations[name] = self.generations.get(name, 0) + 1
        (self.out_dir / "engines").mkdir(parents=True, exist_ok=True)
        for action in create_pod(ctx, name):
            if action.verb == "wait":
                action = replace(action, params={**action.params,
                                                 "timeout_s": self.ready_timeout_s
                                                 + self.settings.load_time(name) * first_start})
            await self.do(action)
        self.paused.discard(name)
        proc = PodProcess(name=name, pid=-1, argv=["pod", ctx.name(name)],
                          log_path=self.out_dir / "engines" / f"{name}.pod{self.generations[name]}.log")
        proc.fleet, proc.engine = self, name
        proc.ready_info = await self.state(name)
        self.procs[name] = proc
        return proc

    def control(self, name: str, timeout_s: float = 5.0) -> Any:
        if self.options is not None and self.options.preset.kind != "fake":
            raise NoControlApi(f"{name} runs {self.options.preset.name}: no fault control API")
        return super().control(name, timeout_s)

    def is_paused(self, name: str) -> bool:
        return name in self.paused

    def signal_pod(self, name: str, sig: int) -> bool:
        """Start carrying the signal out on the cluster (in the background, like a signal's delivery)."""
        self._pending[name] = asyncio.get_running_loop().create_task(self._deliver(name, sig))
        return True

    async def _deliver(self, name: str, sig: int) -> bool:
        ctx = self.cell_context()
        try:
            if sig in (signal.SIGSTOP, signal.SIGCONT):
                word = "STOP" if sig == signal.SIGSTOP else "CONT"
                await self.do(signal_engine(ctx, name, word))
                (self.paused.add if sig == signal.SIGSTOP else self.paused.discard)(name)
                return True
            if sig in (signal.SIGKILL, signal.SIGTERM):
                await self.do(signal_engine(ctx, name, "KILL" if sig == signal.SIGKILL else "TERM"))
                self.paused.discard(name)
                await self._wait_engine_exit(name, 5.0 if sig == signal.SIGKILL else STOP_GRACE_S)
            await self._remove_pod(name)
            return True
        except KubeFleetError as e:
            _log(self.out_dir, f"{name}: {e}")
            return False

    async def _wait_engine_exit(self, name: str, grace_s: float) -> None:
        """Until the engine's serving port refuses (the process is gone); SIGKILL after grace_s."""
        spec = self.topo.engine(name)
        port = spec.serving_port(self.topo.transport)
        if not await poll_until(lambda: port_closed(port, spec.host), grace_s, interval_s=0.05):
            await self.do(signal_engine(self.cell_context(), name, "KILL"))
            await poll_until(lambda: port_closed(port, spec.host), 5.0, interval_s=0.05)

    async def _remove_pod(self, name: str) -> None:
        """Read the engine's records and log, then delete its pod at once and wait until it is gone."""
        ctx = self.cell_context()
        await self._keep_records(name)
        await self._keep_log(name)
        pod = ctx.name(name)
        await self.do(ClusterAction("delete", pod, "Pod", params={"grace_period_seconds": 0}))
        await self.do(ClusterAction("wait", pod, "Pod", params={"until": "deleted", "timeout_s": 60}))
        self.paused.discard(name)

    async def _keep_records(self, name: str) -> None:
        for action in read_records(self.cell_context(), name):
            try:
                text = await asyncio.wait_for(asyncio.to_thread(self._exec_stdout, action), EXEC_TIMEOUT_S)
            except Exception as e:  # the pod may be gone already: its records with it (said in the log)
                _log(self.out_dir, f"{name}: records not read: {type(e).__name__}: {_short(e)}")
                continue
            for line in text.splitlines():
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if isinstance(doc, dict):
                        self.kept_records.append(doc)

    def _exec_stdout(self, action: ClusterAction) -> str:
        out, err, code = self.cluster.exec_in(action.target, action.params.get("container"),
                                              list(action.command), EXEC_TIMEOUT_S)
        if code != 0:
            raise KubeFleetError(f"{action.describe()}: exit {code}: {err.strip()[-300:]}")
        return out

    async def _keep_log(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None:
            return
        ctx = self.cell_context()
        try:
            text = await asyncio.to_thread(self.cluster.core.read_namespaced_pod_log, ctx.name(name),
                                           ctx.namespace, container=m.ENGINE_CONTAINER)
        except Exception as e:
            text = f"(log not read: {type(e).__name__}: {_short(e)})\n"
        proc.log_path.write_text(str(text), encoding="utf-8")

    async def state(self, name: str) -> dict[str, Any] | None:
        if self.options is not None and self.options.preset.kind != "fake":
            health = await http_probe(f"{self.topo.engine(name).http_url}/health", 1.0)
            return None if health == "refused" else {"health": health, "engine": "k8s"}
        return await super().state(name)

    async def settle(self, name: str) -> bool | None:
        task = self._pending.pop(name, None)
        return None if task is None else await task

    async def stop_all(self) -> None:
        """The cell is over: every engine's records are read and its pod deleted."""
        for task in list(self._pending.values()):
            with contextlib.suppress(Exception):
                await task
        self._pending.clear()
        live = [n for n, p in self.procs.items() if isinstance(p, PodProcess) and not p.gone]
        for name in live:
            with contextlib.suppress(KubeFleetError):
                await self.do(signal_engine(self.cell_context(), name, "CONT"))
        await asyncio.gather(*(self._remove_quietly(n) for n in live))

    async def _remove_quietly(self, name: str) -> None:
        try:
            await self._remove_pod(name)
        except KubeFleetError as e:
            _log(self.out_dir, f"{name}: {e}")
        proc = self.procs.get(name)
        if isinstance(proc, PodProcess):
            proc.gone = True

    async def close(self) -> None:
        """Every object of the cell goes, by its label, whatever happened before."""
        for task in list(self._pending.values()):
            task.cancel()
        if not self._prepared or self.cluster is None:
            return
        ctx = self.cell_context()
        with contextlib.suppress(Exception):
            await self.do(ClusterAction("delete", f"-l {m.CELL_LABEL}={ctx.cell_id}",
                                         "Pod,Service,NetworkPolicy", params={"grace_period_seconds": 0}))
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.cluster.core.delete_namespaced_secret,
                                    ctx.options.control_token_secret, ctx.namespace)

    def records(self) -> list[dict[str, Any]]:
        # Grouped by engine, each in the order it wrote them (as the loopback records files are).
        return sorted(self.kept_records, key=lambda r: str(r.get("engine", "")))


class PodProcess(ManagedProcess):
    """An engine pod as the fault actions see a process: a signal becomes its cluster action."""

    fleet: KubeFleet
    engine: str
    gone: bool = False

    @property
    def returncode(self) -> int | None:
        return 0 if self.gone else None

    def signal(self, sig: int) -> bool:
        if self.gone:
            return False
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self.gone = True
        return self.fleet.signal_pod(self.engine, sig)

    async def wait(self, timeout_s: float) -> int | None:
        """Once the signal's cluster actions are done and the pod is gone: 0 (None after timeout_s)."""
        pending = self.fleet._pending.get(self.engine)
        if pending is not None:
            done, _ = await asyncio.wait({pending}, timeout=timeout_s)
            if not done:
                return None
        return 0 if self.gone else None


def _short(e: Exception) -> str:
    text = str(getattr(e, "reason", "") or e)
    body = getattr(e, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError):
            text = json.loads(body).get("message", text)
    return text.strip().splitlines()[0][:300] if text.strip() else type(e).__name__


def _log(out_dir: Path, line: str) -> None:
    path = out_dir / "engines" / "cluster.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def not_runnable(table: Mapping[str, Any], scenario: Any, connector: str, transport: str) -> str | None:
    """Why the cluster world cannot run this cell faithfully (None: it can)."""
    from harness.kube.plan import unsupported
    from harness.scenario.links import is_network_action

    try:
        options = parse_options(dict(table))
    except ValueError as e:
        return f"engines on a cluster: {e}"
    if options.router != "outside":
        return ("engines on a cluster: the cluster world runs the router on the harness's host "
                "(router = \"outside\", service_type NodePort or LoadBalancer)")
    if options.preset.kind != "fake":
        return (f"engines on a cluster: preset {options.preset.name} is planned and dry-run only; the "
                "cluster world runs the pdchaos-fake preset")
    for step in scenario.timeline:
        link = getattr(step.action, "link", None)
        if is_network_action(step.action) and link is not None and not proxiable(options, connector, link):
            return (f"engines on a cluster: step {step.name!r} faults the {link} link, which only a "
                    "NetworkPolicy can cut here; the cluster world does not run NetworkPolicy faults yet "
                    "(`pdchaos sweep FILE --dry-run` shows it)")
    why = unsupported(scenario, connector, transport, table)
    return None if why is None else f"engines on a cluster: {why}"
