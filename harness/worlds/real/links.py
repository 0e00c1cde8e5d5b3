"""Network links of a real-time cell: Toxiproxy proxies on the links a scenario's timeline names, driven by
toxiproxy-python.

With no link to proxy it does nothing (no server; `router_topology` is the topology). Otherwise it uses the
Toxiproxy at `TOXIPROXY_URL`, else the embedded one (`harness.toxiproxy`) on a thread, and:
- `engine_settings(...)` tells each prefill with a proxied side channel to advertise the proxy's port;
- `install(fleet)` creates one proxy per link once the engines serve (a Mooncake side channel's port is only
  known then);
- `router_topology` is what the router must be given (serving/bootstrap ports through the proxies);
- `apply(fault_id, action, emit)` puts a network fault in place and verifies it (connect refused, toxic
  listed, a probe that gets no answer or a reset); `set_enabled` toggles a flapping link.

The client is synchronous (requests, no timeouts of its own): every call runs in a daemon thread of its
own under `asyncio.wait_for`, so neither the event loop nor its shutdown ever blocks on it. Proxies are
named `<prefix><engine>.<link>` with a per-run prefix, so runs sharing a real Toxiproxy do not collide; they
are deleted when the cell ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar, assert_never

from harness.scenario import EngineSettings
from harness.scenario.links import (
    HealLink,
    LinkBandwidth,
    LinkFault,
    LinkFlap,
    LinkLatency,
    LinkRef,
    LinkReset,
    NetworkAction,
    Partition,
    ToxicPlan,
    fault_kind,
    fault_params,
    toxics_for,
)
from harness.session.events import ActionDone, Event, FaultApplied, FaultVerified, WorldNote
from harness.topology import EngineSpec, Topology
from harness.worlds.real.probes import tcp_probe
from pdchaos.ports import LOOPBACK, free_ports

T = TypeVar("T")
Emit = Callable[[Event], None]

CLIENT_TIMEOUT_S = 5.0


class NetworkError(RuntimeError):
    """The Toxiproxy could not be set up or driven."""


async def call(fn: Callable[[], T], timeout_s: float = CLIENT_TIMEOUT_S) -> T:
    """Run one synchronous toxiproxy-python call in a thread of its own, under a deadline.

    Not the loop's default executor: the client has no socket timeout, and a call that never returns
    would hold that executor's shutdown (and so the end of `asyncio.run`) for good. A daemon thread that
    outlives its deadline is abandoned instead."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the awaiting task, whatever it is
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="pdchaos-toxiproxy-call", daemon=True).start()
    return await asyncio.wait_for(done, timeout_s)


