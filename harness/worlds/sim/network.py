"""The simulated network: every call between the router, the engines and their side channels crosses it.

A call is one connection: the request travels upstream, the server works on it, the answer travels back
downstream. On a link the scenario puts faults on (`CellPlan.links`) the link can be disabled (connects
refused, the calls open on it dropped, as a disabled proxy drops its connections) and carry Toxiproxy
toxics; their effect on a message is computed by the very toxic stages the embedded Toxiproxy runs
(`harness.toxiproxy.chain`): latency, bandwidth, timeout (silence, or a close), reset_peer, slicer,
limit_data. Every other hop costs a fixed one-way latency. The caller waits at most its timeout; a caller
that gives up interrupts the server's work (as a closed connection cancels a request).
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
_INF = float("inf")


class Refused(Exception):
    """Nothing accepts connections there (engine down or loading, link disabled)."""


class Deadline(Exception):
    """A wait reached the deadline `at` of a caller: the work unwinds to the call that set it (a closed
    connection cancels the server's work, as in the real servers)."""

    def __init__(self, at: float) -> None:
        super().__init__(at)
        self.at = at


# What a server answers when its work was cut (its process stopped): the connection resets.
CUT = object()
# The interrupt cause, with the link, that drops the calls open on a link taken down.
_DROPPED = "link dropped"


class _GuardedInterruption(simpy.events.Interruption):
    """An interrupt that reaches its process only if `still()` holds when it arrives."""

    def __init__(self, process: simpy.Process, cause: Any, still: Callable[[], bool]) -> None:
        self._still = still
        super().__init__(process, cause)

    def _interrupt(self, event: simpy.Event) -> None:
        if self._still():
            super()._interrupt(event)


def cut_work(env: simpy.Environment, work: dict[object, simpy.Process], cause: Any) -> None:
    """Interrupt, with `cause`, every process in `work` (token -> process: what it registered while it works
    there, and removes when it leaves). Each interrupt lands only if its process is still registered when it
    arrives: work cut by two things at one instant (an engine killed as its link goes down) is cut once,
    and a process that left in between is not hit in whatever it does next."""
    for token, proc in list(work.items()):
        if proc.is_alive and proc is not env.active_process:
            _GuardedInterruption(proc, cause, lambda t=token, p=proc: work.get(t) is p)


def wait(env: simpy.Environment, delay: float, deadline: float | None) -> Generator[Any, Any, None]:
    """Let `delay` pass (inf: forever), unless `deadline` comes first (then Deadline)."""
    now = env.now  # read once: every hop of every call waits here
    end = now + (delay if delay > 0.0 else 0.0)
    if deadline is not None and end > deadline:
        if deadline > now:
            yield env.timeout(deadline - now)
        raise Deadline(deadline)
    if end == _INF:
        yield env.event()  # a wait with no end and no deadline: the process hangs, as a real one would
    elif end > now:
        yield env.timeout(end - now)


def wait_event(
    env: simpy.Environment, event: simpy.Event, deadline: float | None
) -> Generator[Any, Any, None]:
    """Wait for `event`, unless `deadline` comes first (then Deadline)."""
    if deadline is None:
        yield event
        return
    if env.now >= deadline:
        raise Deadline(deadline)
    timer = env.timeout(deadline - env.now)
    yield env.any_of([event, timer])
    if not event.triggered:
        raise Deadline(deadline)


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
    # The processes with a call open on the link, in the order they connected (a link taken down drops
    # them in that order, whatever their addresses).
    open_calls: dict[object, simpy.Process] = field(default_factory=dict)

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

    def set_enabled(self, ref: LinkRef, enabled: bool) -> None:
        """Take a link down (new connections refused, open ones dropped, as Toxiproxy does to a disabled
        proxy) or up again."""
        state = self.links[ref]
        state.enabled = enabled
        if enabled:
            return
        cut_work(self.env, state.open_calls, (_DROPPED, ref))

    def clean(self, ref: LinkRef) -> None:
        state = self.links[ref]
        state.enabled = True
        state.toxics = [t for t in state.toxics if not t.name.startswith("pdchaos-")]

    # -- a message on one direction --------------------------------------------------------------------------

    def transit(self, ref: LinkRef | None, stream: str, nbytes: int, at: float) -> Transit:
        state = self.links.get(ref) if ref is not None else None
        if state is None or not state.toxics:  # the common case: a plain hop
            return Transit(arrive=at + HOP_S)
        specs = state.specs(stream)
        if not specs:
            return Transit(arrive=at + HOP_S)
        assert ref is not None
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
        server: Any,
        handler: Callable[[float | None], Generator[Any, Any, Reply]],
        request_bytes: int,
        timeout_s: float | None,
        outer: float | None = None,
    ) -> Generator[Any, Any, CallResult]:
        """One request/answer over `ref` (None: a hop no fault sits on) to `server` (an engine:
        `accepting(link)`, `epoch(link)`, `serve(handler, deadline, link, epoch)`), within `timeout_s`, inside
        a caller whose own deadline is `outer`. Runs in the caller's process: `result = yield from
        network.call(...)`. The caller's deadline passing raises Deadline past this call; the call's own
        gives a "timeout" result."""
        env = self.env
        start = env.now
        own = None if timeout_s is None else start + max(0.0, timeout_s)
        deadline = outer if own is None else own if outer is None else min(own, outer)
        state = self.links.get(ref) if ref is not None else None
        link = ref.link if ref is not None else "serve"
        if (state is not None and not state.enabled) or not server.accepting(link):
            yield from wait(env, HOP_S, outer)
            return CallResult(error="refused", elapsed=env.now - start)
        epoch = server.epoch(link)
        token = object()
        if state is not None:
            state.connections += 1
            if env.active_process is not None:
                state.open_calls[token] = env.active_process
        try:
            up = self.transit(ref, "upstream", request_bytes, env.now)
            if up.arrive is None:
                yield from wait(env, float("inf") if up.at is None else up.at - env.now, deadline)
                return CallResult(error=up.broken, elapsed=env.now - start)
            yield from wait(env, up.arrive - env.now, deadline)
            reply: Reply = yield from server.serve(handler, deadline, link, epoch)
            if reply.value is CUT:
                return CallResult(error="reset", elapsed=env.now - start)
            down = self.transit(ref, "downstream", reply.nbytes, env.now)
            if down.arrive is None:
                yield from wait(env, float("inf") if down.at is None else down.at - env.now, deadline)
                return CallResult(error=down.broken, elapsed=env.now - start)
            yield from wait(env, down.arrive - env.now, deadline)
            return CallResult(reply.value, elapsed=env.now - start)
        except Deadline as passed:
            if own is not None and passed.at == own:
                return CallResult(error="timeout", elapsed=env.now - start)
            raise
        except simpy.Interrupt as cut:
            if cut.cause != (_DROPPED, ref):
                raise
            # The proxy aborts both sides: the caller reads an end of stream.
            return CallResult(error="closed", elapsed=env.now - start)
        finally:
            if state is not None:
                state.open_calls.pop(token, None)
