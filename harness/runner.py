"""Real-time runner: one scenario in one topology cell, on loopback, with OS processes.

`run_scenario` starts the engines and the router under test, waits until every worker is Ready, then runs the
workload, the fault timeline and the observers together; it drains, copies the engines' handoff records into
the history, judges the history with the scenario's checkers and returns a `ScenarioResult`. Every exit path
tears the processes down (the supervisor), and a run that breaks half-way still returns a result: verdict
`unknown` with the reason.

`run_suite` runs scenarios over a matrix of cells, writes the reports and points `<runs>/latest` at the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness.checkers import run_checks, validate_expect
from harness.faults import EngineFleet, FaultInjector
from harness.history import HistoryRecorder
from harness.load import LoadGenerator
from harness.netfaults import NetworkLinks
from harness.observe import RouterEventsWatcher, RouterWatcher, collect_handoffs
from harness.procs import ManagedProcess, ProcessSupervisor, log_tail
from harness.routers import RouterAdapter, make_router_adapter
from harness.scenario import Scenario, ScenarioError, Timeline, World, validate
from harness.topology import Topology, allocate
from harness.verdict import Verdict, combine

TICK_S = 0.05
# A step whose condition never holds is given up this long after the planned end of the run.
TIMELINE_GRACE_S = 10.0
ROUTER_READY_TIMEOUT_S = 20.0


@dataclass
class Cell:
    """One scenario run's coordinates."""

    topology: str
    connector: str
    transport: str

    @property
    def label(self) -> str:
        return f"{self.topology}-{self.connector}-{self.transport}"


def cell_dir_name(scenario: str, cell: Cell) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{scenario}__{cell.label}")


def scenario_settings(s: Scenario, topo: Topology | None = None) -> dict[str, Any]:
    """What the run was told, for `run_started.settings` (checkers look numbers up by name)."""
    r, e, w = s.router, s.engines, s.workload
    out: dict[str, Any] = {
        "transfer_timeout_s": e.transfer_timeout_s,
        "health_interval_s": r.health_interval_s,
        "health_timeout_s": r.health_timeout_s,
        "failure_threshold": r.failure_threshold,
        "success_threshold": r.success_threshold,
        "request_timeout_s": r.request_timeout_s,
        "inject_bug": r.inject_bug,
        "bugs": list(s.bugs),
        "router": dataclasses.asdict(r),
        "engines": {k: v for k, v in dataclasses.asdict(e).items() if k != "per_engine"},
        "per_engine": {k: dict(v) for k, v in e.per_engine.items()},
        "workload": dataclasses.asdict(w),
        "timeline": [
            {"name": st.name, "action": type(st.action).__name__, "target": st.action.target}
            for st in s.timeline
        ],
        "expect": [{"checker": x.checker, "params": dict(x.params)} for x in s.expect],
    }
    if topo is not None:
        out["engines_layout"] = {
            sp.name: {"role": sp.role, "url": sp.url(topo.transport), "control": sp.control_url}
            for sp in topo.engines
        }
        out["router_url"] = topo.router_url
    return out


def _result(**fields: Any) -> Any:
    """A `reports.model.ScenarioResult` (the reports package owns the type)."""
    from reports.model import ScenarioResult

    known = {f.name for f in dataclasses.fields(ScenarioResult)}
    return ScenarioResult(**{k: v for k, v in fields.items() if k in known})


def expectation_problems(s: Scenario) -> list[str]:
    """Unknown checkers or bad parameters in a scenario's expectations (empty: fine)."""
    return [p for x in s.expect for p in validate_expect(x.checker, x.params)]


class WorkersNotReady(TimeoutError):
    """The engines serve but the router did not make every worker Ready in time: the router's failure."""


@dataclass
class _RunState:
    reason: str = "done"
    extra_verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    topo: Topology | None = None


