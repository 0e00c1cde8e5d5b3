"""An `[engines.NAME]` table with `backend = "k8s"`, checked: which preset, which cluster, what to change."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from harness.kube.presets import HARNESS_IMAGE, PRESETS, TOXIPROXY_IMAGE, EnginePreset

ROUTER_PLACEMENTS = ("cluster", "outside")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")


@dataclass(frozen=True)
class KubeOptions:
    preset: EnginePreset
    namespace: str = "pdchaos"
    context: str | None = None
    # The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    kubeconfig: str | None = None
    # The address an outside harness and router reach NodePort Services at (default: the first node's
    # ExternalIP, else its InternalIP).
    node_address: str | None = None
    # Where the router under test runs: a pod next to the engines, or the harness's host.
    router: str = "cluster"
    router_image: str = HARNESS_IMAGE
    harness_image: str = HARNESS_IMAGE
    toxiproxy_image: str = TOXIPROXY_IMAGE
    # How the harness (outside the cluster) reaches the router, and an outside router the engines.
    service_type: str = "ClusterIP"
    hf_token_secret: str | None = None
    # The Secret (key `token`) that holds the fake engines' control-API bearer token: the engines read it
    # from their environment, the fault actions send it (an open control API on a shared cluster would let
    # anyone wedge the engines).
    control_token_secret: str = "pdchaos-control"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 900.0


_STR_KEYS = ("namespace", "context", "kubeconfig", "node_address", "router_image", "harness_image",
             "toxiproxy_image", "hf_token_secret",
             "control_token_secret")
_PRESET_KEYS = ("image", "model", "cpu", "memory", "shm")


def parse_options(table: Mapping[str, Any]) -> KubeOptions:
    """KubeOptions from a table (without its `backend` key); ValueError naming every problem."""
    problems: list[str] = []
    name = table.get("preset")
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, not {name!r}")
    preset = PRESETS[str(name)]
    values: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    known = {"preset", "router", "service_type", "node_selector", "ready_timeout_s", "gpus", "args", "env",
             *_STR_KEYS, *_PRESET_KEYS}
    for k, v in table.items():
        if k not in known:
            problems.append(f"unknown key {k!r} (known: {', '.join(sorted(known))})")
        elif k in _STR_KEYS or k in _PRESET_KEYS:
            if not isinstance(v, str) or not v:
                problems.append(f"{k} must be a non-empty string")
            elif k in _PRESET_KEYS:
                overrides[k] = v
            else:
                values[k] = v
    for key, allowed in (("router", ROUTER_PLACEMENTS), ("service_type", SERVICE_TYPES)):
        if key in table and table[key] not in allowed:
            problems.append(f"{key} must be one of {', '.join(allowed)}")
        elif key in table:
            values[key] = table[key]
    gpus = table.get("gpus", preset.gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        problems.append("gpus must be a whole number >= 0")
    else:
        overrides["gpus"] = gpus
    args = table.get("args", list(preset.args))
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        problems.append("args must be a list of strings")
    else:
        overrides["args"] = tuple(args)
    for key in ("env", "node_selector"):
        v = table.get(key, {})
        if not isinstance(v, Mapping) or not all(isinstance(x, str) for x in v.values()):
            problems.append(f"{key} must be a table of strings")
        elif key == "env":
            overrides["env"] = {**preset.env, **v}
        else:
            values["node_selector"] = dict(v)
    t = table.get("ready_timeout_s", 900.0)
    if isinstance(t, bool) or not isinstance(t, int | float) or t <= 0:
        problems.append("ready_timeout_s must be a number > 0")
    else:
        values["ready_timeout_s"] = float(t)
    if values.get("router") == "outside" and values.get("service_type", "ClusterIP") == "ClusterIP":
        problems.append("an outside router must reach the engines: service_type NodePort or LoadBalancer")
    if problems:
        raise ValueError("; ".join(problems))
    return KubeOptions(preset=replace(preset, **overrides), **values)
