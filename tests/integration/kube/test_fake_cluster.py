"""The fake cluster (harness/kube/fake_cluster) driven by the official client, as the cluster backend
drives a real one: pods as local processes on their own loopback IPs, exec, logs, node ports, the
service proxy, deletion, errors, selectors, teardown and the command line."""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the fake cluster is driven with the official client")

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from harness.kube.fake_cluster import FakeCluster, running_fake_cluster
from harness.kube.fake_cluster.__main__ import READY_PREFIX, main
from harness.worlds.real.processes import pids_in_group

IMAGE = "pdchaos:0.1.0"
PY = sys.executable
WEB = "web"
# Writes what the container was given into its emptyDir, then serves its folder on the pod IP.
WEB_SCRIPT = ('echo "$POD_IP $TOKEN" > /data/x; echo started; '
              'exec "$PY" -m http.server --bind "$POD_IP" 8000')


@dataclass
class Kube:
    api: client.ApiClient
    core: client.CoreV1Api
    net: client.NetworkingV1Api
    fc: FakeCluster | None = None


def connect(url: str, fc: FakeCluster | None = None) -> Kube:
    api = client.ApiClient(client.Configuration(host=url))
    return Kube(api, client.CoreV1Api(api), client.NetworkingV1Api(api), fc)


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    with running_fake_cluster(tmp_path_factory.mktemp("fake-cluster")) as fc:
        k = connect(fc.url, fc)
        yield k
        k.api.close()
    assert fc.pod_processes() == []


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def pod(name: str, script: str, labels: dict[str, str] | None = None, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c", script], **container}]}}


HTTP_PROBE = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}


def web_pod(name: str, probe: dict[str, Any] = HTTP_PROBE) -> dict[str, Any]:
    manifest = pod(name, WEB_SCRIPT, {"app": name},
                   env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
                        {"name": "PY", "value": PY}],
                   ports=[{"name": "http", "containerPort": 8000}],
                   volumeMounts=[{"name": "data", "mountPath": "/data"}],
                   readinessProbe=probe)
    manifest["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    return manifest


def is_ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())


def wait_ready(k: Kube, name: str, ns: str) -> Any:
    return wait_for(lambda: (p := k.core.read_namespaced_pod(name, ns)) and is_ready(p) and p,
                    f"{name} ready")


def gone(k: Kube, name: str, ns: str) -> bool:
    try:
        k.core.read_namespaced_pod(name, ns)
    except ApiException as e:
        return e.status == 404
    return False


def http_get(host: str, port: int, path: str = "/") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def node_port_answers(port: int) -> bool:
    try:
        return http_get("127.0.0.1", port)[0] == 200
    except OSError:
        return False


def node_port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def setup_namespace(k: Kube, ns: str, token: str = "s3cret") -> None:
    k.core.create_namespace({"metadata": {"name": ns}})
    k.core.create_namespaced_secret(ns, {"metadata": {"name": "tok"}, "stringData": {"token": token}})


def node_port_service(k: Kube, name: str, ns: str) -> int:
    svc = k.core.create_namespaced_service(ns, {
        "metadata": {"name": name},
        "spec": {"type": "NodePort", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}})
    assert svc.spec.cluster_ip.startswith("10.96.")
    return int(svc.spec.ports[0].node_port)


@pytest.fixture(scope="module")
def web(kube: Kube) -> Any:
    setup_namespace(kube, "t1")
    kube.core.create_namespaced_pod("t1", web_pod(WEB))
    return wait_ready(kube, WEB, "t1")


def test_pod_runs_with_its_ip_env_volume_probe_exec_and_log(kube: Kube, web: Any) -> None:
    ip = web.status.pod_ip
    assert ip.startswith("127.0.") and ip != "127.0.0.1"
    assert web.status.host_ip == "127.0.0.1" and web.spec.node_name == "fake-node"
    assert web.status.phase == "Running" and web.status.container_statuses[0].ready
    out = stream(kube.core.connect_get_namespaced_pod_exec, WEB, "t1", command=["cat", "/data/x"],
                 container="main", stderr=True, stdin=False, stdout=True, tty=False)
    assert out == f"{ip} s3cret\n"
    assert "started" in kube.core.read_namespaced_pod_log(WEB, "t1", container="main")
    # The volume is the pod's folder: the server (serving its working directory) shows it too.
    status, body = http_get(ip, 8000, "/volumes/data/x")
    assert status == 200 and body.decode() == f"{ip} s3cret\n"


