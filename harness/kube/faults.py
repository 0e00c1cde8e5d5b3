"""A scenario's actions as cluster actions: what the harness would do to the cluster for each step.

Each action maps to a short list of `ClusterAction`s (apply a manifest, delete an object, exec a command
in a container, call a sidecar's or an engine's HTTP API, wait, sleep), or raises `Unsupported` saying why
the backend cannot do it faithfully (the cell is then left out of a sweep with that reason rather than
run with a fault that means something else).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never

from harness.kube import manifests as m
from harness.kube.presets import CONTROL_PORT, TOXIPROXY_API_PORT
from harness.scenario import (
    Action,
    AddWorker,
    Crash,
    Die,
    EngineFault,
    GracefulStop,
    Heal,
    PatchWorker,
    PauseRouter,
    RemoveWorker,
    Respawn,
    Restart,
    SlowStart,
    StartEngine,
    Wedge,
)
from harness.scenario.links import (
    HealLink,
    LinkBandwidth,
    LinkFlap,
    LinkLatency,
    LinkReset,
    Partition,
    toxics_for,
)


class Unsupported(Exception):
    """The backend cannot do this action faithfully."""


@dataclass(frozen=True)
class ClusterAction:
    """One thing done to the cluster (or through it). `target` names the object or URL."""

    verb: str
    target: str
    kind: str = ""
    body: Mapping[str, Any] | None = None
    command: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    def describe(self) -> str:
        """One line, kubectl-like."""
        if self.verb == "apply":
            text = f"apply {self.kind} {self.target}"
        elif self.verb == "delete":
            grace = self.params.get("grace_period_seconds")
            text = f"delete {self.kind} {self.target}"
            text += f" --grace-period={grace}" if grace is not None else ""
        elif self.verb == "wait":
            text = f"wait {self.kind} {self.target} {self.params.get('until')} " \
                   f"(at most {self.params.get('timeout_s', '?')} s)"
        elif self.verb == "exec":
            text = f"exec {self.target} -c {self.params.get('container')} -- {' '.join(self.command)}"
        elif self.verb == "sleep":
            text = f"sleep {self.params.get('seconds')} s"
        elif self.verb == "http":
            body = f" {dict(self.body)}" if self.body else ""
            text = f"{self.params.get('method', 'POST')} {self.target}{body}"
        else:
            text = f"{self.verb} {self.target}"
        return text + (f"  # {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verb": self.verb, "target": self.target, "describe": self.describe()}
        if self.kind:
            out["kind"] = self.kind
        if self.body is not None:
            out["body"] = dict(self.body)
        if self.command:
            out["command"] = list(self.command)
        if self.params:
            out["params"] = dict(self.params)
        return out


# ---------------------------------------------------------------- building blocks


def delete_pod(ctx: m.CellContext, engine: str, grace_s: int | None) -> list[ClusterAction]:
    """The pod goes (after its records are read: they live in the pod)."""
    name = ctx.name(engine)
    params = {} if grace_s is None else {"grace_period_seconds": grace_s}
    return [*read_records(ctx, engine), ClusterAction("delete", name, "Pod", params=params),
            ClusterAction("wait", name, "Pod", params={"until": "deleted", "timeout_s": 60})]


def read_records(ctx: m.CellContext, engine: str) -> list[ClusterAction]:
    """A fake engine's provenance records, read from its pod (a vLLM engine keeps none)."""
    if ctx.options.preset.kind != "fake":
        return []
    return [ClusterAction("exec", ctx.name(engine), "Pod", command=("cat", m.RECORDS_FILE),
                          params={"container": m.ENGINE_CONTAINER},
                          note="the engine's provenance records, kept by the harness")]


def kill_engine(ctx: m.CellContext, engine: str) -> list[ClusterAction]:
    """A crash: the engine process dies at once; its pod stays until its records are read."""
    return [signal_engine(ctx, engine, "KILL", note="the engine process dies; the pod's shell stays"),
            *delete_pod(ctx, engine, 0)]