class _SharedToxiproxy:
    """One Toxiproxy per process: the toxiproxy-python client's address is class-wide, so runs side by side
    (e.g. two scenarios under one event loop) share the server, each with its own proxy names. Blocking:
    call from a worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._cm: contextlib.AbstractContextManager[str] | None = None
        self.url: str | None = None

    def acquire(self, seed: int) -> str:
        from harness.toxiproxy import toxiproxy_server

        with self._lock:
            if self._users == 0:
                cm = toxiproxy_server(seed=seed)
                self.url = cm.__enter__()
                self._cm = cm
            self._users += 1
            assert self.url is not None
            return self.url

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._cm is not None:
                cm, self._cm, self.url = self._cm, None, None
                cm.__exit__(None, None, None)


_SHARED = _SharedToxiproxy()


# ---------------------------------------------------------------- the router's view of a proxied topology


def proxy_name(prefix: str, ref: LinkRef) -> str:
    return f"{prefix}{ref.engine}.{ref.link}"


def upstream_port(spec: EngineSpec, link: str, transport: str, side_channel_port: int | None) -> int | None:
    """The real port behind a link (None: not known yet, e.g. a Mooncake side channel before the start)."""
    if link == "serve":
        return spec.serving_port(transport)  # type: ignore[arg-type]
    if link == "bootstrap":
        return spec.bootstrap_port
    return side_channel_port


@dataclass(frozen=True)
class ProxiedTopology(Topology):
    """What the router is told: engines' serving and bootstrap ports replaced by their proxies' listen ports.
    `name_of_url` knows both the proxied and the real URLs, so observers map workers to engine names."""

    real: Topology | None = None

    def name_of_url(self, url: str) -> str | None:
        found = super().name_of_url(url)
        if found is None and self.real is not None:
            found = self.real.name_of_url(url)
        return found


def router_view(topo: Topology, listen: Mapping[LinkRef, int]) -> Topology:
    """`topo` as the router must see it when `listen` (link -> proxy listen port) proxies some links; `topo`
    itself when no router-facing link is proxied."""
    engines = []
    changed = False
    for spec in topo.engines:
        new = spec
        serve = listen.get(LinkRef(spec.name, "serve"))
        if serve is not None:
            field_name = "http_port" if topo.transport == "http" else "grpc_port"
            new = replace(new, **{field_name: serve})
        boot = listen.get(LinkRef(spec.name, "bootstrap"))
        if boot is not None:
            new = replace(new, bootstrap_port=boot)
        changed = changed or new is not spec
        engines.append(new)
    if not changed:
        return topo
    return ProxiedTopology(topo.shape, topo.connector, topo.transport, tuple(engines), topo.router_port,
                           dict(topo.extra_ports), real=topo)


# ---------------------------------------------------------------- the runtime


class LinkFaults:
    """What every link-fault backend does with one action: heal, or put the fault in place (`_put`), then
    report `FaultApplied`, `FaultVerified` with what was seen (`_verify`) and `ActionDone` last. A backend
    says how: Toxiproxy on this host (`NetworkLinks`), a sidecar in a pod (`kube_links.KubeLinks`)."""

    async def apply(self, fid: str, action: NetworkAction, emit: Emit) -> None:
        """Put one network fault in place (or heal), verify it, `ActionDone` last."""
        match action:
            case HealLink():
                ok, evidence = await self._heal(action)
                emit(ActionDone(fid, verified=ok, evidence=evidence))
            case Partition() | LinkLatency() | LinkReset() | LinkBandwidth() | LinkFlap():
                await self._fault(fid, action, emit)
            case _:
                assert_never(action)

    async def _fault(self, fid: str, action: LinkFault, emit: Emit) -> None:
        ref = LinkRef(action.target, action.link)
        await self._check(ref)
        toxics = toxics_for(action, fid)
        params = {**fault_params(action), **await self._put(fid, ref, action, toxics), "link": ref.link}
        if toxics:
            params["toxics"] = [t.body() for t in toxics]
        emit(FaultApplied(fid, fault_kind(action), ref.engine, params, {}, link=ref.link))
        evidence = await self._verify(ref, action, tuple(t.name for t in toxics))
        emit(FaultVerified(fid, bool(evidence["ok"]), evidence))
        emit(ActionDone(fid))

    async def _heal(self, action: HealLink) -> tuple[bool, dict[str, Any]]:
        raise NotImplementedError

    async def _check(self, ref: LinkRef) -> None:
        """Raise when the link cannot be faulted in this cell."""
        raise NotImplementedError

    async def _put(self, fid: str, ref: LinkRef, action: LinkFault,
                   toxics: list[ToxicPlan]) -> dict[str, Any]:
        """Put the fault in place; what to add to the fault's recorded params."""
        raise NotImplementedError

    async def _verify(self, ref: LinkRef, action: LinkFault, toxics: tuple[str, ...]) -> dict[str, Any]:
        raise NotImplementedError


