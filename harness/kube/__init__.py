"""Engines on a Kubernetes cluster: an engine backend for sweeps (`[engines.NAME] backend = "k8s"`).

Engines are pods (vLLM images with GPU requests and the PD connector settings of vLLM's and llm-d's
published deployments, or the fake engines' image for a cluster without GPUs), each behind its own
Service; the router runs in the cluster (a pod and a Service) or outside it. Faults become cluster actions:
a restart or crash deletes the pod (and a respawn creates it again on the same Service address), a
SIGSTOP-style wedge is `kill -STOP` through exec, a link cut is a NetworkPolicy (packets dropped) or a
Toxiproxy sidecar with its proxy disabled (connections refused), latency and bandwidth are the sidecar's
toxics.

Layers, each its own module: `presets` (what an engine pod runs), `options` (an `[engines.NAME]` table
checked), `manifests` (pure dicts: Pod, Service, NetworkPolicy, Namespace), `faults` (a scenario action ->
cluster actions, or why it cannot be done), `plan` (one cell: manifests, set-up, faults, teardown),
`schema` (manifests checked against the client library's own API models) and `cluster` (the actions
applied through the client).

The client library is the official `kubernetes` package (`pip install -e '.[k8s]'`, imported only when a
cluster is used or a manifest checked): its generated models are the cluster's OpenAPI schema in Python
(every field, type and required key of every kind), so a manifest can be checked offline with no cluster,
and `kubernetes.stream` does exec and port-forward over the API server's websocket, which a SIGSTOP fault
and an outside harness need. kr8s is friendlier for scripts but has no typed models to validate against;
lightkube has typed models (a separate package) but its documentation offers no exec, and exec is how a
wedge reaches a container.
"""