def test_node_port_and_service_proxy_reach_the_pod(kube: Kube, web: Any) -> None:
    port = node_port_service(kube, WEB, "t1")
    assert wait_for(lambda: node_port_answers(port), "node port answers", 5)
    for ref in ("web:8000", "web:http", "web"):
        resp = kube.api.call_api(*kube.api.param_serialize(
            method="GET", resource_path=f"/api/v1/namespaces/t1/services/{ref}/proxy/volumes/data/x"))
        resp.read()
        assert resp.status == 200 and resp.data.decode() == f"{web.status.pod_ip} s3cret\n"
    # Method and body go through, and the upstream's status comes back (http.server has no POST: 501).
    resp = kube.api.call_api(*kube.api.param_serialize(
        method="POST", resource_path="/api/v1/namespaces/t1/services/web:8000/proxy/x?a=1", body={"k": 1},
        header_params={"Content-Type": "application/json"}))
    resp.read()
    assert resp.status == 501
    lb = kube.core.create_namespaced_service("t1", {"metadata": {"name": "lb"}, "spec": {
        "type": "LoadBalancer", "selector": {"app": WEB}, "ports": [{"port": 80, "targetPort": 8000}]}})
    assert lb.status.load_balancer.ingress[0].ip == "127.0.0.1"
    assert wait_for(lambda: node_port_answers(lb.spec.ports[0].node_port), "load balancer answers", 5)
    with pytest.raises(ApiException) as e:  # a node port already taken
        kube.core.create_namespaced_service("t1", {"metadata": {"name": "clash"}, "spec": {
            "type": "NodePort", "selector": {"app": WEB}, "ports": [{"port": 80, "nodePort": port}]}})
    assert e.value.status == 422
    kube.core.create_namespaced_service("t1", {"metadata": {"name": "nobody"}, "spec": {
        "selector": {"app": "nobody"}, "ports": [{"port": 80}]}})
    resp = kube.api.call_api(*kube.api.param_serialize(
        method="GET", resource_path="/api/v1/namespaces/t1/services/nobody:80/proxy/"))
    resp.read()
    assert resp.status == 503 and b'no endpoints available for service \\"nobody\\"' in resp.data


def test_delete_now_refuses_the_node_port_and_a_recreated_pod_gets_a_new_ip(kube: Kube) -> None:
    setup_namespace(kube, "t3")
    kube.core.create_namespaced_pod("t3", web_pod("echo"))
    port = node_port_service(kube, "echo", "t3")
    first = wait_ready(kube, "echo", "t3")
    assert wait_for(lambda: node_port_answers(port), "node port answers", 5)
    deleted = kube.core.delete_namespaced_pod("echo", "t3", grace_period_seconds=0)
    assert deleted.metadata.deletion_timestamp is not None
    started = time.monotonic()
    wait_for(lambda: gone(kube, "echo", "t3"), "pod removed", 2)
    assert time.monotonic() - started < 1.0
    assert wait_for(lambda: node_port_refuses(port), "node port refuses", 2)
    second = kube.core.create_namespaced_pod("t3", web_pod("echo", {"tcpSocket": {"port": 8000},
                                                                    "periodSeconds": 1}))
    assert second.status.pod_ip != first.status.pod_ip
    wait_ready(kube, "echo", "t3")
    assert wait_for(lambda: node_port_answers(port), "node port answers again", 5)