async def run_scenario(
    scenario: Scenario,
    topology: str,
    connector: str,
    transport: str,
    router_adapter: str | RouterAdapter,
    out_dir: str | os.PathLike[str],
    seed: int = 0,
    progress: Any = None,
    run_id: str | None = None,
) -> Any:
    """Run one cell; always returns a ScenarioResult (verdict `unknown` with a reason when the run broke)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local folder, once per run
    _clear_previous_run(out)
    rid = run_id or uuid.uuid4().hex[:8]
    history = HistoryRecorder(out / "history.jsonl")
    state = _RunState()
    started_wall = time.time()
    adapter: RouterAdapter | None = None
    try:
        adapter = make_router_adapter(router_adapter)
        validate(scenario)
        bad = expectation_problems(scenario)
        if bad:
            raise ScenarioError(f"scenario {scenario.name!r}: " + "; ".join(bad))
        if not scenario.applies_to(topology, connector):
            raise ScenarioError(f"scenario {scenario.name!r} does not apply to {topology}/{connector}")
        if scenario.router.inject_bug and not adapter.supports_inject_bug:
            raise ScenarioError(f"router {adapter.name} cannot take inject_bug={scenario.router.inject_bug}")
        topo = allocate(topology, connector, transport)
        state.topo = topo
        history.run_started(
            scenario.name, topology, connector, transport, adapter.name, seed,
            scenario_settings(scenario, topo), run_id=rid, bugs=list(scenario.bugs),
        )
        await _execute(scenario, topo, adapter, out, history, state, seed, rid)
    except asyncio.CancelledError:
        state.reason = "interrupted"
        _finish(history, state, out)
        raise
    except Exception as e:
        state.reason = f"error: {type(e).__name__}: {e}"
        if isinstance(e, WorkersNotReady):
            # Every engine was up (the fleet waited for each to serve): judging the router is fair.
            state.extra_verdicts.append(Verdict.fail("workers_ready", str(e)))
        if history.history().run is None:
            history.run_started(scenario.name, topology, connector, transport,
                                getattr(adapter, "name", str(router_adapter)), seed, {}, run_id=rid)
    _finish(history, state, out)
    h = history.history()
    verdicts = run_checks(h, scenario.expect) + state.extra_verdicts
    overall = combine(verdicts, name=scenario.name)
    if progress is not None and hasattr(progress, "finish"):
        with contextlib.suppress(Exception):
            progress.finish(out, overall.status)
    return _result(
        scenario=scenario.name,
        description=scenario.description,
        bugs=list(scenario.bugs),
        topology=topology,
        connector=connector,
        transport=transport,
        router=getattr(adapter, "name", str(router_adapter)),
        seed=seed,
        status=overall.status,
        verdict=overall,
        verdicts=verdicts,
        reason=overall.reason if overall.status != "pass" else "",
        run_reason=state.reason,
        duration_s=round(time.time() - started_wall, 3),
        started_at=started_wall,
        ended_at=time.time(),
        history_path=out / "history.jsonl",
        out_dir=out,
        cell_dir=out,
        log_dir=out / "logs",
        notes=state.notes,
    )


def _clear_previous_run(out: Path) -> None:
    """A cell folder reused by a new run: engines append to their records files and the router to its events
    file, so an old run's records would be judged again. Remove them (logs get fresh names anyway)."""
    for stale in [*sorted((out / "engines").glob("*.records.jsonl")), out / "router-events.jsonl"]:
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def _finish(history: HistoryRecorder, state: _RunState, out: Path) -> None:
    if state.topo is not None:
        files = {sp.name: out / "engines" / f"{sp.name}.records.jsonl" for sp in state.topo.engines}
        try:
            n = collect_handoffs(history, files)
            history.note(f"collected {n} handoff records")
        except OSError as e:
            history.note(f"handoff records unreadable: {e}")
    history.run_ended(state.reason)
    history.close()