class NetworkLinks(LinkFaults):
    def __init__(self, refs: list[LinkRef], topo: Topology, prefix: str | None = None, seed: int = 0) -> None:
        self.refs = refs
        self.topo = topo
        self.prefix = prefix or f"pdchaos-{uuid.uuid4().hex[:6]}-"
        self.seed = seed
        self.url: str | None = None
        self.listen: dict[LinkRef, int] = {}
        self.installed: dict[LinkRef, str] = {}  # link -> proxy name
        self._acquired = False

    @property
    def enabled(self) -> bool:
        return bool(self.refs)

    # -- lifetime

    async def open(self) -> list[Event]:
        """Reserve the proxies' ports and reach a Toxiproxy; the notes to record."""
        if not self.refs:
            return []
        ports = free_ports(len(self.refs))
        self.listen = dict(zip(self.refs, ports, strict=True))
        self.url = await call(lambda: _SHARED.acquire(self.seed), 15.0)
        self._acquired = True
        return [WorldNote("toxiproxy", {"url": self.url, "links": [r.label for r in self.refs]})]

    async def close(self) -> None:
        try:
            for name in list(self.installed.values()):
                with contextlib.suppress(Exception):
                    await call(lambda n=name: _client().get_proxy(n) and _client().get_proxy(n).destroy())
            self.installed.clear()
        finally:
            if self._acquired:
                self._acquired = False
                await call(_SHARED.release, 15.0)

    # -- set-up

    def engine_settings(self, settings: EngineSettings) -> EngineSettings:
        """Engine settings with each proxied side channel's prefill told to advertise the proxy's port."""
        per = {k: dict(v) for k, v in settings.per_engine.items()}
        for ref, port in self.listen.items():
            if ref.link == "side_channel":
                per.setdefault(ref.engine, {})["advertise_side_channel_port"] = port
        return settings if per == {k: dict(v) for k, v in settings.per_engine.items()} else replace(
            settings, per_engine=per)

    @property
    def router_topology(self) -> Topology:
        return router_view(self.topo, self.listen)

    async def install(self, fleet: Any, emit: Emit) -> None:
        """Create every link's proxy (engines serving: a Mooncake side channel's port is known by now)."""
        for ref in self.refs:
            if ref in self.installed:
                continue
            side = None
            if ref.link == "side_channel":
                st = await fleet.state(ref.engine)
                side = (st or {}).get("side_channel_port")
            port = upstream_port(self.topo.engine(ref.engine), ref.link, self.topo.transport, side)
            if not port:
                raise NetworkError(f"link {ref.label}: upstream port unknown (engine state: no side channel)")
            name = proxy_name(self.prefix, ref)
            listen = f"{LOOPBACK}:{self.listen[ref]}"
            upstream = f"{LOOPBACK}:{port}"
            await call(lambda n=name, u=upstream, li=listen: _client().create(upstream=u, name=n, listen=li,
                                                                              enabled=True))
            self.installed[ref] = name
            emit(WorldNote(f"proxy {name}: {listen} -> {upstream}",
                           {"link": ref.label, "proxy": name, "listen": listen, "upstream": upstream}))

    # -- faults

    async def _check(self, ref: LinkRef) -> None:
        if ref not in self.installed:
            raise NetworkError(f"link {ref.label} has no proxy (this cell's connector has no such link)")

    async def _put(self, fid: str, ref: LinkRef, action: LinkFault,
                   toxics: list[ToxicPlan]) -> dict[str, Any]:
        name = self.installed[ref]
        params = {"proxy": name, "listen_port": self.listen[ref]}
        if not toxics:  # down or flapping: the proxy stops listening
            await self.set_enabled(ref, False)
        else:
            for toxic in toxics:
                await call(lambda t=toxic: _proxy(name).add_toxic(**t.body()))
        return params

    async def _verify(self, ref: LinkRef, action: LinkFault, toxics: tuple[str, ...]) -> dict[str, Any]:
        name = self.installed[ref]
        port = self.listen[ref]
        spec = await call(lambda: _proxy(name))
        listed = sorted(await call(lambda: list(_proxy(name).toxics())))
        seen = await tcp_probe(port)
        evidence: dict[str, Any] = {"proxy": name, "enabled": spec.enabled, "toxics": listed, "probe": seen}
        all_listed = all(t in listed for t in toxics)
        if not toxics:  # down or flapping: the proxy no longer listens
            ok = spec.enabled is False and seen == "refused"
        elif isinstance(action, Partition):  # timeout toxics: accepted, then nothing
            ok = all_listed and seen == "silent"
        else:
            ok = all_listed
        evidence["ok"] = ok
        return evidence

    async def _heal(self, action: HealLink) -> tuple[bool, dict[str, Any]]:
        refs = [r for r in self.installed if r.engine == action.target
                and (action.link is None or r.link == action.link)]
        if not refs:
            raise NetworkError(f"heal {action.target}.{action.link or '*'}: no proxied link")
        evidence: dict[str, Any] = {}
        ok = True
        for ref in refs:
            await self._clean(ref)
            listed = await call(lambda n=self.installed[ref]: list(_proxy(n).toxics()))
            seen = await tcp_probe(self.listen[ref])
            evidence[ref.label] = {"toxics": listed, "probe": seen}
            # A KV side channel may reset a probe's junk bytes: only refused/silent mean still broken.
            ok = ok and not listed and seen in ("answered", "closed", "reset")
        return ok, evidence

    async def _clean(self, ref: LinkRef) -> None:
        """Whatever the faults were, the link ends clean: enabled, no toxic of ours left."""
        name = self.installed[ref]
        await self.set_enabled(ref, True)
        for t in await call(lambda: list(_proxy(name).toxics())):
            if t.startswith("pdchaos-"):
                await call(lambda t=t: _proxy(name).destroy_toxic(t))

    async def set_enabled(self, ref: LinkRef, enabled: bool) -> None:
        name = self.installed.get(ref)
        if name is None:
            raise NetworkError(f"link {ref.label} has no proxy")

        def go() -> None:
            p = _proxy(name)
            p.enable() if enabled else p.disable()

        await call(go)

    def proxies(self) -> Iterator[tuple[LinkRef, str, int]]:
        for ref, name in self.installed.items():
            yield ref, name, self.listen[ref]


def _client() -> Any:
    from toxiproxy import Toxiproxy

    return Toxiproxy()


def _proxy(name: str) -> Any:
    p = _client().get_proxy(name)
    if p is None:
        raise NetworkError(f"proxy {name!r} not found on the Toxiproxy server")
    return p