def create_pod(ctx: m.CellContext, engine: str, refuse_s: float | None = None) -> list[ClusterAction]:
    pod = m.engine_pod(ctx, engine, refuse_s=refuse_s)
    name = ctx.name(engine)
    out = [ClusterAction("apply", name, "Pod", body=pod),
           ClusterAction("wait", name, "Pod",
                         params={"until": "ready", "timeout_s": ctx.options.ready_timeout_s})]
    return out + proxy_setup(ctx, engine)


def signal_engine(ctx: m.CellContext, engine: str, sig: str, note: str = "") -> ClusterAction:
    """A signal to the engine process itself (its PID is in a file: see manifests.engine_script)."""
    cmd = ("/bin/sh", "-c", f"kill -{sig} \"$(cat {m.PID_FILE})\"")
    return ClusterAction("exec", ctx.name(engine), "Pod", command=cmd,
                         params={"container": m.ENGINE_CONTAINER}, note=note)


def proxy_url(ctx: m.CellContext, engine: str, path: str) -> str:
    return f"http://{ctx.host(engine)}:{TOXIPROXY_API_PORT}{path}"


def proxy_name(engine: str, link: str) -> str:
    return f"{engine}.{link}"


def proxy_setup(ctx: m.CellContext, engine: str) -> list[ClusterAction]:
    """Create the sidecar's proxies once the pod serves (the upstream is the pod IP, known only then)."""
    out = []
    for e, link in sorted(ctx.proxied):
        if e != engine:
            continue
        port = m.link_port(ctx, engine, link)
        # On the pod's address (what its Service and its peers reach), not every interface.
        body = {"name": proxy_name(engine, link), "listen": f"$(POD_IP):{m.proxied_port(port)}",
                "upstream": f"$(POD_IP):{port}", "enabled": True}
        out.append(ClusterAction("http", proxy_url(ctx, engine, "/proxies"), body=body,
                                 params={"method": "POST"}, note="the pod IP is read from the pod's status"))
    return out


def _control(ctx: m.CellContext, engine: str, method: str, path: str, body: Mapping[str, Any] | None = None
             ) -> ClusterAction:
    if ctx.options.preset.kind != "fake":
        raise Unsupported(f"{ctx.options.preset.name} engines have no fault control API (a protocol fault "
                          "needs the fake engines' preset, pdchaos-fake)")
    secret = ctx.options.control_token_secret
    return ClusterAction("http", f"http://{ctx.host(engine)}:{CONTROL_PORT}{path}", body=body,
                         params={"method": method, "bearer_secret": secret},
                         note=f"Authorization: Bearer <secret {secret}, key token>")


def _proxy_call(ctx: m.CellContext, engine: str, link: str, method: str, path: str,
                body: Mapping[str, Any] | None = None, note: str = "") -> ClusterAction:
    if (engine, link) not in ctx.proxied:
        raise Unsupported(f"link {engine}.{link} has no proxy sidecar")
    return ClusterAction("http", proxy_url(ctx, engine, f"/proxies/{proxy_name(engine, link)}{path}"),
                         body=body, params={"method": method}, note=note)


def proxiable(options: Any, connector: str, link: str) -> bool:
    """Whether a proxy sidecar can stand in front of this link on a cluster."""
    return link != "side_channel" or (options.preset.kind == "fake" and connector == "nixl")


def check_proxiable(ctx: m.CellContext, link: str) -> None:
    """Unsupported when no proxy can stand in front of this link on a cluster."""
    if proxiable(ctx.options, ctx.connector, link):
        return
    if ctx.options.preset.kind == "vllm":
        raise Unsupported("vLLM advertises its own KV side-channel port, so no proxy can stand in front of "
                          "it (a cut of that link is a NetworkPolicy: Partition(mode='timeout'))")
    if ctx.connector == "mooncake":
        raise Unsupported("a Mooncake side channel moves to a new port on every start: on a cluster there is "
                          "no fixed port to proxy (a cut is a NetworkPolicy: Partition(mode='timeout'))")


# ---------------------------------------------------------------- the mapping


