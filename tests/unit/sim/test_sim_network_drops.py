"""The simulated network takes a link down as Toxiproxy does a disabled proxy: new connections are refused
and the calls open on it are dropped (the caller reads an end of stream, the server's work is cut). Work
cut twice at one instant is cut once, and a process is never hit after it left the work that was cut."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from harness.scenario.links import LinkRef
from harness.worlds.sim.network import CallResult, Reply, SimNetwork, cut_work, wait

REF = LinkRef("decode-0", "serve")
OTHER = LinkRef("prefill-0", "side_channel")


class Server:
    """Serves every call with `handler`, and notes whether its work was cut."""

    def __init__(self) -> None:
        self.cut = 0

    def accepting(self, link: str) -> bool:
        return True

    def epoch(self, link: str) -> int:
        return 0

    def serve(self, handler: Any, deadline: float | None, link: str, epoch: int | None
              ) -> Generator[Any, Any, Reply]:
        try:
            return (yield from handler(deadline))
        except simpy.Interrupt:
            self.cut += 1
            raise


def _call(env: simpy.Environment, net: SimNetwork, ref: LinkRef, work_s: float,
          out: list[CallResult]) -> Generator[Any, Any, None]:
    def handler(deadline: float | None) -> Generator[Any, Any, Reply]:
        yield from wait(env, work_s, deadline)
        return Reply("answer")

    out.append((yield from net.call(ref, Server(), handler, 100, 5.0)))


def _at(env: simpy.Environment, t: float, action: Any) -> Generator[Any, Any, None]:
    yield env.timeout(t)
    action()


def test_taking_a_link_down_drops_the_calls_open_on_it() -> None:
    env = simpy.Environment()
    net = SimNetwork(env, (REF, OTHER), seed=0)
    on_link: list[CallResult] = []
    elsewhere: list[CallResult] = []
    env.process(_call(env, net, REF, 1.0, on_link))
    env.process(_call(env, net, OTHER, 1.0, elsewhere))
    env.process(_at(env, 0.5, lambda: net.set_enabled(REF, False)))
    env.run()
    assert on_link[0].error == "closed" and abs(on_link[0].elapsed - 0.5) < 1e-9
    assert elsewhere[0].ok and elsewhere[0].value == "answer"
    assert net.link(REF).open_calls == {}  # type: ignore[union-attr]


def test_a_link_taken_down_refuses_new_calls_and_serves_again_once_up() -> None:
    env = simpy.Environment()
    net = SimNetwork(env, (REF,), seed=0)
    net.set_enabled(REF, False)
    out: list[CallResult] = []
    env.process(_call(env, net, REF, 0.1, out))
    env.run()
    net.set_enabled(REF, True)
    env.process(_call(env, net, REF, 0.1, out))
    env.run()
    assert [r.error for r in out] == ["refused", None]


def test_a_call_that_ended_before_the_link_went_down_is_untouched() -> None:
    env = simpy.Environment()
    net = SimNetwork(env, (REF,), seed=0)
    out: list[CallResult] = []
    env.process(_call(env, net, REF, 0.1, out))
    env.process(_at(env, 0.5, lambda: net.set_enabled(REF, False)))
    env.run()
    assert out[0].ok


def test_work_cut_twice_at_one_instant_is_cut_once_and_never_after_it_left() -> None:
    env = simpy.Environment()
    work: dict[object, simpy.Process] = {}
    seen: list[str] = []

    def worker() -> Generator[Any, Any, None]:
        token = object()
        work[token] = env.active_process  # type: ignore[assignment]
        try:
            yield env.timeout(10.0)
        except simpy.Interrupt as stop:
            seen.append(f"cut by {stop.cause}")
        finally:
            work.pop(token, None)
        # Out of the work: a second cut scheduled at the same instant must not land here.
        yield env.timeout(1.0)
        seen.append(f"went on to {env.now:g}")

    def cutter() -> Generator[Any, Any, None]:
        yield env.timeout(2.0)
        cut_work(env, work, "first")
        cut_work(env, work, "second")

    env.process(worker())
    env.process(cutter())
    env.run()
    assert seen == ["cut by first", "went on to 3"]
