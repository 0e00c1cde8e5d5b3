"""The manifests of one cell on a cluster, as plain dicts (what `kubectl apply -f` takes as JSON).

Every object of a cell carries the label `pdchaos.io/cell=<cell id>` (so one label selector finds and
deletes all of it) and the cell's full key as an annotation. Engines are bare Pods with
`restartPolicy: Never`: the harness decides when an engine comes back (a crashed engine stays down until
the scenario respawns it), as it does on loopback. Each engine has its own Service, whose address is what
the router is given: a pod that is deleted and created again gets a new pod IP and a new engine id
behind the same Service address, which is what "restarted on the same address" means on a cluster.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from fake_engines.core.calls import CALLER_HEADER, HARNESS
from harness.kube.options import KubeOptions
from harness.kube.presets import (
    BOOTSTRAP_PORT,
    CONTROL_PORT,
    GRPC_PORT,
    HTTP_PORT,
    NIXL_PORT,
    PROXY_OFFSET,
    TOXIPROXY_API_PORT,
)

Manifest = dict[str, Any]
CELL_LABEL = "pdchaos.io/cell"
ENGINE_LABEL = "pdchaos.io/engine"
KEY_ANNOTATION = "pdchaos.io/cell-key"
# A pod-private emptyDir: the engine's PID file and its provenance records (kept across a container
# restart, read through exec before the pod is deleted).
RUN_DIR = "/var/run/pdchaos"
RUN_VOLUME = "pdchaos-run"
PID_FILE = f"{RUN_DIR}/engine.pid"
RECORDS_FILE = f"{RUN_DIR}/records.jsonl"
ENGINE_CONTAINER = "engine"
PROXY_CONTAINER = "toxiproxy"
ROUTER_PORT = 8000


@dataclass(frozen=True)
class CellContext:
    """What every manifest of one cell needs to know."""

    cell_id: str
    key_label: str
    options: KubeOptions
    connector: str
    transport: str
    # (engine, link) pairs served through the engine's Toxiproxy sidecar.
    proxied: frozenset[tuple[str, str]] = frozenset()
    transfer_timeout_s: float | None = None
    # The scenario's `EngineSettings`: a fake engine pod gets them as flags, as a loopback engine does.
    # None: only the transfer timeout is passed.
    engine_settings: Any = None
    seed: int | None = None

    @property
    def namespace(self) -> str:
        return self.options.namespace

    def name(self, engine: str) -> str:
        return f"{self.cell_id}-{engine}"

    def host(self, engine: str) -> str:
        return f"{self.name(engine)}.{self.namespace}.svc.cluster.local"

    def has_sidecar(self, engine: str) -> bool:
        return any(e == engine for e, _ in self.proxied)


def role_of(engine: str) -> str:
    return engine.split("-", 1)[0]


def labels(ctx: CellContext, component: str, engine: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "pdchaos",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "pdchaos",
        CELL_LABEL: ctx.cell_id,
    }
    if engine is not None:
        out[ENGINE_LABEL] = engine
        out["pdchaos.io/role"] = role_of(engine)
        # llm-d's schedulers tell the two kinds of pods apart by this label.
        out["llm-d.ai/role"] = role_of(engine)
    return out


def _meta(ctx: CellContext, name: str, component: str, engine: str | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": ctx.namespace, "labels": labels(ctx, component, engine),
            "annotations": {KEY_ANNOTATION: ctx.key_label}}


def namespace(name: str) -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "pdchaos"}}}


# ---------------------------------------------------------------- engines


def engine_ports(ctx: CellContext, engine: str) -> dict[str, int]:
    """The engine container's named ports."""
    role = role_of(engine)
    ports = {"http": HTTP_PORT}
    if ctx.options.preset.kind == "fake":
        ports |= {"grpc": GRPC_PORT, "control": CONTROL_PORT}
    if ctx.connector == "mooncake" and role == "prefill":
        ports["bootstrap"] = BOOTSTRAP_PORT
    if ctx.connector == "nixl":
        ports["nixl"] = NIXL_PORT
    return ports


