"""A fake Kubernetes cluster at the HTTP level that runs pods as local processes.

It answers the official client (`kubernetes.client.CoreV1Api`, `NetworkingV1Api`, `kubernetes.stream`
exec) as a small real cluster would, so the cluster backend (harness/kube) can be driven and tested on a
host with no cluster, no root and no network namespaces: loopback only.

What is real: the API's paths, JSON objects and `Status` errors (404, 409, 422, 400) as the client
parses them; pods as local processes in their own process groups, each pod with its own loopback IP
(127.0.x.y), probes, init containers, graceful deletion (SIGTERM, then SIGKILL after the grace period);
exec over the websocket channel protocol; container logs; node ports that refuse connections while no
endpoint of the Service listens on its target port (as kube-proxy's DNAT and REJECT make them); the
service proxy.

Limits (each module says more):
- Only the project's own image (repository `pdchaos`) runs, as a local process on the host's filesystem
  (this venv first on PATH), and Toxiproxy's (repository `toxiproxy`) as the embedded `pdchaos-toxiproxy`;
  any other image fails the pod with ErrImagePull (containers.py).
- No network namespaces: each pod has a loopback address of its own, and `0.0.0.0` in a container's
  command or args means that address (containers.py). A node port follows its endpoints' listeners within
  10 ms (nodeports.py).
- No mount namespaces: a volumeMount's path is emulated by translating the strings of command, args, env
  and exec commands; only emptyDir volumes; /tmp is the host's (a pod's TMPDIR is its own) (containers.py).
- restartPolicy is always Never; livenessProbe is not run (kubelet.py, probes.py).
- NetworkPolicies are stored, NOT enforced (resources.py).
- ClusterIPs are not routed; reach a Service by node port or service proxy. Node ports are any free
  port, not 30000-32767 (network.py, nodeports.py).
- No watch, update, patch, port-forward, exec stdin or TTY; no RBAC, the token is not checked (api.py).

`python -m harness.kube.fake_cluster --root DIR --kubeconfig PATH` serves one until SIGTERM/SIGINT.
"""

from harness.kube.fake_cluster.server import FakeCluster, running_fake_cluster

__all__ = ["FakeCluster", "running_fake_cluster"]