async def _execute(
    s: Scenario,
    topo: Topology,
    adapter: RouterAdapter,
    out: Path,
    history: HistoryRecorder,
    state: _RunState,
    seed: int,
    run_id: str,
) -> None:
    world = World()
    token = uuid.uuid4().hex
    # Proxies on the links the timeline's network actions name (none: inert, no Toxiproxy started).
    net_links = NetworkLinks.for_scenario(s, topo, history, seed)
    async with ProcessSupervisor(out / "logs") as sup, aiohttp.ClientSession() as session, net_links as net:
        fleet = EngineFleet(topo, net.engine_settings(s.engines), sup, out, history, token=token, seed=None)
        injector = FaultInjector(fleet, history, adapter, session)
        injector.network = net
        stop = asyncio.Event()
        observers: list[asyncio.Task[None]] = []
        loading: list[asyncio.Task[Any]] = []
        try:
            deferred = set(s.deferred_engines)
            now_names = [n for n in topo.names() if n not in deferred]
            loads = {n: float(s.engines.for_engine(n).get("load_time_s") or 0.0) for n in now_names}
            # Engines that take time to load start in the background: the router meets them while they load.
            loading = [asyncio.create_task(fleet.start(n)) for n in now_names if loads[n] > 0]
            await asyncio.gather(*(fleet.start(n) for n in now_names if loads[n] <= 0))
            await net.install(fleet)
            rtopo = net.router_topology  # the router meets proxied links through the proxies
            injector.router_topo = rtopo
            registered = [n for n in topo.names() if n not in set(s.unregistered_engines)]
            launch = adapter.launch(rtopo, s.router, registered, str(out / "router-events.jsonl"))
            history.note("router launch", argv=launch.argv)
            router_proc = await sup.spawn(
                "router", launch.argv, env=launch.env or None, ready_prefix=launch.ready_prefix,
                ready_timeout_s=ROUTER_READY_TIMEOUT_S,
            )
            await _wait_router(adapter, session, topo, router_proc)
            watcher = RouterWatcher(adapter, session, rtopo, history, world)
            events = RouterEventsWatcher(adapter, session, rtopo, history)
            observers = [asyncio.create_task(watcher.run(stop)), asyncio.create_task(events.run(stop))]
            if loading:
                await asyncio.gather(*loading)
            expected_ready = [n for n in registered if n not in deferred]
            await _wait_workers_ready(s, topo, adapter, session, watcher, world, expected_ready)
            await _timeline_and_load(s, topo, session, history, world, injector, state, seed, run_id)
            if injector.failures:
                state.extra_verdicts.append(
                    Verdict.unknown_("faults", "a fault could not be applied or verified: "
                                     + "; ".join(injector.failures[:5]), evidence=injector.failures[:25])
                )
            else:
                state.extra_verdicts.append(Verdict.ok("faults", numbers={"steps": len(s.timeline)}))
            if watcher.supported is False:
                history.note("router has no readable /workers: status-based checks cannot judge")
        finally:
            stop.set()
            for t in loading:
                t.cancel()
            with contextlib.suppress(Exception):
                await injector.heal_all()
            if observers:
                await asyncio.wait(observers, timeout=3.0)
                for t in observers:
                    t.cancel()
            # The router first: engines going away must not be the last thing it records.
            router = sup.get("router")
            if router is not None:
                await sup.stop(router, grace_s=1.0)


async def _wait_router(
    adapter: RouterAdapter, session: aiohttp.ClientSession, topo: Topology, proc: ManagedProcess
) -> None:
    """The adapter's readiness check, cut short when the router process exits first."""
    ready = asyncio.create_task(adapter.wait_ready(session, topo, ROUTER_READY_TIMEOUT_S))
    exited = asyncio.create_task(proc.wait(ROUTER_READY_TIMEOUT_S + 1.0))
    try:
        done, _ = await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (ready, exited):
            if not t.done():
                t.cancel()
    if ready in done and ready.exception() is None:
        return
    if ready in done:
        raise ready.exception()  # type: ignore[misc]
    tail = log_tail(proc.log_path).strip().splitlines()[-5:]
    raise RuntimeError(f"router exited with code {proc.returncode} before serving: {' | '.join(tail)}")