def test_graceful_delete_sends_sigterm_then_sigkill_after_the_grace(kube: Kube) -> None:
    ns = "t4"
    setup_namespace(kube, ns)
    term = pod("term", 'trap "echo bye > /data/term; exit 0" TERM; echo up; while :; do sleep 0.1; done',
               volumeMounts=[{"name": "data", "mountPath": "/data"}])
    term["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    kube.core.create_namespaced_pod(ns, term)
    # SIG_IGN is inherited: the shell and its sleep both ignore SIGTERM.
    kube.core.create_namespaced_pod(ns, pod("stubborn", "trap '' TERM; echo up; sleep 30"))
    kube.core.create_namespaced_pod(ns, pod("stubborn2", "trap '' TERM; echo up; sleep 30"))
    for name in ("term", "stubborn", "stubborn2"):
        wait_ready(kube, name, ns)
        wait_for(lambda n=name: "up" in kube.core.read_namespaced_pod_log(n, ns), f"{name} trap set")
    # The grace period in a DeleteOptions body (the others below: as a query parameter).
    options = client.V1DeleteOptions(grace_period_seconds=10)
    deleted = kube.core.delete_namespaced_pod("term", ns, body=options)
    assert deleted.metadata.deletion_grace_period_seconds == 10
    assert not is_ready(deleted)  # unready at once: no new connections while it stops
    wait_for(lambda: gone(kube, "term", ns), "term removed", 3)
    assert kube.fc is not None
    [folder] = (kube.fc.root / "pods").glob(f"{ns}_term_*")
    assert (folder / "volumes" / "data" / "term").read_text() == "bye\n"
    started = time.monotonic()
    kube.core.delete_namespaced_pod("stubborn", ns, grace_period_seconds=1)
    wait_for(lambda: gone(kube, "stubborn", ns), "stubborn removed", 4)
    assert time.monotonic() - started >= 0.9
    # A second delete may shorten the grace period (to 0: SIGKILL now).
    kube.core.delete_namespaced_pod("stubborn2", ns, grace_period_seconds=30)
    kube.core.delete_namespaced_pod("stubborn2", ns, grace_period_seconds=0)
    wait_for(lambda: gone(kube, "stubborn2", ns), "stubborn2 removed", 1)


def test_errors_are_status_objects_and_pods_fail_visibly(kube: Kube) -> None:
    core, ns = kube.core, "t5"
    core.create_namespace({"metadata": {"name": ns}})
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod("missing", ns)
    assert e.value.status == 404
    core.create_namespaced_pod(ns, pod("dup", "sleep 30"))
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(ns, pod("dup", "sleep 30"))
    assert e.value.status == 409 and "AlreadyExists" in str(e.value.body)
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(ns, {"metadata": {}, "spec": pod("x", "true")["spec"]})
    assert e.value.status == 422
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("nope", pod("x", "true"))
    assert e.value.status == 404 and 'namespaces \\"nope\\" not found' in str(e.value.body)

    nginx = pod("nginx", "true")
    nginx["spec"]["containers"][0]["image"] = "nginx:1.27"
    core.create_namespaced_pod(ns, nginx)
    failed = wait_for(lambda: (p := core.read_namespaced_pod("nginx", ns)).status.phase == "Failed" and p,
                      "nginx failed")
    waiting = failed.status.container_statuses[0].state.waiting
    assert waiting.reason == "ErrImagePull" and "pdchaos" in waiting.message

    host = pod("host", "true", volumeMounts=[{"name": "h", "mountPath": "/h"}])
    host["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/etc"}}]
    core.create_namespaced_pod(ns, host)
    failed = wait_for(lambda: (p := core.read_namespaced_pod("host", ns)).status.phase == "Failed" and p,
                      "hostPath pod failed")
    assert "emptyDir" in failed.status.message

    needs = pod("needs", "echo $TOKEN; sleep 30",
                env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}])
    core.create_namespaced_pod(ns, needs)
    pending = wait_for(lambda: (p := core.read_namespaced_pod("needs", ns)).status.container_statuses[0]
                       .state.waiting.reason == "CreateContainerConfigError" and p, "config error")
    assert pending.status.phase == "Pending"
    assert "later" in pending.status.container_statuses[0].state.waiting.message
    # As a real kubelet does, it starts once the Secret exists.
    core.create_namespaced_secret(ns, {"metadata": {"name": "later"}, "data": {"token": "aGk="}})
    wait_ready(kube, "needs", ns)
    wait_for(lambda: core.read_namespaced_pod_log("needs", ns) == "hi\n", "secret in env")
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)


