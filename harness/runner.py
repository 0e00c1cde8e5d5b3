"""Running scenarios: one cell (`run_scenario`) or a list of cells (`run_suite`, several at once with `jobs`).

A cell is a scenario session (`harness.session`: the run's logic) over a world (`harness.worlds.real`: OS
processes on loopback). This module builds both, lets the world drive the session, and turns the session's
verdicts into a `ScenarioResult`. A run that breaks half-way still returns a result: verdict `unknown` with
the reason. Rendering reports is the caller's business (`reports.write_reports`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shlex
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.checkers import run_checks, validate_expect
from harness.history_writer import HistoryRecorder
from harness.result import ScenarioResult
from harness.routers import RouterAdapter, RouterAdapterError, make_router_adapter, router_profile
from harness.routers.profiles import PREFIX as PROFILE_PREFIX
from harness.routers.profiles import profile_named
from harness.scenario import Scenario, ScenarioError, apply_preset, preset, validate
from harness.scenario.bugs import injected_bugs
from harness.scenario.model import WORLDS
from harness.session import ScenarioSession
from harness.topology import PORTS_PER_ENGINE, Topology, allocate, build_topology, parse_topology
from harness.verdict import Verdict, combine
from harness.worlds.real.backends import EngineChoice, adapt, not_applicable, parse_engines
from harness.worlds.real.world import RealWorld
from harness.worlds.sim.world import SimWorld

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"
# Simulated engines live on these (never bound) ports.
SIM_PORT_BASE = 20_000


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


def expectation_problems(s: Scenario) -> list[str]:
    """Unknown checkers or bad parameters in a scenario's expectations (empty: fine)."""
    return [p for x in s.expect for p in validate_expect(x.checker, x.params)]


DEFAULT_SETTINGS = {"real": "scaled", "sim": "production"}


def default_settings(world: str) -> str:
    """The settings preset a world runs at unless told otherwise."""
    return DEFAULT_SETTINGS[world]


