"""Services: defaults on create, and their endpoints (what kube-proxy and the service proxy send to).

An endpoint is a pod in the Service's namespace whose labels match its selector, with condition Ready
True and no deletionTimestamp; its port is the Service port's `targetPort` (a number, or the name of one
of the pod's containerPorts; absent: the port itself). A Service without a selector has no endpoints
(there are no Endpoints objects to fill in by hand).
"""

from __future__ import annotations

import itertools
from typing import Any

from harness.kube.fake_cluster.store import Store, invalid

Obj = dict[str, Any]
NODE_PORT_TYPES = ("NodePort", "LoadBalancer")


def normalize_service(obj: Obj) -> None:
    """Defaults and checks the real API server applies to a Service's spec (not node ports: see
    NodePorts.allocate). Raises 422 for what it would reject."""
    name = obj["metadata"]["name"]
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise invalid("Service", name, "spec: Invalid value: must be an object")
    spec.setdefault("type", "ClusterIP")
    if spec["type"] not in ("ClusterIP", *NODE_PORT_TYPES):
        raise invalid("Service", name, f'spec.type: Unsupported value: "{spec["type"]}"')
    ports = spec.get("ports") or []
    if not ports:
        raise invalid("Service", name, "spec.ports: Required value")
    for i, p in enumerate(ports):
        if not isinstance(p, dict) or not isinstance(p.get("port"), int) or not 0 < p["port"] < 65536:
            raise invalid("Service", name, f"spec.ports[{i}].port: Required value")
        if len(ports) > 1 and not p.get("name"):
            raise invalid("Service", name, f"spec.ports[{i}].name: Required value")
        p.setdefault("protocol", "TCP")
        p.setdefault("targetPort", p["port"])
    spec.setdefault("sessionAffinity", "None")
    obj.setdefault("status", {"loadBalancer": {}})


def service_port(svc: Obj, ref: str | None) -> Obj | None:
    """The Service port a proxy path names (`name:PORT`: its number or name; none: the first)."""
    ports = svc["spec"]["ports"]
    if not ref:
        return ports[0]
    return next((p for p in ports if str(p["port"]) == ref or p.get("name") == ref), None)


def target_port(svc_port: Obj, pod: Obj) -> int | None:
    target = svc_port.get("targetPort", svc_port["port"])
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for c in pod.get("spec", {}).get("containers") or ():
        for p in c.get("ports") or ():
            if p.get("name") == target:
                return int(p["containerPort"])
    return None


def pod_ready(pod: Obj) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def endpoints(store: Store, svc: Obj, svc_port: Obj) -> list[tuple[str, int]]:
    """(pod IP, port) of every ready endpoint for one port of the Service, in a stable order. With
    `publishNotReadyAddresses` every pod with an address counts, ready or not, until it has ended
    (Succeeded/Failed) or is gone, as the endpoints controller does."""
    selector = svc["spec"].get("selector") or {}
    if not selector:
        return []
    any_pod = bool(svc["spec"].get("publishNotReadyAddresses"))
    out = []
    for pod in store.list("pods", svc["metadata"]["namespace"]):
        labels = pod["metadata"].get("labels") or {}
        ended = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        counts = not ended if any_pod else pod_ready(pod)
        if all(labels.get(k) == v for k, v in selector.items()) and counts:
            port = target_port(svc_port, pod)
            ip = pod.get("status", {}).get("podIP")
            if port is not None and ip:
                out.append((str(ip), port))
    return out


class RoundRobin:
    """Spreads connections over the endpoints there are at each pick, as kube-proxy spreads them."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, eps: list[tuple[str, int]]) -> tuple[str, int] | None:
        return eps[next(self._counter) % len(eps)] if eps else None
