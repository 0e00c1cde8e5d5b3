"""Create and delete, kind by kind: what the real API server does beyond storing the object.

Pods go to the kubelet (a pod IP, processes); Services get a ClusterIP (written in, never routed) and
node ports; Secrets have `stringData` folded into base64 `data`; NetworkPolicies are stored only, NOT
enforced (every pod can reach every other); deleting a Namespace deletes what is in it and removes the
Namespace when its last pod is gone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
from typing import Any

from harness.kube.fake_cluster.kubelet import Kubelet
from harness.kube.fake_cluster.network import ClusterIpPool, PodIpPool
from harness.kube.fake_cluster.nodeports import NodePorts
from harness.kube.fake_cluster.pods import validate_pod
from harness.kube.fake_cluster.services import NODE_PORT_TYPES, normalize_service
from harness.kube.fake_cluster.store import ApiError, Store, bad_request, not_found, rfc3339, success_status

Obj = dict[str, Any]
NAMESPACE_DRAIN_S = 120.0
_POLL_S = 0.05


def _normalize_secret(obj: Obj) -> None:
    data = dict(obj.get("data") or {})
    for key, value in (obj.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError) as e:
            raise bad_request(f"Secret data[{key!r}] is not valid base64: {e}") from e
    obj["data"] = data
    obj.setdefault("type", "Opaque")


class Resources:
    def __init__(self, store: Store, kubelet: Kubelet, node_ports: NodePorts, node_host: str) -> None:
        self.store = store
        self.kubelet = kubelet
        self.node_ports = node_ports
        self.node_host = node_host
        self.pod_ips = PodIpPool()
        self.cluster_ips = ClusterIpPool()
        self._tasks: set[asyncio.Task[None]] = set()

    def _check_namespace(self, plural: str, namespace: str) -> None:
        if plural == "namespaces":
            return
        ns = self.store.find("namespaces", "", namespace)
        if ns is None:
            raise not_found("namespaces", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f"unable to create new content in namespace {namespace} because "
                           "it is being terminated")

    async def create(self, plural: str, namespace: str, body: Obj, dry_run: bool = False) -> Obj:
        obj = self.store.prepare(plural, namespace, body)
        self._check_namespace(plural, namespace)
        name = obj["metadata"]["name"]
        if self.store.find(plural, namespace, name) is not None:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists',
                           {"name": name, "kind": plural})
        if plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        elif plural == "secrets":
            _normalize_secret(obj)
        elif plural == "pods":
            validate_pod(obj)
        elif plural == "services":
            normalize_service(obj)
        if dry_run:
            return obj
        if plural == "pods":
            ip = await self.pod_ips.allocate()
            self.store.add(plural, obj)  # may still refuse: a create of the same name raced this one
            self.kubelet.admit(obj, ip)
        elif plural == "services":
            self._add_service(obj)
        else:
            self.store.add(plural, obj)
        return obj

    def _add_service(self, obj: Obj) -> None:
        spec = obj["spec"]
        if not spec.get("clusterIP"):
            spec["clusterIP"] = self.cluster_ips.allocate()
        spec["clusterIPs"] = [spec["clusterIP"]]
        if spec["type"] in NODE_PORT_TYPES:
            spec.setdefault("externalTrafficPolicy", "Cluster")
        if spec["type"] == "LoadBalancer":
            obj["status"] = {"loadBalancer": {"ingress": [{"ip": self.node_host, "ipMode": "VIP"}]}}
        held = self.node_ports.reserve(obj)
        try:
            self.store.add("services", obj)
        except BaseException:
            for sock in held:
                sock.close()
            raise
        self.node_ports.start(obj, held)

    def delete(self, plural: str, namespace: str, name: str, grace: int | None) -> Obj:
        """The answer the real API gives to a DELETE: the object for pods, services and namespaces (they
        linger or are returned), a Success Status for the rest."""
        obj = self.store.get(plural, namespace, name)
        if plural == "pods":
            return self.kubelet.delete(namespace, name, grace)
        if plural == "namespaces":
            return self._delete_namespace(obj)
        if plural == "services":
            self.node_ports.stop(obj)
            self.store.remove(plural, obj)
            return obj
        self.store.remove(plural, obj)
        return success_status(plural, obj)

    def delete_collection(self, plural: str, namespace: str, label_selector: str | None,
                          field_selector: str | None, grace: int | None) -> Obj:
        items = self.store.list(plural, namespace, label_selector, field_selector)
        for obj in list(items):
            self.delete(plural, namespace, obj["metadata"]["name"], grace)
        return self.store.list_object(plural, items)

    def _delete_namespace(self, ns: Obj) -> Obj:
        name = ns["metadata"]["name"]
        if ns["metadata"].get("deletionTimestamp"):
            return ns
        ns["metadata"]["deletionTimestamp"] = rfc3339()
        ns["status"] = {"phase": "Terminating"}
        self.store.touch("namespaces", ns)
        for plural in ("pods", "services", "secrets", "networkpolicies"):
            for obj in self.store.list(plural, name):
                with contextlib.suppress(ApiError):
                    self.delete(plural, name, obj["metadata"]["name"], None)
        task = asyncio.get_running_loop().create_task(self._drain_namespace(ns))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return ns

    async def _drain_namespace(self, ns: Obj) -> None:
        deadline = time.monotonic() + NAMESPACE_DRAIN_S
        while self.store.list("pods", ns["metadata"]["name"]) and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        self.store.remove("namespaces", ns)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
