"""Cluster actions carried out through the official client (`kubernetes`, imported when a cluster is used).

Blocking calls, like the client itself: an asyncio caller runs `apply` in a worker thread. HTTP calls to a
sidecar's or an engine's API go through the API server's service proxy
(`/api/v1/namespaces/NS/services/NAME:PORT/proxy/PATH`), so the harness needs no route into the
cluster's network for them.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from harness.kube.faults import ClusterAction
from harness.kube.options import KubeOptions
from harness.kube.schema import kube_client

POLL_S = 1.0
EXEC_TIMEOUT_S = 30.0
# (connect, read) seconds for an API call that names no timeout of its own: the client's default is to wait
# forever, and an API server (or its service proxy to a sidecar) that accepts and never answers would hang
# the run in a thread no cancel reaches. A read that times out is not tried again (`bound_requests`).
API_TIMEOUT_S = (5.0, 60.0)
# fake_engines.control.TOKEN_HEADER (not imported: the cluster side needs none of the engine's code).
CONTROL_TOKEN_HEADER = "X-Pdchaos-Control-Token"


class ClusterError(RuntimeError):
    """An action the cluster refused or that did not finish in time."""


class KubeCluster:
    def __init__(self, options: KubeOptions, api_client: Any = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S) -> None:
        client = kube_client()
        if api_client is None:
            from kubernetes import config

            configuration = client.Configuration()
            config.load_kube_config(config_file=options.kubeconfig, context=options.context,
                                    client_configuration=configuration)
            api_client = client.ApiClient(configuration)
        self.options = options
        bound_requests(api_client, API_TIMEOUT_S)
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        # `kubernetes.stream.stream` swaps its ApiClient's request method for a websocket one while it
        # runs: exec gets an ApiClient of its own, one exec at a time, so that no other call in another
        # thread goes out as a websocket handshake.
        self._exec_core = client.CoreV1Api(client.ApiClient(api_client.configuration))
        self._exec_lock = threading.Lock()
        self._sleep = sleep
        self._clock = clock
        self._poll_s = poll_s
        self._tokens: dict[str, str] = {}

    @property
    def namespace(self) -> str:
        return self.options.namespace

    def apply(self, action: ClusterAction) -> Any:
        """Carry out one action; returns what the API answered (exec: the command's output)."""
        handler = getattr(self, f"do_{action.verb.replace('-', '_')}", None)
        if handler is None:
            raise ClusterError(f"no way to carry out {action.verb!r} on a cluster: {action.describe()}")
        return handler(action)

    # ------------------------------------------------------------ verbs

    def do_apply(self, a: ClusterAction) -> Any:
        body = dict(a.body or {})
        if a.kind == "Pod":
            return self.core.create_namespaced_pod(self.namespace, body)
        if a.kind == "Service":
            return self.core.create_namespaced_service(self.namespace, body)
        if a.kind == "NetworkPolicy":
            return self.net.create_namespaced_network_policy(self.namespace, body)
        if a.kind == "Namespace":
            return self.core.create_namespace(body)
        raise ClusterError(f"cannot create a {a.kind}")

    def do_delete(self, a: ClusterAction) -> Any:
        grace = a.params.get("grace_period_seconds")
        kw = {} if grace is None else {"grace_period_seconds": grace}
        if a.target.startswith("-l "):
            selector = a.target[3:]
            self.core.delete_collection_namespaced_pod(self.namespace, label_selector=selector, **kw)
            self.net.delete_collection_namespaced_network_policy(self.namespace, label_selector=selector)
            # Services have a collection delete only in recent API servers: one by one works everywhere.
            for svc in self.core.list_namespaced_service(self.namespace, label_selector=selector).items:
                self.core.delete_namespaced_service(svc.metadata.name, self.namespace)
            return None
        try:
            if a.kind == "Pod":
                return self.core.delete_namespaced_pod(a.target, self.namespace, **kw)
            if a.kind == "Service":
                return self.core.delete_namespaced_service(a.target, self.namespace)
            if a.kind == "NetworkPolicy":
                return self.net.delete_namespaced_network_policy(a.target, self.namespace)
        except Exception as e:
            if _status(e) == 404:  # already gone: a heal of a cut that was never made
                return None
            raise
        raise ClusterError(f"cannot delete a {a.kind}")

    def do_wait(self, a: ClusterAction) -> None:
        until = a.params.get("until")
        deadline = self._clock() + float(a.params.get("timeout_s", 60))
        while True:
            try:
                pod = self.core.read_namespaced_pod(a.target, self.namespace)
            except Exception as e:
                if _status(e) == 404 and until == "deleted":
                    return
                raise
            if until == "ready" and _ready(pod):
                return
            if until == "ready" and getattr(pod.status, "phase", None) in ("Failed", "Succeeded"):
                raise ClusterError(f"pod {a.target} ended ({pod.status.phase}) before it was ready")
            if self._clock() >= deadline:
                raise ClusterError(f"pod {a.target} not {until} within {a.params.get('timeout_s')} s")
            self._sleep(self._poll_s)

    def do_exec(self, a: ClusterAction) -> str:
        """The command's stdout; ClusterError when it exits non-zero (its stderr in the message)."""
        out, err, code = self.exec_in(a.target, a.params.get("container"), list(a.command),
                                      float(a.params.get("timeout_s", EXEC_TIMEOUT_S)))
        if code != 0:
            raise ClusterError(f"{a.describe()}: exit {code}: {err.strip()[-300:]}")
        return out

    def exec_in(self, pod: str, container: str | None, command: list[str], timeout_s: float = EXEC_TIMEOUT_S
                ) -> tuple[str, str, int | None]:
        """Run a command in a pod's container: its stdout, stderr and exit code."""
        from kubernetes.stream import stream

        with self._exec_lock:
            resp = stream(self._exec_core.connect_get_namespaced_pod_exec, pod, self.namespace,
                          command=command, container=container, stderr=True, stdin=False, stdout=True,
                          tty=False, _preload_content=False, _request_timeout=timeout_s)
            try:
                resp.run_forever(timeout=timeout_s)
                return resp.read_stdout() or "", resp.read_stderr() or "", resp.returncode
            finally:
                resp.close()

    def do_sleep(self, a: ClusterAction) -> None:
        self._sleep(float(a.params.get("seconds", 0)))

    def do_http(self, a: ClusterAction) -> Any:
        """An engine's or sidecar's API, through the API server's service proxy."""
        url = urlsplit(a.target)
        host = url.hostname or ""
        service = host.split(".", 1)[0]
        body = dict(a.body or {})
        addressed = [k for k in ("listen", "upstream")
                     if isinstance(body.get(k), str) and "$(POD_IP)" in body[k]]
        if addressed:
            pod_ip = self.core.read_namespaced_pod(service, self.namespace).status.pod_ip
            for k in addressed:
                body[k] = body[k].replace("$(POD_IP)", pod_ip)
        path = f"/api/v1/namespaces/{self.namespace}/services/{service}:{url.port}/proxy{url.path}"
        method = a.params.get("method", "POST")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        secret = a.params.get("bearer_secret")
        if secret:
            # The API server keeps `Authorization` for itself: the engine's token goes in its own header.
            headers[CONTROL_TOKEN_HEADER] = self._secret_token(str(secret))
        if hasattr(self.api, "param_serialize"):
            return self.api.call_api(*self.api.param_serialize(
                method=method, resource_path=path, body=body or None, header_params=headers,
                auth_settings=["BearerToken"]))
        # Clients generated before the pydantic models take the call in one go.
        return self.api.call_api(path, method, header_params=headers, body=body or None,
                                 auth_settings=["BearerToken"], _preload_content=False)

    def _secret_token(self, name: str) -> str:
        """Key `token` of the Secret `name` (read once per cell)."""
        if name not in self._tokens:
            data = self.core.read_namespaced_secret(name, self.namespace).data or {}
            if "token" not in data:
                raise ClusterError(f"secret {self.namespace}/{name} has no key 'token' (the fake engines' "
                                   "control token: kubectl create secret generic NAME "
                                   "--from-literal=token=...)")
            self._tokens[name] = base64.b64decode(data["token"]).decode()
        return self._tokens[name]

    def do_router(self, a: ClusterAction) -> None:
        """Worker API calls are the router adapter's, as on loopback: nothing to do on the cluster."""
        return None


def bound_requests(api_client: Any, timeout: tuple[float, float]) -> None:
    """Give every request of `api_client` that sets no `_request_timeout` this one (once per client), and
    try a read that timed out no second time: urllib3 would try an idempotent call four times, so one
    silent API server would cost four read timeouts."""
    rest = getattr(api_client, "rest_client", None)
    request = getattr(rest, "request", None)
    if request is None or getattr(request, "pdchaos_bounded", False):
        return
    pools = getattr(getattr(rest, "pool_manager", None), "connection_pool_kw", None)
    if isinstance(pools, dict):
        import urllib3

        # Connections refused or reset are still retried (an API server restarting); reads are not.
        pools["retries"] = urllib3.Retry(total=3, read=0)

    def bounded(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("_request_timeout"):
            kwargs["_request_timeout"] = timeout
        return request(*args, **kwargs)

    bounded.pdchaos_bounded = True  # type: ignore[attr-defined]
    rest.request = bounded


def _status(e: Exception) -> int | None:
    return getattr(e, "status", None)


def _ready(pod: Any) -> bool:
    for cond in getattr(pod.status, "conditions", None) or ():
        if cond.type == "Ready" and cond.status == "True":
            return True
    return False