async def _wait_workers_ready(
    s: Scenario,
    topo: Topology,
    adapter: RouterAdapter,
    session: aiohttp.ClientSession,
    watcher: RouterWatcher,
    world: World,
    names: Sequence[str],
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + s.ready_timeout_s
    while loop.time() < deadline:
        if watcher.supported is False:
            if await _routable(session, topo):
                return
        elif all(world.worker_status.get(n) == "ready" for n in names):
            return
        await asyncio.sleep(0.1)
    seen = {n: world.worker_status.get(n, "absent") for n in names}
    raise WorkersNotReady(f"workers not all Ready within {s.ready_timeout_s:g} s: {seen}")


async def _routable(session: aiohttp.ClientSession, topo: Topology) -> bool:
    """For routers without a worker API: one completion goes through."""
    try:
        async with session.post(
            f"{topo.router_url}/v1/completions",
            json={"model": "pdchaos-fake", "prompt": "[pdchaos:warmup:0] ready", "max_tokens": 1},
            timeout=aiohttp.ClientTimeout(total=2.0),
        ) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _timeline_and_load(
    s: Scenario,
    topo: Topology,
    session: aiohttp.ClientSession,
    history: HistoryRecorder,
    world: World,
    injector: FaultInjector,
    state: _RunState,
    seed: int,
    run_id: str,
) -> None:
    t0 = history.now()
    history.note("timeline zero: all workers ready", timeline_zero=t0)
    load = LoadGenerator(session, topo.router_url, s.workload, history, run_id, seed=seed)
    load_task = asyncio.create_task(load.run())
    timeline = Timeline(tuple(s.timeline))
    planned_end = max(s.workload.duration_s, s.min_duration_s, timeline.last_fixed_time())
    give_up = planned_end + TIMELINE_GRACE_S
    applied: list[str] = []
    try:
        while not timeline.done:
            now = history.now() - t0
            world.requests_completed = load.completed
            fire, miss = timeline.due(now, world)
            for step in miss:
                history.note(f"step {step.name} missed: its condition did not hold by t={step.deadline_s}",
                             step=step.name)
            for step in fire:
                world.applied_at[step.name] = history.now() - t0
                await injector.apply(step.name, step.action)
                applied.append(step.name)
            if timeline.done:
                break
            if now > give_up:
                done = set(applied) | set(timeline.missed)
                rest = [st.name for st in s.timeline if st.name not in done]
                timeline.missed.extend(rest)
                history.note(f"steps never due, given up at t={now:.1f}: {rest}")
                break
            await asyncio.sleep(TICK_S)
        remaining = planned_end - (history.now() - t0)
        if remaining > 0:
            await asyncio.sleep(remaining)
        # Every request has a client deadline: the load ends on its own.
        await asyncio.wait_for(asyncio.shield(load_task), s.workload.duration_s + s.workload.deadline_s + 5.0)
    finally:
        if not load_task.done():
            load_task.cancel()
            with contextlib.suppress(BaseException):
                await load_task
            await load.cancel()
    if timeline.missed:
        state.extra_verdicts.append(
            Verdict.unknown_("timeline", f"steps missed (condition never held): {timeline.missed}",
                             evidence=list(timeline.missed))
        )
    else:
        state.extra_verdicts.append(Verdict.ok("timeline", numbers={"applied": len(applied)}))
    st = load.stats
    history.note("load finished", invoked=st.invoked, completed=st.completed, ok=st.ok)


# ---------------------------------------------------------------- suites


def expand_matrix(
    scenarios: Iterable[Scenario],
    topologies: Sequence[str] | None = None,
    connectors: Sequence[str] | None = None,
    transports: Sequence[str] | None = None,
) -> list[tuple[Scenario, Cell]]:
    """Every (scenario, cell) the scenarios apply to, filtered by the chosen
    topologies/connectors/transports."""
    out = []
    for s in scenarios:
        for t, c, tr in s.matrix(topologies, connectors, transports):
            out.append((s, Cell(t, c, tr)))
    return out


def update_latest(run_dir: Path) -> None:
    """Point `<parent>/latest` at run_dir (atomically replaced; a real folder named latest is left alone)."""
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(run_dir.name, tmp)
    if link.exists() and not link.is_symlink():
        tmp.unlink()
        return
    os.replace(tmp, link)


async def run_suite(
    scenarios: Iterable[Scenario],
    matrix: Iterable[tuple[Scenario, Cell]] | dict[str, Sequence[str]] | None,
    out_dir: str | os.PathLike[str],
    router: str | RouterAdapter = "reference",
    seed: int = 0,
    progress: Any = None,
    write: bool = True,
) -> list[Any]:
    """Run every cell in sequence into `out_dir/<scenario>__<cell>/`, write reports into out_dir, point
    `out_dir/../latest` at out_dir. `matrix`: explicit (scenario, cell) pairs, or a dict with optional keys
    `topologies`, `connectors`, `transports` filtering each scenario's own matrix (None: all of it)."""
    run_dir = Path(out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local folder, once per suite
    update_latest(run_dir)
    scen = list(scenarios)
    if matrix is None or isinstance(matrix, dict):
        m = matrix or {}
        cells = expand_matrix(scen, m.get("topologies"), m.get("connectors"), m.get("transports"))
    else:
        cells = list(matrix)
    results = []
    run_id = run_dir.name[-12:] or uuid.uuid4().hex[:8]
    for s, cell in cells:
        res = await run_scenario(
            s, cell.topology, cell.connector, cell.transport, router,
            run_dir / cell_dir_name(s.name, cell), seed=seed, progress=progress,
            run_id=re.sub(r"[^A-Za-z0-9_-]", "", run_id),
        )
        results.append(res)
    if write:
        from reports import write_reports

        write_reports(results, run_dir)
    return results
