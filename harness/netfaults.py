"""Network faults in a real-time run: Toxiproxy proxies on a scenario's links, driven by toxiproxy-python.

`NetworkLinks.for_scenario(scenario, topo, history)` is an async context manager. With no network action
in the timeline it does nothing (no server, `router_topology` is the topology). Otherwise it uses the
Toxiproxy at `TOXIPROXY_URL`, else starts the embedded one on a thread (`harness.network.toxiproxy_server`),
and:
- `engine_settings(...)` tells each prefill with a proxied side channel to advertise the proxy's port;
- `install(fleet)` creates one proxy per link once the engines serve (a Mooncake side channel's port is only
  known then);
- `router_topology` is what the router must be given (serving/bootstrap ports through the proxies);
- `apply(fault_id, action, injector)` applies a network action, verifies it (connect refused, toxic listed,
  a probe that gets no answer or a reset) and records `fault_applied` / `fault_verified` / `fault_healed`.

The client is synchronous (requests, no timeouts of its own): every call runs in a worker thread under
`asyncio.wait_for`, so the event loop never blocks on it. Proxies are named `<prefix><engine>.<link>` with a
per-run prefix, so runs sharing a real Toxiproxy do not collide; they are deleted when the block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, TypeVar

from harness.history import HistoryRecorder
from harness.netlinks import (
    HealLink,
    LinkFault,
    LinkFlap,
    LinkRef,
    Partition,
    fault_kind,
    fault_params,
    flap_schedule,
    is_network_action,
    links_in,
    proxy_name,
    router_view,
    toxics_for,
    upstream_port,
)
from harness.scenario import EngineSettings, Scenario
from harness.topology import Topology
from pdchaos.ports import LOOPBACK, free_ports

T = TypeVar("T")

CLIENT_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 1.0
# A wedged link answers nothing for at least this long before the probe calls it silent.
SILENT_WINDOW_S = 0.3
# Bytes a probe sends: an HTTP request most servers answer at once (an HTTP/2 or KV server closes on it).
PROBE_BYTES = b"GET /health HTTP/1.0\r\nHost: pdchaos\r\n\r\n"


class NetworkError(RuntimeError):
    """The Toxiproxy could not be set up or driven."""


async def call(fn: Callable[[], T], timeout_s: float = CLIENT_TIMEOUT_S) -> T:
    """Run one synchronous toxiproxy-python call in a worker thread, under a deadline."""
    return await asyncio.wait_for(asyncio.to_thread(fn), timeout_s)


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
        from harness.network import toxiproxy_server

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


# ---------------------------------------------------------------- probes through a proxy (asyncio, bounded)


async def probe(port: int, window_s: float = SILENT_WINDOW_S) -> str:
    """What one connection through `127.0.0.1:port` sees: `refused`, `silent` (accepted, nothing back within
    window_s), `reset`, `closed` (ended with no data) or `answered`."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), PROBE_TIMEOUT_S)
    except ConnectionRefusedError:
        return "refused"
    except (TimeoutError, OSError) as e:
        return f"error:{type(e).__name__}"
    try:
        writer.write(PROBE_BYTES)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(1), window_s)
        return "answered" if data else "closed"
    except TimeoutError:
        return "silent"
    except ConnectionResetError:
        return "reset"
    except OSError as e:
        return f"error:{type(e).__name__}"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 0.5)


# ---------------------------------------------------------------- the runtime


@dataclass
class _Active:
    fault: str
    kind: str
    ref: LinkRef
    toxics: tuple[str, ...]
    task: asyncio.Task[None] | None = None


