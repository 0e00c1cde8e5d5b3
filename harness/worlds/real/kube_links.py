"""Link faults in the cluster world: each faulted link of an engine goes through a Toxiproxy sidecar in the
engine's pod (`harness.kube.faults`), driven through the API server's service proxy.

The same interface as `links.NetworkLinks` (the loopback world's Toxiproxy in front of the engines), so the
session sees the same events: `FaultApplied`, `FaultVerified` with what was seen, `ActionDone`. The sidecar
and its proxies come with the pod (`faults.create_pod`): a Service's port for a proxied link targets the
proxy's port, and a NIXL prefill advertises the proxy's side-channel port to its decodes, so nothing
changes for the router. A link whose fault would need a NetworkPolicy (no sidecar can stand in front of
it) is not run here (`kube_engines.not_runnable`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harness.kube.faults import ClusterAction, actions_for, proxy_name, proxy_url
from harness.scenario import EngineSettings
from harness.scenario.links import (
    HealLink,
    LinkFault,
    LinkFlap,
    LinkRef,
    Partition,
    ToxicPlan,
)
from harness.session.events import WorldNote
from harness.topology import Topology
from harness.worlds.base import Emit
from harness.worlds.real.links import LinkFaults
from harness.worlds.real.probes import tcp_probe

SETTLE_S = 1.0


class KubeLinkError(RuntimeError):
    """A link fault the cluster world cannot put in place."""


class KubeLinks(LinkFaults):
    def __init__(self, refs: list[LinkRef], fleet: Any) -> None:
        self.refs = refs
        self.fleet = fleet  # a kube_engines.KubeFleet, prepared

    @property
    def enabled(self) -> bool:
        return bool(self.refs)

    @property
    def router_topology(self) -> Topology:
        return self.fleet.topo

    async def open(self) -> list[WorldNote]:
        if not self.refs:
            return []
        return [WorldNote("toxiproxy sidecars", {"links": [r.label for r in self.refs],
                                                 "proxies": [self._name(r) for r in self.refs]})]

    async def close(self) -> None:
        return None  # the sidecars go with their pods

    def engine_settings(self, settings: EngineSettings) -> EngineSettings:
        return settings  # a proxied side channel is advertised by the pod's own flags (manifests)

    async def install(self, fleet: Any, emit: Emit) -> None:
        for ref in self.refs:
            emit(WorldNote(f"proxy {self._name(ref)} in {ref.engine}'s pod", {"link": ref.label}))

    def _name(self, ref: LinkRef) -> str:
        return proxy_name(ref.engine, ref.link)

    def _proxied(self, ref: LinkRef) -> bool:
        return (ref.engine, ref.link) in self.fleet.cell_context().proxied

    async def _call(self, engine: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The sidecar's Toxiproxy API; the answer's JSON (None when it has none)."""
        ctx = self.fleet.cell_context()
        action = ClusterAction("http", proxy_url(ctx, engine, path), body=body, params={"method": method})
        answer = await self.fleet.do(action)
        raw = getattr(answer, "data", None)
        if raw is None and hasattr(answer, "read"):
            raw = await asyncio.to_thread(answer.read)
        try:
            return json.loads(raw) if raw else None
        except (TypeError, ValueError):
            return None

    async def _check(self, ref: LinkRef) -> None:
        if not self._proxied(ref):
            raise KubeLinkError(f"link {ref.label} has no proxy sidecar in this cell")

    async def _put(self, fid: str, ref: LinkRef, action: LinkFault,
                   toxics: list[ToxicPlan]) -> dict[str, Any]:
        if isinstance(action, LinkFlap):  # the session toggles it from here on (set_enabled)
            await self.set_enabled(ref, False)
        else:
            for a in actions_for(action, self.fleet.cell_context(), fid):
                await self.fleet.do(a)
        return {"proxy": self._name(ref)}

    async def _probe(self, ref: LinkRef, want: str | None = None) -> str | None:
        """What a connection from outside sees on the link's Service port (None: the link is reached only
        inside the cluster, a NIXL side channel on the pod's address). With `want`, looked at again for up
        to `SETTLE_S` until it is seen: a Service's port follows its pod's a moment later."""
        spec = self.fleet.topo.engine(ref.engine)
        if ref.link == "serve":
            port = spec.serving_port(self.fleet.topo.transport)
        elif ref.link == "bootstrap":
            port = spec.bootstrap_port
        else:
            return None
        loop = asyncio.get_running_loop()
        end = loop.time() + SETTLE_S
        while True:
            seen = await tcp_probe(port, host=spec.host)
            if want is None or seen == want or loop.time() >= end:
                return seen
            await asyncio.sleep(0.05)

    async def _verify(self, ref: LinkRef, action: LinkFault, toxics: tuple[str, ...]) -> dict[str, Any]:
        proxy = await self._call(ref.engine, "GET", f"/proxies/{self._name(ref)}") or {}
        listed = sorted(t.get("name", "") for t in proxy.get("toxics") or ())
        want = "refused" if not toxics else "silent" if isinstance(action, Partition) else None
        seen = await self._probe(ref, want)
        evidence: dict[str, Any] = {"proxy": self._name(ref), "enabled": proxy.get("enabled"),
                                    "toxics": listed, "probe": _said(seen)}
        if not toxics:  # down or flapping: the proxy no longer listens
            ok = proxy.get("enabled") is False and seen in ("refused", None)
        elif isinstance(action, Partition):  # timeout toxics: accepted, then nothing
            ok = all(t in listed for t in toxics) and seen in ("silent", None)
        else:
            ok = all(t in listed for t in toxics)
        evidence["ok"] = ok
        return evidence

    async def _heal(self, action: HealLink) -> tuple[bool, dict[str, Any]]:
        refs = [r for r in self.refs if r.engine == action.target and self._proxied(r)
                and (action.link is None or r.link == action.link)]
        if not refs:
            raise KubeLinkError(f"heal {action.target}.{action.link or '*'}: no proxied link")
        for ref in refs:
            await self._clean(ref)
        evidence: dict[str, Any] = {}
        ok = True
        for ref in refs:
            proxy = await self._call(ref.engine, "GET", f"/proxies/{self._name(ref)}") or {}
            listed = [t.get("name") for t in proxy.get("toxics") or ()]
            seen = await self._probe(ref)
            evidence[ref.label] = {"toxics": listed, "enabled": proxy.get("enabled"), "probe": _said(seen)}
            # A KV side channel may reset a probe's junk bytes: only refused/silent mean still broken.
            ok = ok and not listed and proxy.get("enabled") is True and seen not in ("refused", "silent")
        return ok, evidence

    async def _clean(self, ref: LinkRef) -> None:
        """This link ends clean: its proxy enabled, none of its toxics left. Only this link's proxy (the
        plan's `/reset` would also clear a fault still due on the engine's other links)."""
        await self.set_enabled(ref, True)
        proxy = await self._call(ref.engine, "GET", f"/proxies/{self._name(ref)}") or {}
        for toxic in proxy.get("toxics") or ():
            await self._call(ref.engine, "DELETE", f"/proxies/{self._name(ref)}/toxics/{toxic.get('name')}")

    async def set_enabled(self, ref: LinkRef, enabled: bool) -> None:
        if not self._proxied(ref):
            raise KubeLinkError(f"link {ref.label} has no proxy sidecar in this cell")
        await self._call(ref.engine, "POST", f"/proxies/{self._name(ref)}", {"enabled": enabled})


def _said(probe: str | None) -> str:
    return probe if probe is not None else "not probed (a link inside the cluster)"