def test_exec_exit_codes_and_stopped_containers(kube: Kube) -> None:
    core, ns = kube.core, "t6"
    core.create_namespace({"metadata": {"name": ns}})
    two = pod("two", "sleep 30")
    two["spec"]["containers"].append({"name": "once", "image": IMAGE, "command": ["true"]})
    core.create_namespaced_pod(ns, two)
    wait_for(lambda: (s := core.read_namespaced_pod("two", ns).status.container_statuses) and
             s[0].state.running and s[1].state.terminated, "main running, once done")

    def run(command: list[str], container: str | None = "main") -> Any:
        resp = stream(core.connect_get_namespaced_pod_exec, "two", ns, command=command, container=container,
                      stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
        try:
            resp.run_forever(timeout=10)
            resp.returncode  # noqa: B018 (read while the channels are still there)
        finally:
            resp.close()
        return resp

    resp = run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert resp.returncode == 3
    assert resp.read_stdout() == "out\n" and resp.read_stderr() == "err\n"
    assert run(["true"]).returncode == 0
    assert run(["no-such-command"]).returncode == 127
    # A background child that keeps the pipes open does not keep the session open.
    started = time.monotonic()
    assert run(["sh", "-c", "sleep 30 & echo bg"]).returncode == 0
    assert time.monotonic() - started < 5
    for container in ("once", None, "nope"):
        with pytest.raises(ApiException) as e:
            run(["true"], container)
        # The handshake fails with 400; the client's websocket layer reports it as status 0.
        assert "400" in str(e.value)
    core.delete_namespaced_pod("two", ns, grace_period_seconds=0)


def test_init_containers_run_first_and_exec_probes_see_the_volume(kube: Kube) -> None:
    core, ns = kube.core, "t8"
    core.create_namespace({"metadata": {"name": ns}})
    mount = [{"name": "data", "mountPath": "/data"}]
    ok = pod("ok", "cat /data/i; sleep 30", volumeMounts=mount, readinessProbe={
        "exec": {"command": ["test", "-f", "/data/i"]}, "periodSeconds": 1})
    ok["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    ok["spec"]["initContainers"] = [{"name": "first", "image": IMAGE, "volumeMounts": mount,
                                     "command": ["sh", "-c", "sleep 0.5; echo init > /data/i"]}]
    created = core.create_namespaced_pod(ns, ok)
    assert created.status.phase == "Pending"
    pending = wait_for(lambda: (p := core.read_namespaced_pod("ok", ns)).status.init_container_statuses[0]
                       .state.running and p, "init running")
    assert pending.status.phase == "Pending"
    assert {c.type: c.status for c in pending.status.conditions}["Initialized"] == "False"
    ready = wait_ready(kube, "ok", ns)
    assert ready.status.init_container_statuses[0].state.terminated.exit_code == 0
    assert core.read_namespaced_pod_log("ok", ns, container="main") == "init\n"

    bad = pod("bad", "echo never; sleep 30")
    bad["spec"]["initContainers"] = [{"name": "first", "image": IMAGE, "command": ["sh", "-c", "exit 4"]}]
    core.create_namespaced_pod(ns, bad)
    failed = wait_for(lambda: (p := core.read_namespaced_pod("bad", ns)).status.phase == "Failed" and p,
                      "bad failed")
    assert failed.status.init_container_statuses[0].state.terminated.exit_code == 4
    assert failed.status.container_statuses[0].state.waiting is not None
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)


