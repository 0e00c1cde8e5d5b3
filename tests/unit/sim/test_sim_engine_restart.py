"""A simulated restart in place closes an engine's servers as the real engine does: new connections are
refused at once, work in progress may finish within the shutdown grace (SHUTDOWN_GRACE_S), what is left is
then cut, and the side channels are cut first on an HTTP cell."""

from __future__ import annotations

import uuid
from collections.abc import Generator
from typing import Any

import pytest
import simpy

from fake_engines.core.gen_request import gen_request_from_openai
from fake_engines.core.timing import SHUTDOWN_GRACE_S
from harness.runner import sim_topology
from harness.scenario import EngineSettings
from harness.scenario.links import LinkRef, ToxicPlan
from harness.topology import Topology
from harness.worlds.sim.engine import SimEngine
from harness.worlds.sim.network import HOP_S, CallResult, LinkState, Reply, SimNetwork, wait


class Cell:
    """The least of a cell one engine needs (harness.worlds.sim.cell.CellView)."""

    def __init__(self, topology: Topology) -> None:
        self.env = simpy.Environment()
        self.net = SimNetwork(self.env, (), seed=0)
        self.topology = topology
        self.seed = 0
        self._ids = iter(range(1, 1_000_000))

    def wall(self, now: float) -> float:
        return 1_000.0 + now

    def new_side_port(self, engine: str) -> int:
        return 40_000 + next(self._ids)

    def add_engine_record(self, record: dict[str, Any]) -> None:
        pass

    def engine_at_url(self, url: str) -> Any:
        return None

    def engine_at_port(self, port: int) -> Any:
        return None

    def new_id(self) -> uuid.UUID:
        return uuid.UUID(int=next(self._ids), version=4)


def _engine(transport: str, itl_ms: float) -> tuple[Cell, SimEngine]:
    cell = Cell(sim_topology("1p1d", "mooncake", transport))
    spec = next(e for e in cell.topology.engines if e.role == "decode")
    settings = EngineSettings(ttft_ms=10.0, itl_ms=itl_ms).for_engine(spec.name)
    engine = SimEngine(cell, spec, settings, cell.new_id, first_pid=100)
    cell.env.process(engine.start(new_process=False))
    cell.env.run(until=0.1)
    assert engine.accepting()
    return cell, engine


def _generate(cell: Cell, engine: SimEngine, tokens: int, out: list[CallResult],
              at: float) -> Generator[Any, Any, None]:
    yield cell.env.timeout(at - cell.env.now)
    req, _ = gen_request_from_openai({"prompt": "hello there", "max_tokens": tokens}, False,
                                     f"cmpl-{tokens}", None)
    out.append((yield from cell.net.call(LinkRef(engine.name, "serve"), engine,
                                         lambda d: engine.generate(req, d), 256, 30.0)))


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_work_in_progress_gets_the_grace_then_is_cut(transport: str) -> None:
    cell, engine = _engine(transport, itl_ms=50.0)
    short: list[CallResult] = []  # about 0.06 s left at the restart: it finishes within the grace
    long: list[CallResult] = []  # about 1 s left: cut when the grace ends
    late: list[CallResult] = []  # comes while the servers close: refused
    cell.env.process(_generate(cell, engine, 3, short, at=0.1))
    cell.env.process(_generate(cell, engine, 21, long, at=0.1))
    cell.env.process(_generate(cell, engine, 3, late, at=0.25))

    def restart() -> Generator[Any, Any, None]:
        yield cell.env.timeout(0.1)
        yield from engine.restart(down_s=1.0)

    cell.env.process(restart())
    cell.env.run(until=0.2 + 0.9 * SHUTDOWN_GRACE_S)
    assert not engine.accepting()
    assert short and short[0].ok and not long  # the short one is done, the long one still running
    cell.env.run(until=5.0)
    assert long[0].error == "reset" and long[0].elapsed == pytest.approx(0.1 + SHUTDOWN_GRACE_S, abs=1e-3)
    assert late[0].error == "refused"
    assert engine.accepting() and engine.state.identity.generation == 2


def test_a_restart_with_nothing_in_progress_is_as_quick_as_before() -> None:
    cell, engine = _engine("http", itl_ms=5.0)
    cell.env.process(engine.restart(down_s=0.3))
    cell.env.run(until=0.1 + 0.3 + 0.05)
    assert engine.accepting()