class NetworkLinks:
    def __init__(self, refs: list[LinkRef], topo: Topology, history: HistoryRecorder,
                 prefix: str | None = None, seed: int = 0) -> None:
        self.refs = refs
        self.topo = topo
        self.history = history
        self.prefix = prefix or f"pdchaos-{uuid.uuid4().hex[:6]}-"
        self.seed = seed
        self.url: str | None = None
        self.listen: dict[LinkRef, int] = {}
        self.installed: dict[LinkRef, str] = {}  # link -> proxy name
        self.active: list[_Active] = []
        self._acquired = False

    @classmethod
    def for_scenario(cls, scenario: Scenario, topo: Topology, history: HistoryRecorder,
                     seed: int = 0) -> NetworkLinks:
        return cls(links_in(scenario.timeline, topo.connector), topo, history, seed=seed)

    @property
    def enabled(self) -> bool:
        return bool(self.refs)

    # -- lifetime

    async def __aenter__(self) -> NetworkLinks:
        if not self.refs:
            return self
        ports = free_ports(len(self.refs))
        self.listen = dict(zip(self.refs, ports, strict=True))
        self.url = await call(lambda: _SHARED.acquire(self.seed), 15.0)
        self._acquired = True
        self.history.note("toxiproxy", url=self.url, links=[r.label for r in self.refs])
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            for a in list(self.active):
                if a.task is not None:
                    a.task.cancel()
                    with contextlib.suppress(BaseException):
                        await a.task
                self._healed(a, reason="end of run")
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

    async def install(self, fleet: Any) -> None:
        """Create every link's proxy (engines serving: a Mooncake side channel's port is known by now)."""
        for ref in self.refs:
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
            self.history.note(f"proxy {name}: {listen} -> {upstream}", link=ref.label, proxy=name,
                              listen=listen, upstream=upstream)

    # -- faults

    def handles(self, action: object) -> bool:
        return is_network_action(action)

    async def apply(self, fid: str, action: Any, injector: Any) -> None:
        """Apply, verify and record one network action; failures go to `injector.failures`."""
        if isinstance(action, HealLink):
            await self._heal(fid, action, injector)
            return
        ref = LinkRef(action.target, action.link)
        if ref not in self.installed:
            raise NetworkError(f"link {ref.label} has no proxy (this cell's connector has no such link)")
        name = self.installed[ref]
        kind = fault_kind(action)
        toxics = toxics_for(action, fid)
        params = {**fault_params(action), "proxy": name, "listen_port": self.listen[ref]}
        active = _Active(fid, kind, ref, tuple(t.name for t in toxics))
        if isinstance(action, LinkFlap):
            await self._set_enabled(name, False)
            self._applied(fid, kind, ref, params)
            self.active.append(active)
            evidence = await self._verify(ref, action, ())
            active.task = asyncio.create_task(self._flap(active, action))
        elif not toxics:  # Partition down
            await self._set_enabled(name, False)
            self._applied(fid, kind, ref, params)
            self.active.append(active)
            evidence = await self._verify(ref, action, ())
        else:
            for toxic in toxics:
                await call(lambda t=toxic: _proxy(name).add_toxic(**t.body()))
            self._applied(fid, kind, ref, {**params, "toxics": [t.body() for t in toxics]})
            self.active.append(active)
            evidence = await self._verify(ref, action, active.toxics)
        self.history.fault_verified(fid, bool(evidence["ok"]), evidence)
        if not evidence["ok"]:
            injector.failures.append(f"{fid}: not verified ({evidence})")

    async def _verify(self, ref: LinkRef, action: LinkFault, toxics: tuple[str, ...]) -> dict[str, Any]:
        name = self.installed[ref]
        port = self.listen[ref]
        spec = await call(lambda: _proxy(name))
        listed = sorted(await call(lambda: list(_proxy(name).toxics())))
        seen = await probe(port)
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

    async def _flap(self, active: _Active, action: LinkFlap) -> None:
        name = self.installed[active.ref]
        loop = asyncio.get_running_loop()
        start = loop.time()
        for offset, enabled in flap_schedule(action.down_s, action.up_s, action.cycles)[1:]:
            await asyncio.sleep(max(0.0, start + offset - loop.time()))
            await self._set_enabled(name, enabled)
            self.history.note(f"flap {active.ref.label} {'up' if enabled else 'down'}", fault=active.fault,
                              enabled=enabled)
        self._healed(active, reason="flapping ended")

    async def _heal(self, fid: str, action: HealLink, injector: Any) -> None:
        refs = [r for r in self.installed if r.engine == action.target
                and (action.link is None or r.link == action.link)]
        if not refs:
            raise NetworkError(f"heal {action.target}.{action.link or '*'}: no proxied link")
        healed: list[str] = []
        evidence: dict[str, Any] = {}
        ok = True
        for ref in refs:
            healed += await self._clean(ref)
            listed = await call(lambda n=self.installed[ref]: list(_proxy(n).toxics()))
            seen = await probe(self.listen[ref])
            evidence[ref.label] = {"toxics": listed, "probe": seen}
            # A KV side channel may reset a probe's junk bytes: only refused/silent mean still broken.
            ok = ok and not listed and seen in ("answered", "closed", "reset")
            for a in [a for a in self.active if a.ref == ref]:
                self._healed(a)
        self.history.note(f"heal {action.target} {action.link or 'all links'}: {healed}", fault=fid,
                          evidence=evidence, healed=healed)
        if not ok:
            injector.failures.append(f"{fid}: heal not verified ({evidence})")

    async def _clean(self, ref: LinkRef) -> list[str]:
        """End the link's faults (flapping cancelled, our toxics removed, proxy enabled); their ids."""
        name = self.installed[ref]
        ended = []
        for a in [a for a in self.active if a.ref == ref]:
            if a.task is not None:
                a.task.cancel()
                with contextlib.suppress(BaseException):
                    await a.task
            ended.append(a.fault)
        # Whatever the faults were, the link ends clean: enabled, no toxic of ours left.
        await self._set_enabled(name, True)
        for t in await call(lambda: list(_proxy(name).toxics())):
            if t.startswith("pdchaos-"):
                await call(lambda t=t: _proxy(name).destroy_toxic(t))
        return ended

    # -- bookkeeping

    async def _set_enabled(self, name: str, enabled: bool) -> None:
        def go() -> None:
            p = _proxy(name)
            p.enable() if enabled else p.disable()

        await call(go)

    def _applied(self, fid: str, kind: str, ref: LinkRef, params: dict[str, Any]) -> None:
        self.history.fault_applied(fid, kind, ref.engine, {**params, "link": ref.link}, {})

    def _healed(self, a: _Active, reason: str | None = None) -> None:
        if a not in self.active:
            return
        self.active.remove(a)
        self.history.fault_healed(a.fault, a.kind, a.ref.engine, link=a.ref.link, **(
            {"reason": reason} if reason else {}))

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