def kv_transfer_config(connector: str, role: str) -> dict[str, str]:
    if connector == "nixl":
        return {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    return {"kv_connector": "MooncakeConnector",
            "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}


def engine_script(argv: list[str]) -> str:
    """The engine under a small shell (PID 1 of the container).

    - It keeps the engine's PID in a file, so that a fault signals the engine itself (a container's PID 1
      ignores signals it has no handler for when they come from inside the container, SIGSTOP included).
    - Deleting the pod (SIGTERM) stops the engine cleanly.
    - An engine that ends by itself (crashed, killed, drained) leaves the shell, and so the pod and its
      files, in place: the harness reads the engine's records through exec, then deletes the pod.

    `$POD_IP` is the shell's: the pod's address, from the environment."""
    words = " ".join('"$POD_IP"' if w == "$POD_IP" else shlex.quote(w) for w in argv)
    return (f"gone=0; trap 'gone=1; kill -TERM \"$child\" 2>/dev/null' TERM INT; {words} & child=$!; "
            f"echo \"$child\" > {PID_FILE}; code=0; "
            f"while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; code=$?; done; "
            f"while [ \"$gone\" = 0 ]; do sleep 1 & wait $!; done; exit \"$code\"")


def _vllm_argv(ctx: CellContext, engine: str) -> list[str]:
    p = ctx.options.preset
    kv = json.dumps(kv_transfer_config(ctx.connector, role_of(engine)), separators=(",", ":"))
    return ["vllm", "serve", p.model, "--host", "0.0.0.0", "--port", str(HTTP_PORT),
            "--kv-transfer-config", kv, *p.args]


def _fake_argv(ctx: CellContext, engine: str) -> list[str]:
    role = role_of(engine)
    args = ["pdchaos-engine", "--name", engine, "--role", role, "--connector", ctx.connector,
            # The pod IP: what the engine advertises to its peers (NIXL remote_host, Mooncake worker_addr).
            "--host", "$POD_IP", "--in-pod", "--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT),
            "--control-port", str(CONTROL_PORT), "--records", RECORDS_FILE]
    if ctx.connector == "mooncake" and role == "prefill":
        args += ["--bootstrap-port", str(BOOTSTRAP_PORT)]
    if ctx.connector == "nixl":
        args += ["--nixl-port", str(NIXL_PORT)]
        if (engine, "side_channel") in ctx.proxied:
            args += ["--advertise-side-channel-port", str(proxied_port(NIXL_PORT))]
    if ctx.engine_settings is not None:
        from harness.worlds.real.engines import setting_args

        args += setting_args(ctx.engine_settings.for_engine(engine), ctx.seed)
    elif ctx.transfer_timeout_s is not None:
        args += ["--transfer-timeout-s", f"{ctx.transfer_timeout_s:g}"]
    return args + list(ctx.options.preset.args)


def _engine_env(ctx: CellContext, engine: str) -> list[dict[str, Any]]:
    p = ctx.options.preset
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if p.kind == "vllm" and ctx.connector == "nixl":
        # The side channel must be reachable from the decodes' pods: the pod IP, not localhost.
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    if p.kind == "fake":
        env.append({"name": "PDCHAOS_CONTROL_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": ctx.options.control_token_secret, "key": "token"}}})
    env += [{"name": k, "value": v} for k, v in sorted(p.env.items())]
    if p.kind == "vllm" and ctx.options.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": ctx.options.hf_token_secret, "key": "token"}}})
    return env


def _resources(ctx: CellContext) -> dict[str, Any]:
    p = ctx.options.preset
    requests: dict[str, str] = {"cpu": p.cpu, "memory": p.memory}
    limits: dict[str, str] = {"memory": p.memory}
    if p.gpus:
        requests["nvidia.com/gpu"] = str(p.gpus)
        limits["nvidia.com/gpu"] = str(p.gpus)
    return {"requests": requests, "limits": limits}


def _health_get() -> dict[str, Any]:
    # The kubelet's probes are the harness's, not the router's (the engine's call records tell them apart).
    return {"path": "/health", "port": "http", "httpHeaders": [{"name": CALLER_HEADER, "value": HARNESS}]}


