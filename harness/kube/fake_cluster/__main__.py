"""`python -m harness.kube.fake_cluster`: serve a fake cluster until SIGTERM or SIGINT (see --help)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import sys
from pathlib import Path

from harness.kube.fake_cluster.server import FakeCluster

READY_PREFIX = "PDCHAOS_FAKE_CLUSTER_READY"

DESCRIPTION = """\
A fake Kubernetes API server that runs pods as local processes, to try pdchaos's cluster backend
without a cluster. It answers the official client (kubectl mostly works too, with --validate=false):
namespaces, pods (logs, exec), services (node ports, the service proxy), secrets, networkpolicies,
one node. Each pod gets its own loopback address (127.0.x.y) and folder under --root.

Limits: only the pdchaos image runs (as local processes on this host, with this venv's commands), and
toxiproxy's as pdchaos-toxiproxy; any other image fails with ErrImagePull; no network namespaces (0.0.0.0
in a container's command or args is its pod's address); only emptyDir volumes, emulated by rewriting
mount paths in command, args, env and exec commands (no mount namespaces); restartPolicy is always Never;
liveness probes are not run; NetworkPolicies are stored but NOT enforced; ClusterIPs are not routed
(use a NodePort/LoadBalancer Service or the service proxy); node ports are free ports, not
30000-32767; no watch, update, patch, port-forward, or exec with stdin/tty; no authentication.

On start it writes a kubeconfig (context "fake") and prints one line:
  PDCHAOS_FAKE_CLUSTER_READY <url>
SIGTERM or SIGINT stops it and kills every pod process.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.kube.fake_cluster", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True,
                        help="folder for the pods' folders and logs (created if missing)")
    parser.add_argument("--kubeconfig", type=Path, required=True,
                        help="where to write the kubeconfig for this cluster")
    parser.add_argument("--namespace", default="default", help="the kubeconfig context's namespace")
    parser.add_argument("--node-host", default="127.0.0.1",
                        help="the node's address, a loopback one: node ports listen on it "
                        "(default 127.0.0.1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level to stderr")
    args = parser.parse_args(argv)
    try:
        loopback = ipaddress.ip_address(args.node_host).is_loopback
    except ValueError:
        parser.error(f"--node-host must be an IP address, not {args.node_host!r}")
    if not loopback:
        parser.error(f"--node-host must be a loopback address (127.0.0.0/8), not {args.node_host}")
    return args


async def serve(args: argparse.Namespace) -> None:
    cluster = FakeCluster(args.root, node_host=args.node_host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        url = await cluster.start()
        cluster.write_kubeconfig(args.kubeconfig, args.namespace)
        print(f"{READY_PREFIX} {url}", flush=True)
        await stop.wait()
    finally:
        await cluster.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
