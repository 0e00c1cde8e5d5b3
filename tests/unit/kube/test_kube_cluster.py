"""The cluster backend's actions through the official client, against recorded API interactions: the
client's own HTTP layer is replaced by a recorder that answers as an API server would, so each action is
checked as the request (method, path, body) that reaches the server."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from urllib.parse import unquote

import pytest

pytest.importorskip("kubernetes", reason="the cluster backend needs the kubernetes client")

from kubernetes import client

from harness.kube.cluster import API_TIMEOUT_S, ClusterError, KubeCluster
from harness.kube.faults import ClusterAction, actions_for
from harness.kube.options import parse_options
from harness.kube.plan import context
from harness.scenario import Crash, Respawn, load_scenarios
from harness.scenario.links import Partition

OPTIONS = parse_options({"preset": "vllm-nixl-gpu", "namespace": "ns"})


class _Answer:
    """What urllib3 would hand the client."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.reason = "OK" if status < 400 else "Error"
        self.data = json.dumps(body).encode()
        self.headers = {"content-type": "application/json"}

    def getheaders(self) -> dict[str, str]:
        return self.headers

    def getheader(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)

    def read(self) -> bytes:
        return self.data


class Recorder:
    """Stands in for the client's REST layer: records every request, answers from `script`."""

    def __init__(self, script: list[tuple[int, Any]] | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.script = list(script or [])

    def request(self, method: str, url: str, headers: Any = None, body: Any = None, **_: Any) -> Any:
        from kubernetes.client.rest import RESTResponse

        self.calls.append((method, url.split("://", 1)[-1].split("/", 1)[-1], body))
        status, answer = self.script.pop(0) if self.script else (200, {})
        resp = RESTResponse(_Answer(status, answer))
        if status >= 400:
            raise client.ApiException(http_resp=resp)
        return resp


def _json(body: Any) -> Any:
    return json.loads(body) if isinstance(body, str | bytes) else body


def cluster(script: list[tuple[int, Any]] | None = None) -> tuple[KubeCluster, Recorder]:
    api = client.ApiClient(client.Configuration(host="https://cluster.test"))
    rec = Recorder(script)
    api.rest_client = rec  # type: ignore[assignment]
    clock = iter(range(10_000))
    return KubeCluster(OPTIONS, api, sleep=lambda s: None, clock=lambda: float(next(clock))), rec


def ctx():
    (s,) = load_scenarios(["prefill_link_partitioned"])
    return context(s, "k", "nixl", "http", OPTIONS)


def _pod(ready: bool, phase: str = "Running") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "status": {"phase": phase, "podIP": "10.0.0.7",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_a_crash_kills_the_engine_reads_its_records_then_deletes_the_pod_at_once() -> None:
    c = ctx()
    kube, rec = cluster([(200, {}), (200, _pod(True)), (404, {"kind": "Status", "code": 404})])
    acts = actions_for(Crash("prefill-0"), c)
    execs = [a for a in acts if a.verb == "exec"]
    assert acts.index(execs[-1]) < [a.verb for a in acts].index("delete")
    # Exec goes over a websocket (tests/integration/kube/test_fake_cluster.py): the rest is recorded here.
    for a in acts:
        if a.verb != "exec":
            kube.apply(a)
    (method, path, _), *polls = rec.calls
    path, _, query = path.partition("?")
    assert (method, path) == ("DELETE", f"api/v1/namespaces/ns/pods/{c.name('prefill-0')}")
    assert "gracePeriodSeconds=0" in query
    assert [m for m, _, _ in polls] == ["GET", "GET"]


def test_a_respawn_creates_the_pod_from_its_manifest_and_waits_until_ready() -> None:
    c = ctx()
    kube, rec = cluster([(201, _pod(False)), (200, _pod(False)), (200, _pod(True))])
    for a in actions_for(Respawn("prefill-0"), c):
        kube.apply(a)
    method, path, body = rec.calls[0]
    assert (method, path) == ("POST", "api/v1/namespaces/ns/pods")
    assert body["metadata"]["name"] == c.name("prefill-0")
    assert body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert len(rec.calls) == 3


def test_a_pod_that_ends_before_it_is_ready_is_an_error() -> None:
    kube, _ = cluster([(200, _pod(False, phase="Failed"))])
    with pytest.raises(ClusterError, match="ended"):
        kube.apply(ClusterAction("wait", "p", "Pod", params={"until": "ready", "timeout_s": 5}))


def test_a_link_cut_goes_to_the_sidecar_through_the_api_servers_service_proxy() -> None:
    c = ctx()
    kube, rec = cluster()
    (down,) = actions_for(Partition("prefill-1", "serve", "down"), c)
    kube.apply(down)
    method, path, body = rec.calls[0]
    assert method == "POST"
    assert path == f"api/v1/namespaces/ns/services/{c.name('prefill-1')}:8474/proxy/proxies/prefill-1.serve"
    assert _json(body) == {"enabled": False}


def test_the_sidecars_proxy_is_created_with_the_pods_own_address() -> None:
    c = ctx()
    kube, rec = cluster([(200, _pod(True)), (201, {})])
    setup = next(a for a in actions_for(Respawn("prefill-1"), c) if a.verb == "http")
    kube.apply(setup)
    assert rec.calls[0][:2] == ("GET", f"api/v1/namespaces/ns/pods/{c.name('prefill-1')}")
    assert _json(rec.calls[1][2])["upstream"] == "10.0.0.7:8000"


def test_a_cell_is_torn_down_by_its_label() -> None:
    services = {"items": [{"metadata": {"name": "svc-a"}}]}
    kube, rec = cluster([(200, {}), (200, {}), (200, services), (200, {})])
    kube.apply(ClusterAction("delete", "-l pdchaos.io/cell=pdc-1", "Pod,Service,NetworkPolicy",
                             params={"grace_period_seconds": 0}))
    assert [(m, p.split("?")[0]) for m, p, _ in rec.calls] == [
        ("DELETE", "api/v1/namespaces/ns/pods"),
        ("DELETE", "apis/networking.k8s.io/v1/namespaces/ns/networkpolicies"),
        ("GET", "api/v1/namespaces/ns/services"),
        ("DELETE", "api/v1/namespaces/ns/services/svc-a"),
    ]
    assert all("pdchaos.io" in unquote(p.partition("?")[2]) and "pdc-1" in p for _, p, _ in rec.calls[:3])


def test_an_action_with_no_cluster_meaning_is_refused() -> None:
    kube, _ = cluster()
    with pytest.raises(ClusterError, match="no way to carry out"):
        kube.apply(ClusterAction("teleport", "x"))


def test_a_control_call_carries_the_engine_token_from_its_secret_past_the_api_server() -> None:
    """The API server's service proxy keeps `Authorization` for itself: the fake engine's token is read from
    the cell's Secret once and sent in the engine's own token header."""
    import base64

    from harness.scenario import Wedge

    opts = parse_options({"preset": "pdchaos-fake", "namespace": "ns", "control_token_secret": "ctl"})
    (s,) = load_scenarios(["wedged_decode_generate"])
    c = context(s, "k", "mooncake", "grpc", opts)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ctl"},
              "data": {"token": base64.b64encode(b"s3cret").decode()}}
    api = client.ApiClient(client.Configuration(host="https://cluster.test"))
    seen: list[Any] = []

    class HeaderRecorder(Recorder):
        def request(self, method: str, url: str, headers: Any = None, body: Any = None, **kw: Any) -> Any:
            seen.append(dict(headers or {}))
            return super().request(method, url, headers, body, **kw)

    rec = HeaderRecorder([(200, secret), (200, {}), (200, {})])
    api.rest_client = rec  # type: ignore[assignment]
    kube = KubeCluster(opts, api, sleep=lambda s: None)
    (wedge,) = actions_for(Wedge("decode-0", surface="generate"), c)
    kube.apply(wedge)
    kube.apply(wedge)
    assert rec.calls[0][:2] == ("GET", "api/v1/namespaces/ns/secrets/ctl")
    assert [m for m, _, _ in rec.calls].count("GET") == 1  # read once
    assert seen[1]["X-Pdchaos-Control-Token"] == "s3cret" and seen[2]["X-Pdchaos-Control-Token"] == "s3cret"


def test_a_secret_without_its_token_is_a_clear_error() -> None:
    opts = parse_options({"preset": "pdchaos-fake", "namespace": "ns"})
    api = client.ApiClient(client.Configuration(host="https://cluster.test"))
    api.rest_client = Recorder([(200, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"},
                                       "data": {}})])  # type: ignore[assignment]
    kube = KubeCluster(opts, api, sleep=lambda s: None)
    with pytest.raises(ClusterError, match="has no key 'token'"):
        kube.apply(ClusterAction("http", "http://e.ns.svc.cluster.local:8002/control/clear",
                                 params={"method": "POST", "bearer_secret": "pdchaos-control"}))