def test_side_channel_work_is_cut_at_once_on_an_http_cell() -> None:
    cell, engine = _engine("http", itl_ms=5.0)
    got: list[CallResult] = []

    def pull(deadline: float | None) -> Generator[Any, Any, Reply]:
        yield from wait(cell.env, 1.0, deadline)
        return Reply("kv")

    def puller() -> Generator[Any, Any, None]:
        got.append((yield from cell.net.call(LinkRef(engine.name, "side_channel"), engine, pull, 128, 5.0)))

    def restart_soon() -> Generator[Any, Any, None]:
        yield cell.env.timeout(0.05)
        yield from engine.restart(down_s=0.3)

    cell.env.process(puller())
    cell.env.process(restart_soon())
    cell.env.run(until=2.0)
    assert got[0].error == "reset" and got[0].elapsed == pytest.approx(0.05)


def test_a_request_still_on_its_way_when_the_servers_close_is_reset() -> None:
    cell, engine = _engine("http", itl_ms=5.0)
    got: list[CallResult] = []
    cell.env.process(_generate(cell, engine, 3, got, at=0.1))

    def restart_in_the_hop() -> Generator[Any, Any, None]:
        yield cell.env.timeout(0.2 * HOP_S)  # the request is connected, not yet there
        yield from engine.restart(down_s=0.3)

    cell.env.process(restart_in_the_hop())
    cell.env.run(until=2.0)
    assert got[0].error == "reset"


def _side_call(cell: Cell, engine: SimEngine, at: float, work_s: float,
               out: list[CallResult]) -> Generator[Any, Any, None]:
    yield cell.env.timeout(at - cell.env.now)

    def pull(deadline: float | None) -> Generator[Any, Any, Reply]:
        yield from wait(cell.env, work_s, deadline)
        return Reply("kv")

    out.append((yield from cell.net.call(LinkRef(engine.name, "side_channel"), engine, pull, 128, 5.0)))


def _restart_at(cell: Cell, engine: SimEngine, at: float, down_s: float) -> Generator[Any, Any, None]:
    yield cell.env.timeout(at - cell.env.now)
    yield from engine.restart(down_s=down_s)


@pytest.mark.parametrize(("transport", "served"), [("grpc", True), ("http", False)])
def test_the_servers_close_in_the_real_order(transport: str, served: bool) -> None:
    """gRPC first (its serving work gets the grace while the side channels still serve), then the side
    channels, then the HTTP apps: in a gRPC cell a pull that comes during the serving grace is served, in
    an HTTP cell the side channels are already closed."""
    cell, engine = _engine(transport, itl_ms=50.0)
    serving: list[CallResult] = []
    pulls: list[CallResult] = []
    cell.env.process(_generate(cell, engine, 21, serving, at=0.1))  # runs past the grace: cut at its end
    cell.env.process(_restart_at(cell, engine, 0.15, down_s=0.5))
    cell.env.process(_side_call(cell, engine, 0.2, 0.05, pulls))  # during the serving grace
    cell.env.run(until=3.0)
    assert serving[0].error == "reset"
    assert (pulls[0].ok, pulls[0].error) == ((True, None) if served else (False, "refused"))


def test_a_kill_while_the_servers_close_keeps_the_engine_down() -> None:
    cell, engine = _engine("http", itl_ms=50.0)
    serving: list[CallResult] = []
    cell.env.process(_generate(cell, engine, 21, serving, at=0.1))
    cell.env.process(_restart_at(cell, engine, 0.15, down_s=0.1))

    def kill_soon() -> Generator[Any, Any, None]:
        yield cell.env.timeout(0.2 - cell.env.now)
        engine.kill()

    cell.env.process(kill_soon())
    cell.env.run(until=3.0)
    assert serving[0].error == "reset" and serving[0].elapsed == pytest.approx(0.1)
    assert not engine.exists and not engine.accepting()


