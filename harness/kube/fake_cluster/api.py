"""The HTTP face of the fake API server: paths as the real one's, JSON in and out, errors as `Status`.

Served: discovery (`/api`, `/apis`, `/version`), core v1 namespaces, pods (with `log`, `status` and
`exec`), services (with the service proxy), secrets and nodes (one, read-only), and
networking.k8s.io/v1 networkpolicies. Verbs: create, get, list (labelSelector, fieldSelector), delete and
deletecollection. Not served (405 MethodNotAllowed or 400): update, patch, watch, port-forward.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from harness.kube.fake_cluster.execws import handle_exec
from harness.kube.fake_cluster.kubelet import NODE_NAME, Kubelet
from harness.kube.fake_cluster.proxy import ServiceProxy
from harness.kube.fake_cluster.resources import Resources
from harness.kube.fake_cluster.store import RESOURCES, ApiError, Store, bad_request, not_found, rfc3339

log = logging.getLogger(__name__)
Obj = dict[str, Any]
GIT_VERSION = "v1.31.0-pdchaos-fake"
_GROUPS = {"": ("pods", "services", "secrets"), "networking.k8s.io": ("networkpolicies",)}
_VERBS = ["create", "delete", "deletecollection", "get", "list"]
# (name, singular, kind, namespaced, verbs, short names) for the discovery lists kubectl reads.
_DISCOVERY: dict[str, list[tuple[str, str, str, bool, list[str], list[str]]]] = {
    "v1": [("namespaces", "namespace", "Namespace", False, ["create", "delete", "get", "list"], ["ns"]),
           ("nodes", "node", "Node", False, ["get", "list"], ["no"]),
           ("pods", "pod", "Pod", True, _VERBS, ["po"]),
           ("pods/exec", "", "PodExecOptions", True, ["create", "get"], []),
           ("pods/log", "", "Pod", True, ["get"], []),
           ("pods/status", "", "Pod", True, ["get"], []),
           ("secrets", "secret", "Secret", True, _VERBS, []),
           ("services", "service", "Service", True, _VERBS, ["svc"]),
           ("services/proxy", "", "ServiceProxyOptions", True,
            ["create", "delete", "get", "patch", "update"], [])],
    "networking.k8s.io/v1": [("networkpolicies", "networkpolicy", "NetworkPolicy", True, _VERBS, ["netpol"])],
}
_BOOT_TIME = rfc3339()


def _json(obj: Obj, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(obj), content_type="application/json")


def _not_served(request: web.Request) -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource "
                    f"({request.method} {request.path})")


def _method_not_allowed(request: web.Request) -> ApiError:
    return ApiError(405, "MethodNotAllowed", f"the fake cluster does not serve {request.method} on "
                    f"{request.path}")


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the body is not JSON: {e}") from e


async def _grace(request: web.Request) -> int | None:
    """gracePeriodSeconds from the query, else from a DeleteOptions body."""
    raw = request.query.get("gracePeriodSeconds")
    if raw is None:
        body = await _body(request)
        if isinstance(body, dict) and body.get("gracePeriodSeconds") is not None:
            raw = str(body["gracePeriodSeconds"])
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError as e:
        raise bad_request(f"gracePeriodSeconds must be an integer, not {raw!r}") from e


class Api:
    def __init__(self, store: Store, kubelet: Kubelet, resources: Resources, proxy: ServiceProxy,
                 node_host: str) -> None:
        self.store = store
        self.kubelet = kubelet
        self.resources = resources
        self.proxy = proxy
        self.node_host = node_host

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._route(request)
        except ApiError as e:
            return _json(e.status(), e.code)
        except Exception as e:  # a bug of the fake: answer it as the real server would a 500
            log.exception("%s %s", request.method, request.path)
            return _json(ApiError(500, "InternalError", f"the fake cluster failed: {e!r}").status(), 500)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        segs = [s for s in request.path.split("/") if s]
        match segs:
            case ["api"]:
                return _json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})
            case ["apis"]:
                gv = {"groupVersion": "networking.k8s.io/v1", "version": "v1"}
                return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                    {"name": "networking.k8s.io", "versions": [gv], "preferredVersion": gv}]})
            case ["version"]:
                return _json({"major": "1", "minor": "31", "gitVersion": GIT_VERSION, "gitCommit": "0" * 40,
                              "gitTreeState": "clean", "buildDate": _BOOT_TIME, "goVersion": "none",
                              "compiler": "none", "platform": "linux/amd64"})
            case ["api", "v1"] | ["apis", "networking.k8s.io", "v1"]:
                return _json(_resource_list("v1" if segs[0] == "api" else "networking.k8s.io/v1"))
            case ["apis", "networking.k8s.io"]:
                gv = {"groupVersion": "networking.k8s.io/v1", "version": "v1"}
                return _json({"kind": "APIGroup", "apiVersion": "v1", "name": "networking.k8s.io",
                              "versions": [gv], "preferredVersion": gv})
            case ["api", "v1", *rest]:
                return await self._group(request, "", rest)
            case ["apis", "networking.k8s.io", "v1", *rest]:
                return await self._group(request, "networking.k8s.io", rest)
        raise _not_served(request)

    async def _group(self, request: web.Request, group: str, rest: list[str]) -> web.StreamResponse:
        plurals = _GROUPS[group]
        core = group == ""
        match rest:
            case ["nodes"] if core:
                return self._read_only(request, {
                    "kind": "NodeList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": self.store.resource_version}, "items": [self.node()]})
            case ["nodes", name] if core:
                if name != NODE_NAME:
                    raise not_found("nodes", name)
                return self._read_only(request, self.node())
            case ["namespaces"] if core:
                return await self._collection(request, "namespaces", "")
            case ["namespaces", name] if core:
                return await self._item(request, "namespaces", "", name)
            case [plural] if plural in plurals:
                if request.method != "GET":
                    raise _method_not_allowed(request)
                return self._list(request, plural, None)
            case ["namespaces", ns, plural] if plural in plurals:
                return await self._collection(request, plural, ns)
            case ["namespaces", ns, plural, name] if plural in plurals:
                return await self._item(request, plural, ns, name)
            case ["namespaces", ns, "pods", name, "status"] if core:
                return self._read_only(request, self.store.get("pods", ns, name))
            case ["namespaces", ns, "pods", name, "log"] if core:
                return await self._log(request, ns, name)
            case ["namespaces", ns, "pods", name, "exec"] if core:
                if request.method not in ("GET", "POST"):
                    raise _method_not_allowed(request)
                return await handle_exec(request, self.kubelet, ns, name)
            case ["namespaces", ns, "services", ref, "proxy", *_] if core:
                return await self.proxy.handle(request, ns, ref, _raw_tail(request))
        raise _not_served(request)

    def _read_only(self, request: web.Request, obj: Obj) -> web.Response:
        if request.method != "GET":
            raise _method_not_allowed(request)
        return _json(obj)

    def _list(self, request: web.Request, plural: str, namespace: str | None) -> web.Response:
        q = request.query
        if q.get("watch", "").lower() in ("true", "1"):
            raise bad_request("the fake cluster does not serve watch: poll with list or get")
        items = self.store.list(plural, namespace, q.get("labelSelector"), q.get("fieldSelector"))
        return _json(self.store.list_object(plural, items))

    async def _collection(self, request: web.Request, plural: str, namespace: str) -> web.Response:
        if request.method == "GET":
            return self._list(request, plural, namespace if RESOURCES[plural].namespaced else None)
        if request.method == "POST":
            body = await _body(request)
            obj = await self.resources.create(plural, namespace, body, dry_run="dryRun" in request.query)
            return _json(obj, 201)
        if request.method == "DELETE" and plural != "namespaces":
            grace = await _grace(request)
            q = request.query
            return _json(self.resources.delete_collection(plural, namespace, q.get("labelSelector"),
                                                          q.get("fieldSelector"), grace))
        raise _method_not_allowed(request)

    async def _item(self, request: web.Request, plural: str, namespace: str, name: str) -> web.Response:
        if request.method == "GET":
            return _json(self.store.get(plural, namespace, name))
        if request.method == "DELETE":
            grace = await _grace(request)
            return _json(self.resources.delete(plural, namespace, name, grace))
        raise _method_not_allowed(request)

    async def _log(self, request: web.Request, namespace: str, name: str) -> web.Response:
        if request.method != "GET":
            raise _method_not_allowed(request)
        _, c = self.kubelet.target(namespace, name, request.query.get("container"), for_exec=False)
        if c.proc is None:
            reason = c.state.get("waiting", {}).get("reason", "ContainerCreating")
            raise bad_request(f'container "{c.name}" in pod "{name}" is waiting to start: {reason}')
        text = await _read_log(c.log_path)
        tail = request.query.get("tailLines")
        if tail is not None and tail.isdigit():
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail):]) if int(tail) else ""
        limit = request.query.get("limitBytes")
        if limit is not None and limit.isdigit():
            text = text.encode()[: int(limit)].decode(errors="ignore")
        return web.Response(text=text, content_type="text/plain")

    def node(self) -> Obj:
        return {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": NODE_NAME, "uid": "00000000-0000-4000-8000-000000000001",
                         "resourceVersion": "1", "creationTimestamp": _BOOT_TIME,
                         "labels": {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux"}},
            "spec": {},
            "status": {
                "addresses": [{"type": "InternalIP", "address": self.node_host},
                              {"type": "Hostname", "address": NODE_NAME}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "the fake kubelet is posting ready status",
                                "lastHeartbeatTime": rfc3339(), "lastTransitionTime": _BOOT_TIME}],
            },
        }


async def _read_log(path: Path) -> str:
    def read() -> str:
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    return await asyncio.to_thread(read)


def _resource_list(group_version: str) -> Obj:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": [
        {"name": name, "singularName": singular, "kind": kind, "namespaced": namespaced, "verbs": verbs,
         **({"shortNames": short} if short else {})}
        for name, singular, kind, namespaced, verbs, short in _DISCOVERY[group_version]]}


def _raw_tail(request: web.Request) -> str:
    """The path after `.../proxy`, still percent-encoded (the upstream sees what the client sent)."""
    raw = request.rel_url.raw_path.split("/")
    # ['', 'api', 'v1', 'namespaces', NS, 'services', REF, 'proxy', ...rest]
    return "/" + "/".join(raw[8:]) if len(raw) > 8 else "/"
