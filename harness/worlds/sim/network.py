"""The simulated network: every call between the router, the engines and their side channels crosses it.

A call is one connection: the request travels upstream, the server works on it, the answer travels back
downstream. On a link the scenario puts faults on (`CellPlan.links`) the link can be disabled (connects
refused) and carry Toxiproxy toxics; their effect on a message is computed by the very toxic stages the
embedded Toxiproxy runs (`harness.toxiproxy.chain`): latency, bandwidth, timeout (silence, or a close),
reset_peer, slicer, limit_data. Every other hop costs a fixed one-way latency. The caller waits at most its
timeout; a caller that gives up interrupts the server's work (as a closed connection cancels a request).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from harness.scenario.links import LinkRef, ToxicPlan
from harness.toxiproxy.chain import DirectionChain
from harness.toxiproxy.toxics import ToxicSpec

# One-way latency of a hop on loopback (connect + write + read of a small message).
HOP_S = 0.0002

Server = Callable[[], Generator[Any, Any, "Reply"]]


class Refused(Exception):
    """Nothing accepts connections there (engine down or loading, link disabled)."""


# What a server answers when its work was cut (its process stopped, its caller gone): the connection resets.
CUT = object()


@dataclass(frozen=True)
class Reply:
    """What a server answers and how many bytes travel back."""

    value: Any
    nbytes: int = 256


@dataclass(frozen=True)
class CallResult:
    """`error`: None (answered), "refused", "timeout", "reset" or "closed"."""

    value: Any = None
    error: str | None = None
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class LinkState:
    enabled: bool = True
    toxics: list[ToxicSpec] = field(default_factory=list)
    connections: int = 0

    def specs(self, stream: str) -> list[ToxicSpec]:
        return [t for t in self.toxics if t.stream == stream]


@dataclass(frozen=True)
class Transit:
    """A message's fate on one direction: delivered at `arrive`, broken (`close`/`reset`) at `at`, or
    silent (neither: it never gets through)."""

    arrive: float | None = None
    broken: str | None = None
    at: float | None = None


class SimNetwork:
    def __init__(self, env: simpy.Environment, links: tuple[LinkRef, ...], seed: int) -> None:
        self.env = env
        self.seed = seed
        self.links: dict[LinkRef, LinkState] = {ref: LinkState() for ref in links}
        self._version = 0

    # -- link faults (what the world applies) ----------------------------------------------------------------

    def link(self, ref: LinkRef) -> LinkState | None:
        return self.links.get(ref)

    def add_toxics(self, ref: LinkRef, plans: list[ToxicPlan]) -> list[str]:
        state = self.links[ref]
        for p in plans:
            self._version += 1
            state.toxics.append(ToxicSpec(p.name, p.type, p.stream, 1.0, dict(p.attributes), self._version))
        return sorted(t.name for t in state.toxics)

    def clean(self, ref: LinkRef) -> None:
        state = self.links[ref]
        state.enabled = True
        state.toxics = [t for t in state.toxics if not t.name.startswith("pdchaos-")]

    # -- a message on one direction --------------------------------------------------------------------------

    def transit(self, ref: LinkRef | None, stream: str, nbytes: int, at: float) -> Transit:
        state = self.links.get(ref) if ref is not None else None
        specs = state.specs(stream) if state is not None else []
        if not specs:
            return Transit(arrive=at + HOP_S)
        assert state is not None and ref is not None
        chain = DirectionChain(self.seed, ref.label, state.connections, stream)
        chain.sync(specs, at)
        chain.feed(bytes(max(1, nbytes)), at)
        delivered, last, t = 0, at, at
        while True:
            for out in chain.poll(t):
                if out.kind in ("close", "reset"):
                    return Transit(broken=out.kind, at=out.at)
                if out.kind == "data":
                    delivered += len(out.data)
                    last = out.at
            if delivered >= max(1, nbytes):
                return Transit(arrive=last + HOP_S)
            nxt = chain.next_deadline()
            if nxt is None:
                return Transit()
            t = max(t, nxt)

    # -- a call ----------------------------------------------------------------------------------------------

    def call(
        self,
        ref: LinkRef | None,
        accepting: Callable[[], bool],
        server: Server,
        request_bytes: int,
        timeout_s: float | None,
    ) -> Generator[Any, Any, CallResult]:
        """One request/answer over `ref` (None: a hop no fault sits on) to a server that `accepting()` says
        listens. A simpy process body: `result = yield from network.call(...)`."""
        env = self.env
        start = env.now
        state = self.links.get(ref) if ref is not None else None
        if (state is not None and not state.enabled) or not accepting():
            yield env.timeout(HOP_S)
            return CallResult(error="refused", elapsed=env.now - start)
        if state is not None:
            state.connections += 1
        done = env.event()
        exchange = env.process(self._exchange(ref, server, request_bytes, done))
        waits: list[simpy.Event] = [done]
        if timeout_s is not None:
            waits.append(env.timeout(max(0.0, timeout_s)))
        yield env.any_of(waits)
        if done.triggered:
            result: CallResult = done.value
            return CallResult(result.value, result.error, env.now - start)
        if exchange.is_alive:
            exchange.interrupt("caller gave up")
        return CallResult(error="timeout", elapsed=env.now - start)

    def _exchange(
        self, ref: LinkRef | None, server: Server, request_bytes: int, done: simpy.Event
    ) -> Generator[Any, Any, None]:
        env = self.env
        try:
            up = self.transit(ref, "upstream", request_bytes, env.now)
            if up.arrive is None:
                if up.broken is not None:
                    yield env.timeout(max(0.0, (up.at or env.now) - env.now))
                    done.succeed(CallResult(error=up.broken))
                return  # silent: only the caller's timeout ends it
            yield env.timeout(max(0.0, up.arrive - env.now))
            work = env.process(server())
            try:
                reply: Reply = yield work
            except simpy.Interrupt:
                if work.is_alive:
                    work.interrupt("connection closed")
                raise
            if reply.value is CUT:
                done.succeed(CallResult(error="reset"))
                return
            down = self.transit(ref, "downstream", reply.nbytes, env.now)
            if down.arrive is None:
                if down.broken is not None:
                    yield env.timeout(max(0.0, (down.at or env.now) - env.now))
                    done.succeed(CallResult(error=down.broken))
                return
            yield env.timeout(max(0.0, down.arrive - env.now))
            done.succeed(CallResult(reply.value))
        except simpy.Interrupt:
            return