def test_a_connection_made_before_a_restart_does_not_reach_the_next_start() -> None:
    """A request still on its way (a slow link) when its server closed is reset, even if the server is back
    by the time it gets there."""
    cell, engine = _engine("http", itl_ms=5.0)
    ref = LinkRef(engine.name, "serve")
    cell.net.links[ref] = LinkState()
    cell.net.add_toxics(ref, [ToxicPlan("slow", "latency", "upstream", {"latency": 1000, "jitter": 0})])
    got: list[CallResult] = []
    cell.env.process(_generate(cell, engine, 3, got, at=0.1))
    cell.env.process(_restart_at(cell, engine, 0.2, down_s=0.1))
    cell.env.run(until=0.6)
    assert engine.accepting()  # back well before the request arrives (at about 1.1)
    cell.env.run(until=3.0)
    assert got[0].error == "reset"


def test_two_restarts_at_once_each_wait_only_for_their_work() -> None:
    """Neither close sleeps out its grace once the work is done: a request sent after both restarts ended is
    not cut by a close that missed the end of the work."""
    cell, engine = _engine("http", itl_ms=50.0)
    short: list[CallResult] = []
    later: list[CallResult] = []
    cell.env.process(_generate(cell, engine, 2, short, at=0.1))  # done about 0.05 s after the restarts
    cell.env.process(_restart_at(cell, engine, 0.11, down_s=0.0))
    cell.env.process(_restart_at(cell, engine, 0.11, down_s=0.0))
    cell.env.process(_generate(cell, engine, 3, later, at=0.25))  # the closes' graces would end at 0.31
    cell.env.run(until=0.11 + 3 * SHUTDOWN_GRACE_S)
    assert short[0].ok and later[0].ok
    assert engine.state.identity.generation == 3  # two restarts, each once


def test_a_death_s_exit_belongs_to_its_process() -> None:
    """The exit timer of a dying engine survives a restart in place (same process) but not the process: a
    kill and a respawn bring a process it must leave alone."""
    cell, engine = _engine("http", itl_ms=5.0)
    engine.die(exit_after_s=1.0)
    cell.env.process(_restart_at(cell, engine, 0.3, down_s=0.0))
    cell.env.run(until=0.6)
    assert engine.exists and engine.accepting()
    cell.env.run(until=1.5)
    assert not engine.exists  # the same process: its exit came

    cell2, engine2 = _engine("http", itl_ms=5.0)
    engine2.die(exit_after_s=2.0)
    engine2.die(exit_after_s=2.5)  # told twice: the first timer is no longer the engine's to cancel
    cell2.env.process(_restart_at(cell2, engine2, 0.3, down_s=0.0))

    def kill_then_respawn() -> Generator[Any, Any, None]:
        yield cell2.env.timeout(0.8 - cell2.env.now)
        engine2.kill()
        yield cell2.env.timeout(0.2)
        yield from engine2.respawn()

    cell2.env.process(kill_then_respawn())
    cell2.env.run(until=4.0)
    assert engine2.exists and engine2.accepting() and engine2.pid == 101


@pytest.mark.parametrize("grace_s", [5.0, 0.03])
def test_a_graceful_stop_lets_the_tokens_still_going_out_finish_unless_killed_first(grace_s: float) -> None:
    """Drained (no request running) is not done: the process still closes its servers with their grace,
    so a leg whose tokens are still going out ends well; the SIGKILL after `grace_s` cuts it short."""
    cell, engine = _engine("http", itl_ms=30.0)
    got: list[CallResult] = []
    outcome: list[bool | None] = []
    cell.env.process(_generate(cell, engine, 4, got, at=0.1))  # first token at about 0.11, last at 0.2

    def sigterm() -> Generator[Any, Any, None]:
        yield cell.env.timeout(0.15 - cell.env.now)
        engine.state.begin_drain(cell.env.now)
        outcome.append((yield from engine.graceful_stop(grace_s)))

    cell.env.process(sigterm())
    cell.env.run(until=3.0)
    assert not engine.exists
    if grace_s > 1.0:
        assert got[0].ok and outcome == [False]
    else:
        assert got[0].error == "reset" and outcome == [True]


def test_a_stopped_process_exits_only_once_resumed() -> None:
    cell, engine = _engine("http", itl_ms=5.0)
    engine.die(exit_after_s=0.2)
    engine.freeze()

    def resume_later() -> Generator[Any, Any, None]:
        yield cell.env.timeout(1.0)
        engine.thaw()

    cell.env.process(resume_later())
    cell.env.run(until=1.0)
    assert engine.exists  # its exit was due at 0.3, but the process was stopped
    cell.env.run(until=1.5)
    assert not engine.exists
