"""`FakeCluster`: the fake API server, kubelet and kube-proxy together on one event loop.

`await FakeCluster(root).start()` serves on 127.0.0.1 (a free port) and returns the base URL; point the
official client at it (`Configuration(host=url)`, or `write_kubeconfig` and `load_kube_config`).
`running_fake_cluster(root)` serves it from a daemon thread with its own loop, for synchronous callers.
`close()` kills every pod's processes (SIGKILL to each process group), closes the node ports and stops
serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from aiohttp import web

from harness.kube.fake_cluster.api import Api
from harness.kube.fake_cluster.kubelet import Kubelet
from harness.kube.fake_cluster.network import reserve_port
from harness.kube.fake_cluster.nodeports import NodePorts
from harness.kube.fake_cluster.proxy import ServiceProxy
from harness.kube.fake_cluster.resources import Resources
from harness.kube.fake_cluster.store import Store

log = logging.getLogger(__name__)
CONTEXT = "fake"
TOKEN = "pdchaos-fake-cluster-token"
START_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 30.0
# Bodies through the service proxy can be large (an engine's KV handoff records).
MAX_BODY = 256 * 1024 * 1024


class FakeCluster:
    def __init__(self, root: Path, node_host: str = "127.0.0.1") -> None:
        self.root = Path(root)
        self.node_host = node_host
        self.url = ""
        self.store = Store()
        self._session: aiohttp.ClientSession | None = None
        self.kubelet = Kubelet(self.store, self.root, node_host, self.session)
        self._runner: web.AppRunner | None = None
        self._node_ports: NodePorts | None = None
        self._resources: Resources | None = None
        self._closed = False
        self.store.add("namespaces", self.store.prepare("namespaces", "", {"metadata": {"name": "default"}})
                       | {"status": {"phase": "Active"}})

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the fake cluster is not started")
        return self._session

    async def start(self) -> str:
        """Serve on 127.0.0.1 (a free port); returns the base URL, also kept in `url`."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._session = aiohttp.ClientSession()
        self._node_ports = NodePorts(self.store, self.node_host)
        self._resources = Resources(self.store, self.kubelet, self._node_ports, self.node_host)
        api = Api(self.store, self.kubelet, self._resources, ServiceProxy(self.store, self._session),
                  self.node_host)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", api.dispatch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = reserve_port("127.0.0.1")
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        log.info("fake cluster serving on %s (root %s)", self.url, self.root)
        return self.url

    async def close(self) -> None:
        """Kill every pod process (pods mid-deletion too), close node ports, stop serving. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.kubelet.close()
        if self._resources is not None:
            await self._resources.close()
        if self._node_ports is not None:
            await self._node_ports.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig for this cluster (context `fake`, a dummy token), readable by load_kube_config."""
        if not self.url:
            raise RuntimeError("start the fake cluster before writing its kubeconfig")
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": CONTEXT, "cluster": {"server": self.url}}],
            "users": [{"name": CONTEXT, "user": {"token": TOKEN}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT,
                                                        "namespace": namespace}}],
            "current-context": CONTEXT,
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # JSON is YAML; 0600 as kubectl writes it (it holds a token, if only a dummy one).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f, indent=2)
        return path

    def pod_processes(self) -> list[int]:
        """Pids of the container processes still running (exec sessions not included)."""
        return self.kubelet.pod_processes()


@contextlib.contextmanager
def running_fake_cluster(root: Path) -> Iterator[FakeCluster]:
    """The cluster served on its own event loop in a daemon thread (for sync callers/tests); closed on
    exit, exceptions included. Pod processes are forked from that thread, which lives until the close."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-cluster", daemon=True)
    thread.start()
    cluster: FakeCluster | None = None
    try:
        cluster = asyncio.run_coroutine_threadsafe(_make(root), loop).result(START_TIMEOUT_S)
        yield cluster
    finally:
        try:
            if cluster is not None:
                asyncio.run_coroutine_threadsafe(cluster.close(), loop).result(CLOSE_TIMEOUT_S)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(START_TIMEOUT_S)
            if not thread.is_alive():
                loop.close()


async def _make(root: Path) -> FakeCluster:
    cluster = FakeCluster(root)
    try:
        await cluster.start()
    except BaseException:
        await cluster.close()
        raise
    return cluster