def actions_for(action: Action, ctx: m.CellContext, step: str = "fault") -> list[ClusterAction]:
    """The cluster actions that carry out one scenario action (Unsupported: why they cannot). `step`: the
    step's name, which names its toxics (so that its heal removes exactly them)."""
    target = action.target
    match action:
        case Restart():
            out = kill_engine(ctx, target) if action.mode == "process" else delete_pod(ctx, target, None)
            if action.down_s:
                out.append(ClusterAction("sleep", "", params={"seconds": action.down_s}))
            return [*out, *create_pod(ctx, target)]
        case SlowStart():
            return [*delete_pod(ctx, target, None), *create_pod(ctx, target, refuse_s=action.refuse_s)]
        case Crash():
            return kill_engine(ctx, target)
        case Respawn() | StartEngine():
            return create_pod(ctx, target)
        case Die():
            return [signal_engine(ctx, target, "TERM", note=f"the engine shuts down (asked: exit after "
                                                          f"{action.exit_after_s:g} s)")]
        case Wedge():
            if action.mode == "sigstop":
                return [signal_engine(ctx, target, "STOP")]
            body = {"fault": "wedge", "surface": action.surface}
            return [_control(ctx, target, "POST", "/control/fault", body)]
        case EngineFault():
            body = {"fault": action.kind, **dict(action.params)}
            return [_control(ctx, target, "POST", "/control/fault", body)]
        case Heal():
            out = [signal_engine(ctx, target, "CONT", note="harmless when the engine was not stopped")]
            if ctx.options.preset.kind == "fake":
                path = "/control/clear" if action.kind is None else f"/control/fault/{action.kind}"
                out.append(_control(ctx, target, "POST" if action.kind is None else "DELETE", path))
            return out
        case PatchWorker() | AddWorker() | RemoveWorker():
            verb = {PatchWorker: "PATCH", AddWorker: "POST", RemoveWorker: "DELETE"}[type(action)]
            return [ClusterAction("router", f"{verb} /workers ({target} at {ctx.host(target)})",
                                  note="the router's worker API, as on loopback")]
        case Partition():
            if action.mode == "down":
                check_proxiable(ctx, action.link)
                return [_proxy_call(ctx, target, action.link, "POST", "", {"enabled": False},
                                    note="connections refused, as on loopback")]
            if (target, action.link) in ctx.proxied:
                return [_proxy_call(ctx, target, action.link, "POST", "/toxics", toxic_body(t),
                                    note="accepted, nothing answers: as on loopback")
                        for t in toxics_for(action, step)]
            pol = m.cut_policy(ctx, target, action.link)
            return [ClusterAction(
                "apply", pol["metadata"]["name"], "NetworkPolicy", body=pol,
                note="packets to the link's port are dropped: connections wait, as a wedge")]
        case LinkLatency() | LinkReset() | LinkBandwidth():
            check_proxiable(ctx, action.link)
            return [_proxy_call(ctx, target, action.link, "POST", "/toxics", toxic_body(t))
                    for t in toxics_for(action, step)]
        case LinkFlap():
            check_proxiable(ctx, action.link)
            return [_proxy_call(ctx, target, action.link, "POST", "", {"enabled": False}),
                    _proxy_call(ctx, target, action.link, "POST", "", {"enabled": True})] * action.cycles
        case HealLink():
            return _heal_links(ctx, target, action.link)
        case GracefulStop():
            raise Unsupported(f"no cluster action for {type(action).__name__}")
        case PauseRouter():
            raise Unsupported("the router runs in its own pod: pausing it is not mapped to a cluster action")
        case _:
            assert_never(action)


def toxic_body(t: Any) -> dict[str, Any]:
    return {"name": t.name, "type": t.type, "stream": t.stream, "toxicity": 1.0,
            "attributes": dict(t.attributes)}


def _heal_links(ctx: m.CellContext, engine: str, link: str | None) -> list[ClusterAction]:
    out: list[ClusterAction] = []
    links = [link] if link is not None else ["serve", "bootstrap", "side_channel"]
    for lk in links:
        name = m.cut_policy(ctx, engine, lk)["metadata"]["name"]
        out.append(ClusterAction("delete", name, "NetworkPolicy", note="if present"))
        if (engine, lk) in ctx.proxied:
            out.append(_proxy_call(ctx, engine, lk, "POST", "", {"enabled": True}))
            # Not the sidecar's /reset: that would also clear a fault still due on another link.
            out.append(_proxy_call(ctx, engine, lk, "GET", "/toxics",
                                   note="then DELETE /toxics/<name> for each: this link's toxics only"))
    return out
