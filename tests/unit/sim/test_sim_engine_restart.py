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
from harness.scenario.links import LinkRef
from harness.topology import Topology
from harness.worlds.sim.engine import SimEngine
from harness.worlds.sim.network import HOP_S, CallResult, Reply, SimNetwork, wait


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