def test_selectors_collections_secrets_and_namespace_delete(kube: Kube) -> None:
    core, net, ns = kube.core, kube.net, "t7"
    core.create_namespace({"metadata": {"name": ns}})
    for name, labels in (("a", {"tier": "x", "role": "p"}), ("b", {"tier": "x", "role": "d"}),
                         ("c", {"tier": "y"})):
        core.create_namespaced_pod(ns, pod(name, "sleep 30", labels))
        net.create_namespaced_network_policy(ns, {
            "metadata": {"name": f"np-{name}", "labels": labels},
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"]}})

    def names(selector: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(ns, label_selector=selector).items]

    assert names("tier=x") == ["a", "b"]
    assert names("tier=x,role=d") == ["b"]
    assert names("role") == ["a", "b"] and names("!role") == ["c"]
    assert names("tier in (x,y)") == ["a", "b", "c"] and names("tier!=x") == ["c"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(label_selector="tier=y").items] == ["c"]
    core.delete_collection_namespaced_pod(ns, label_selector="tier=x", grace_period_seconds=0)
    wait_for(lambda: names("") == ["c"], "a and b deleted", 3)

    nps = net.list_namespaced_network_policy(ns, label_selector="tier=x").items
    assert [p.metadata.name for p in nps] == ["np-a", "np-b"]
    net.delete_collection_namespaced_network_policy(ns, label_selector="tier=x")
    assert [p.metadata.name for p in net.list_namespaced_network_policy(ns).items] == ["np-c"]
    assert net.read_namespaced_network_policy("np-c", ns).spec.pod_selector.match_labels == {"tier": "y"}
    net.delete_namespaced_network_policy("np-c", ns)
    assert net.list_namespaced_network_policy(ns).items == []

    core.create_namespaced_secret(ns, {"metadata": {"name": "s"}, "stringData": {"token": "hi"}})
    secret = core.read_namespaced_secret("s", ns)
    assert secret.data == {"token": "aGk="} and secret.type == "Opaque"
    assert [s.metadata.name for s in core.list_namespaced_secret(ns).items] == ["s"]

    core.delete_namespace(ns)
    with pytest.raises(ApiException) as e:
        core.create_namespaced_secret(ns, {"metadata": {"name": "t"}})
    assert e.value.status == 403
    wait_for(lambda: ns not in [n.metadata.name for n in core.list_namespace().items], "namespace gone", 5)
    assert core.list_namespaced_pod(ns).items == []


def test_discovery_and_the_node(kube: Kube) -> None:
    assert client.VersionApi(kube.api).get_code().major == "1"
    assert client.CoreApi(kube.api).get_api_versions().versions == ["v1"]
    assert client.ApisApi(kube.api).get_api_versions().groups[0].name == "networking.k8s.io"
    assert "pods/exec" in [r.name for r in kube.core.get_api_resources().resources]
    assert [r.kind for r in kube.net.get_api_resources().resources] == ["NetworkPolicy"]
    [node] = kube.core.list_node().items
    assert node.metadata.name == "fake-node"
    assert {(a.type, a.address) for a in node.status.addresses} == {
        ("InternalIP", "127.0.0.1"), ("Hostname", "fake-node")}
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]


def test_close_kills_running_pods_and_pods_mid_deletion(tmp_path: Path) -> None:
    with running_fake_cluster(tmp_path) as fc:
        k = connect(fc.url)
        k.core.create_namespaced_pod("default", pod("sleeper", "sleep 60"))
        k.core.create_namespaced_pod("default", pod("stubborn", "trap '' TERM; echo up; sleep 60"))
        wait_ready(k, "sleeper", "default")
        wait_for(lambda: "up" in k.core.read_namespaced_pod_log("stubborn", "default"), "trap set")
        k.core.delete_namespaced_pod("stubborn", "default", grace_period_seconds=30)
        pids = fc.pod_processes()
        assert len(pids) == 2
        kubeconfig = fc.write_kubeconfig(tmp_path / "kubeconfig")
        k.api.close()
    assert kubeconfig.stat().st_mode & 0o777 == 0o600
    assert [pids_in_group(pid) for pid in pids] == [[], []]


def test_help_says_what_it_is_and_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "runs pods as local processes" in out and "NOT enforced" in out


def test_command_line_serves_until_sigterm_and_leaves_nothing(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kube" / "config"
    proc = subprocess.Popen([PY, "-m", "harness.kube.fake_cluster", "--root", str(tmp_path / "root"),
                             "--kubeconfig", str(kubeconfig)], stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(READY_PREFIX + " http://127.0.0.1:")
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        assert cfg.host == line.split()[1]
        k = connect(cfg.host)
        assert [n.metadata.name for n in k.core.list_node().items] == ["fake-node"]
        k.core.create_namespaced_pod("default", pod("sleeper", "sleep 60"))
        running = wait_ready(k, "sleeper", "default")
        pid = int(running.status.container_statuses[0].container_id.removeprefix("fake://"))
        k.api.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        watchdog.cancel()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert pids_in_group(pid) == []