def test_every_api_call_that_names_no_timeout_gets_one() -> None:
    seen: list[Any] = []

    class TimeoutRecorder(Recorder):
        def request(self, method: str, url: str, headers: Any = None, body: Any = None, **kw: Any) -> Any:
            seen.append(kw.get("_request_timeout"))
            return super().request(method, url, headers, body, **kw)

    api = client.ApiClient(client.Configuration(host="https://cluster.test"))
    api.rest_client = TimeoutRecorder([(200, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})])  # type: ignore[assignment]
    kube = KubeCluster(OPTIONS, api, sleep=lambda s: None)
    KubeCluster(OPTIONS, api, sleep=lambda s: None)  # a second cluster on the same client: wrapped once
    kube.core.read_namespaced_pod("p", "ns")
    kube.core.read_namespaced_pod("p", "ns", _request_timeout=3)
    assert seen == [API_TIMEOUT_S, 3]


def test_an_api_server_that_never_answers_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import threading

    import harness.kube.cluster as cluster_mod

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[socket.socket] = []

    def accept_and_say_nothing() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(silent.accept()[0])

    threading.Thread(target=accept_and_say_nothing, daemon=True).start()
    monkeypatch.setattr(cluster_mod, "API_TIMEOUT_S", (1.0, 0.3))
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{silent.getsockname()[1]}"))
    kube = KubeCluster(OPTIONS, api, sleep=lambda s: None)
    try:
        with pytest.raises(Exception, match=r"(?i)timed? ?out"):
            kube.core.read_namespaced_pod("p", "ns")
        assert len(accepted) == 1  # a read that timed out is not tried again on a new connection
    finally:
        silent.close()
        for s in accepted:
            s.close()