def _probes(ctx: CellContext) -> dict[str, Any]:
    vllm = ctx.options.preset.kind == "vllm"
    ready = {"httpGet": _health_get(), "periodSeconds": 5 if vllm else 1, "failureThreshold": 1}
    out: dict[str, Any] = {"readinessProbe": ready}
    if vllm:
        # Loading weights takes minutes; readiness alone would have the kubelet give up on a healthy start.
        out["startupProbe"] = {"httpGet": _health_get(), "periodSeconds": 5,
                               "failureThreshold": max(1, int(ctx.options.ready_timeout_s // 5))}
    return out


def engine_pod(ctx: CellContext, engine: str, refuse_s: float | None = None) -> Manifest:
    """The engine's pod; `refuse_s`: a slow start (an init container keeps it unready, so its Service has
    no endpoint and connections to it are refused, for that long)."""
    p = ctx.options.preset
    ports = engine_ports(ctx, engine)
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": p.image,
        "env": _engine_env(ctx, engine),
        "ports": [{"name": n, "containerPort": v, "protocol": "TCP"} for n, v in ports.items()],
        "resources": _resources(ctx),
        **_probes(ctx),
    }
    argv = _vllm_argv(ctx, engine) if p.kind == "vllm" else _fake_argv(ctx, engine)
    container["command"] = ["/bin/sh", "-c", engine_script(argv)]
    mounts = [{"name": RUN_VOLUME, "mountPath": RUN_DIR}]
    volumes: list[dict[str, Any]] = [{"name": RUN_VOLUME, "emptyDir": {}}]
    if p.shm:
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": p.shm}})
    container["volumeMounts"] = mounts
    containers = [container]
    if ctx.has_sidecar(engine):
        containers.append(_proxy_sidecar(ctx))
    spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                            "containers": containers, "volumes": volumes}
    if ctx.options.node_selector:
        spec["nodeSelector"] = dict(ctx.options.node_selector)
    if refuse_s:
        spec["initContainers"] = [{"name": "slow-start", "image": p.image,
                                   "command": ["sleep", f"{refuse_s:g}"]}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(ctx, ctx.name(engine), "engine", engine),
            "spec": spec}


def _proxy_sidecar(ctx: CellContext) -> dict[str, Any]:
    return {
        "name": PROXY_CONTAINER,
        "image": ctx.options.toxiproxy_image,
        "args": ["-host=0.0.0.0", f"-port={TOXIPROXY_API_PORT}"],
        "ports": [{"name": "toxiproxy", "containerPort": TOXIPROXY_API_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
    }


def proxied_port(port: int) -> int:
    return port + PROXY_OFFSET


def link_port(ctx: CellContext, engine: str, link: str) -> int:
    """The engine's own port behind a link."""
    if link == "bootstrap":
        return BOOTSTRAP_PORT
    if link == "side_channel":
        return NIXL_PORT
    return HTTP_PORT if ctx.transport == "http" else GRPC_PORT


def engine_service(ctx: CellContext, engine: str) -> Manifest:
    """The address the router is given. A link served through the sidecar targets the proxy's port."""
    own = engine_ports(ctx, engine)
    ports = []
    for name, port in own.items():
        if name == "nixl":
            continue  # the side channel is reached on the pod IP the engine advertises, not through here
        link = {"http": "serve", "grpc": "serve", "bootstrap": "bootstrap"}.get(name)
        serving = link == "serve" and link_port(ctx, engine, "serve") == port
        proxied = (link == "bootstrap" or serving) and (engine, link) in ctx.proxied
        ports.append({"name": name, "port": port, "targetPort": proxied_port(port) if proxied else port,
                      "protocol": "TCP"})
    if ctx.has_sidecar(engine):
        ports.append({"name": "toxiproxy", "port": TOXIPROXY_API_PORT, "targetPort": TOXIPROXY_API_PORT,
                      "protocol": "TCP"})
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(ctx, ctx.name(engine), "engine", engine),
            # Not-ready pods stay behind the address: the router under test, not the Service, judges an
            # engine's health (a 503 /health must reach it as a 503, not as a refused connection).
            "spec": {"type": "ClusterIP", "selector": {CELL_LABEL: ctx.cell_id, ENGINE_LABEL: engine},
                     "publishNotReadyAddresses": True, "ports": ports}}


# ---------------------------------------------------------------- the router


def router_pod(ctx: CellContext, image: str, argv: list[str]) -> Manifest:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": _meta(ctx, ctx.name("router"), "router"),
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "router", "image": image, "args": argv,
                "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
                "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1},
                "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
            }],
            **({"nodeSelector": dict(ctx.options.node_selector)} if ctx.options.node_selector else {}),
        },
    }


def router_service(ctx: CellContext) -> Manifest:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(ctx, ctx.name("router"), "router"),
            "spec": {"type": ctx.options.service_type,
                     "selector": {CELL_LABEL: ctx.cell_id, "app.kubernetes.io/component": "router"},
                     "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http",
                                "protocol": "TCP"}]}}


# ---------------------------------------------------------------- link cuts


def cut_policy(ctx: CellContext, engine: str, link: str) -> Manifest:
    """A NetworkPolicy that closes one link of an engine: ingress to the engine's pod stays open on every
    port but the link's. (Only the ports left open are listed: a policy can allow, not deny.) Packets to
    the closed port are dropped, so a connection attempt waits rather than being refused. A Mooncake side
    channel has no fixed port (it moves on every start): cutting it leaves open only the pod's named
    ports."""
    if link == "side_channel" and ctx.connector == "mooncake":
        named = {*engine_ports(ctx, engine).values(), TOXIPROXY_API_PORT}
        ranges = [(p, p) for p in sorted(named)]
    else:
        closed = {link_port(ctx, engine, link)}
        if link == "serve" and ctx.options.preset.kind == "fake":
            closed = {HTTP_PORT, GRPC_PORT}
        ranges = _open_ranges(closed)
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(ctx, f"{ctx.name(engine)}-cut-{link.replace('_', '-')}", "fault", engine),
        "spec": {
            "podSelector": {"matchLabels": {CELL_LABEL: ctx.cell_id, ENGINE_LABEL: engine}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": lo, **({"endPort": hi} if hi != lo else {})}
                                   for lo, hi in ranges]}],
        },
    }


def _open_ranges(closed: set[int]) -> list[tuple[int, int]]:
    out = []
    lo = 1
    for port in sorted(closed):
        if port > lo:
            out.append((lo, port - 1))
        lo = port + 1
    if lo <= 65535:
        out.append((lo, 65535))
    return out