def check_cell(scenario: Scenario, topology: str, connector: str, adapter: RouterAdapter | None,
               world: str = "real") -> None:
    """ScenarioError when the scenario cannot run in this cell with this router in this world."""
    validate(scenario)
    if world not in WORLDS:
        raise ScenarioError(f"unknown world {world!r} (known: {', '.join(WORLDS)})")
    if world not in scenario.worlds:
        why = scenario.world_notes.get(world, "")
        raise ScenarioError(f"scenario {scenario.name!r} does not run in the {world} world"
                            + (f": {why}" if why else ""))
    bad = expectation_problems(scenario)
    if bad:
        raise ScenarioError(f"scenario {scenario.name!r}: " + "; ".join(bad))
    if not scenario.applies_to(topology, connector):
        raise ScenarioError(f"scenario {scenario.name!r} does not apply to {topology}/{connector}")
    if adapter is None:
        return
    if scenario.router.inject_bugs and not adapter.supports_inject_bug:
        bugs = ", ".join(scenario.router.inject_bugs)
        raise ScenarioError(f"router {adapter.name} cannot take router bug switches ({bugs})")


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
    world: str = "real",
    settings: str | None = None,
    check_determinism: bool = False,
    engines: str | EngineChoice = "fake",
    report_part: bool = False,
) -> ScenarioResult:
    """Run one cell, in real time (`world="real"`: processes on loopback) or simulated time (`"sim"`), at a
    settings preset (`settings`: None = the world's default); always returns a ScenarioResult (verdict
    `unknown` with a reason when the run broke). A simulated run replays exactly: its run id comes from the
    seed, and `check_determinism` runs it twice and compares the histories byte for byte. `report_part`: the
    cell will be in a report.html: render its plot and tables here, from the history in memory
    (`reports.cell_part`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - local folder, once per run
    _clear_previous_run(out)
    rid = f"s{seed}" if world == "sim" else (run_id or uuid.uuid4().hex[:8])
    started_wall = time.time()
    adapter: RouterAdapter | None = None
    session: ScenarioSession | None = None
    reason = ""
    extra: list[Verdict] = []
    replay: str | None = None
    router_name = str(router_adapter)
    preset_name = settings or DEFAULT_SETTINGS.get(world, "scaled")
    engine_choice = parse_engines(engines)
    try:
        if world == "sim":
            router_name = sim_router_name(router_adapter)
        else:
            adapter = make_router_adapter(router_adapter)
            router_name = adapter.name
        check_cell(scenario, topology, connector, adapter, world)
        if world == "sim" and not engine_choice.is_fake:
            raise ScenarioError("the simulated world simulates its own engines: --engines is for real time")
        skip = not_applicable(engine_choice, scenario, connector, transport)
        if skip:
            raise ScenarioError(f"not applicable: {skip}")
        scenario, engine_notes = adapt(engine_choice, apply_preset(scenario, preset(preset_name)))
        profile = router_profile(router_adapter)
        if profile is not None:
            scenario = profile.apply(scenario)
        validate(scenario)
        replay = _replay(scenario, topology, connector, transport, adapter, router_name, seed, world,
                         preset_name, engine_choice.label, check_determinism)
        if world == "sim":
            topo = sim_topology(topology, connector, transport)
            session = ScenarioSession(scenario, topo, router=router_name, seed=seed, run_id=rid,
                                      history_path=out / "history.jsonl", world="sim", replay=replay)
            await SimWorld(session.plan, out).run(session)
            if check_determinism:
                extra.append(await _replay_verdict(scenario, topo, router_name, seed, rid, out, replay))
        else:
            assert adapter is not None
            session = ScenarioSession(scenario, allocate(topology, connector, transport), router=router_name,
                                      seed=seed, run_id=rid, history_path=out / "history.jsonl",
                                      engines=engine_choice.label,
                                      engine_start_s=engine_choice.start_budget_s(),
                                      text_known=engine_choice.text_known, replay=replay)
            session.notes.extend(engine_notes)
            async with RealWorld(session.plan, adapter, out, engines=engine_choice) as real:
                try:
                    await real.run(session)
                finally:
                    session.notes.extend(real.log_notes())
    except asyncio.CancelledError:
        _close(session, "interrupted")
        raise
    except Exception as e:
        reason = f"error: {type(e).__name__}: {e}"
        if session is None or session.history is None:
            session = None
            history = _broken_history(out, scenario, topology, connector, transport, router_name, seed, rid)
            history.run_ended(reason)
            history.close()
            verdicts = run_checks(history.history(), scenario.expect)
        else:
            _close(session, reason)
    if session is not None:
        _close(session, "error: the run ended before its session did")
        outcome = session.result()
        verdicts, run_reason, notes = outcome.verdicts + extra, outcome.reason, outcome.notes
    else:
        run_reason, notes = reason, []
    overall = combine(verdicts, name=scenario.name)
    if progress is not None and hasattr(progress, "finish"):
        with contextlib.suppress(Exception):
            progress.finish(out, overall.status)
    result = ScenarioResult(
        scenario=scenario.name,
        description=scenario.description,
        bugs=list(scenario.bugs),
        topology=topology,
        connector=connector,
        transport=transport,
        router=router_name,
        seed=seed,
        world=world,
        settings=preset_name,
        replay=replay if replay is not None else _replay(
            scenario, topology, connector, transport, adapter, router_name, seed, world, preset_name,
            engine_choice.label, check_determinism),
        verdict=overall,
        verdicts=verdicts,
        reason=overall.reason if overall.status != "pass" else "",
        run_reason=run_reason,
        duration_s=round(time.time() - started_wall, 3),
        started_at=started_wall,
        ended_at=time.time(),
        history_path=out / "history.jsonl",
        out_dir=out,
        cell_dir=out,
        # A simulated cell starts no process: it has no logs.
        log_dir=out / "logs" if (out / "logs").is_dir() else None,
        notes=notes,
    )
    write_cell_result(result, out)
    if report_part and session is not None and session.history is not None:
        from reports.cell_part import write_cell_part

        # Without it the report renders the part from the file: slower, never wrong.
        with contextlib.suppress(OSError):
            write_cell_part(result, session.history.history())
    return result


# The finished cell's result, written last: a rerun that may reuse judged cells (`pdchaos matrix --resume`)
# reads it back. A cell interrupted before its verdict has none and runs again.
CELL_RESULT = "result.json"


def write_cell_result(result: ScenarioResult, out: Path) -> None:
    tmp = out / (CELL_RESULT + ".tmp")
    tmp.write_text(json.dumps(result.to_dict(base=out), indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / CELL_RESULT)


def read_cell_result(out: Path, scenario: str, cell: Cell, world: str) -> ScenarioResult | None:
    """The judged result of this very cell in `out` (None: none, unreadable, or another cell's)."""
    result = saved_cell_result(out / "history.jsonl")
    if result is None:
        return None
    same = (result.scenario, result.topology, result.connector, result.transport, result.world) == (
        scenario, cell.topology, cell.connector, cell.transport, world)
    return result if same else None


def saved_cell_result(history: Path) -> ScenarioResult | None:
    """The result the runner saved beside `history` when it judged the cell (None: none, unreadable, or
    another history's)."""
    folder = history.parent
    try:
        saved = ScenarioResult.from_dict(json.loads((folder / CELL_RESULT).read_text(encoding="utf-8")),
                                         base=folder)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    same = saved.history_path is not None and os.path.abspath(saved.history_path) == os.path.abspath(history)
    return saved if same else None


def _replay(s: Scenario, topology: str, connector: str, transport: str, adapter: RouterAdapter | None,
            router_name: str, seed: int, world: str, settings: str, engines: str,
            check_determinism: bool) -> str:
    """This cell's replay command (the router as `--router` takes it: a gateway's spec, not its name)."""
    router = adapter.cli_spec() if adapter is not None else router_name
    return replay_command(s, topology, connector, transport, router, seed, world, settings, engines,
                          check_determinism)


async def _replay_verdict(scenario: Scenario, topo: Topology, router: str, seed: int, run_id: str,
                          out: Path, replay: str) -> Verdict:
    """Run the simulated cell again and compare the two histories byte for byte (madsim's determinism
    check): a difference is a harness bug, so the verdicts cannot be trusted (unknown)."""
    again = out / "replay.history.jsonl"
    session = ScenarioSession(scenario, topo, router=router, seed=seed, run_id=run_id, history_path=again,
                              world="sim", replay=replay)
    await SimWorld(session.plan, out).run(session)
    first, second = (out / "history.jsonl").read_bytes(), again.read_bytes()
    digest = hashlib.sha256(first).hexdigest()
    if first == second:
        again.unlink()
        return Verdict.ok("determinism", "the replay gave the same history, byte for byte",
                          numbers={"sha256": digest, "bytes": len(first)})
    a, b = first.splitlines(), second.splitlines()
    line = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return Verdict.unknown_("determinism", f"the replay's history differs from line {line + 1}",
                            numbers={"sha256": digest, "replay_sha256": hashlib.sha256(second).hexdigest()},
                            evidence=[f"replay kept at {again}"])


def sim_router_name(spec: str | RouterAdapter) -> str:
    """The simulated world runs the reference router's core, alone or as a gateway profile (ScenarioError
    for anything else)."""
    if isinstance(spec, RouterAdapter):
        spec = spec.name
    if spec in ("reference", "", "pdchaos-router"):
        return "reference"
    if spec.startswith(PROFILE_PREFIX):
        try:
            return PROFILE_PREFIX + profile_named(spec).name
        except ValueError as e:
            raise ScenarioError(str(e)) from None
    raise ScenarioError(f"the simulated world runs the reference router only (or a profile:NAME of it), not "
                        f"{spec!r}")


def sim_topology(topology: str, connector: str, transport: str) -> Topology:
    """A topology on fixed (never bound) ports, so a simulated run replays exactly."""
    shape = parse_topology(topology)
    need = shape.engines * PORTS_PER_ENGINE + 1
    return build_topology(shape, connector, transport, list(range(SIM_PORT_BASE, SIM_PORT_BASE + need)))


def scenario_reference(s: Scenario) -> str | None:
    """How a command line names the scenario: a shipped one by name, another as `FILE::NAME` with the file's
    absolute path (it works from any folder, and runs this scenario alone of those the file defines); None
    for one built in code."""
    if not s.source:
        return None
    if Path(s.source).parent.resolve() == SCENARIO_DIR:
        return s.name
    return f"{Path(s.source).resolve()}::{s.name}"


def replay_command(s: Scenario, topology: str, connector: str, transport: str, router: str | None, seed: int,
                   world: str, settings: str, engines: str = "fake", check_determinism: bool = False) -> str:
    """The `pdchaos run` line that runs this cell again (a shipped scenario by name, else its file); "" for a
    scenario built in code (no file names it: the command line cannot) or a router no `--router` value names
    (`router` None)."""
    what = scenario_reference(s)
    if what is None or router is None:
        return ""
    words = ["pdchaos", "run", shlex.quote(what), "--topology", topology, "--connector", connector,
             "--transport", transport, "--world", world, "--settings", settings, "--seed", str(seed)]
    if router not in ("reference", ""):
        words += ["--router", shlex.quote(router)]
    if engines != "fake":
        words += ["--engines", shlex.quote(engines)]
    if check_determinism:  # its verdict is the run's too
        words += ["--check-determinism"]
    given = None
    with contextlib.suppress(RouterAdapterError):  # an unknown profile: the run already says why
        given = router_profile(router)
    for bug in injected_bugs(s):
        if given is None or bug not in given.bugs:  # a profile's own switches come with it
            words += ["--inject-bug", bug]
    return " ".join(words)


def _close(session: ScenarioSession | None, reason: str) -> None:
    """A session the world stopped driving (an error, a cancellation) still ends its history."""
    if session is not None and not session.done:
        session.abandon(reason)


def _broken_history(out: Path, s: Scenario, topology: str, connector: str, transport: str, router: str,
                    seed: int, run_id: str) -> HistoryRecorder:
    """The history of a run that never started (bad scenario, unknown router, no free ports)."""
    history = HistoryRecorder(out / "history.jsonl")
    history.run_started(s.name, topology, connector, transport, router, seed, {}, run_id=run_id)
    return history


def _clear_previous_run(out: Path) -> None:
    """A cell folder reused by a new run: engines append to their records files and the router to its events
    file, so an old run's records would be judged again. Remove them (logs get fresh names anyway)."""
    for stale in [*sorted((out / "engines").glob("*.records.jsonl")), out / "router-events.jsonl",
                  out / CELL_RESULT]:
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


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


