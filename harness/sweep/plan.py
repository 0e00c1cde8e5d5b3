"""A sweep file made concrete: every cell it runs, and every cell it leaves out with the reason.

Nothing here starts a process or installs a gateway: the plan is what `--dry-run` prints, and a run only
drops further the cells a gateway release says it cannot run (that needs the release installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.runner import Cell, default_settings, sim_router_name
from harness.scenario import Scenario, ScenarioError, validate
from harness.scenario.bugs import absent_bug
from harness.scenario.files import is_file_item, split_file_item
from harness.suite import UsageError, default_suite, load_named
from harness.sweep.keys import CellKey
from harness.sweep.spec import LOCAL_ENGINES, EngineBackend, RouterChoice, SweepError, SweepSpec


@dataclass(frozen=True)
class SweepCell:
    key: CellKey
    scenario: Scenario
    router: RouterChoice
    backend: EngineBackend | None = None
    bugs: tuple[str, ...] = ()

    @property
    def cell(self) -> Cell:
        return Cell(self.key.topology, self.key.connector, self.key.transport)


@dataclass(frozen=True)
class Skipped:
    key: CellKey
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.key.to_dict(), "reason": self.reason}


@dataclass
class SweepPlan:
    spec: SweepSpec
    cells: list[SweepCell] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _origin(s: Scenario) -> str:
    return str(Path(s.source).resolve()) if s.source else ""


def load_sweep_scenarios(spec: SweepSpec) -> list[Scenario]:
    """The scenarios the sweep names: `default` (the default suite), `all` (every shipped scenario), names
    and files (relative to the sweep file's folder when they are there)."""
    out: dict[str, Scenario] = {}
    try:
        for item in spec.scenarios:
            if item == "default":
                found = default_suite(load_named([]))
            elif item == "all":
                found = load_named([])
            elif is_file_item(item):
                path, name = split_file_item(item)
                found = load_named([str(spec.relative(path)) + ("" if name is None else f"::{name}")])
            else:
                found = load_named([item])
            for s in found:
                first = out.setdefault(s.name, s)
                if _origin(first) != _origin(s):
                    raise SweepError(f"scenario name {s.name!r} comes from both {first.source} and "
                                     f"{s.source}: rename one (names key cell folders and reports)")
    except UsageError as e:
        raise SweepError(str(e)) from None
    unknown = sorted(set(spec.bugs) - set(out))
    if unknown:
        raise SweepError(f"[bugs] names scenarios the sweep does not run: {', '.join(unknown)}")
    return list(out.values())


def plan_sweep(spec: SweepSpec, scenarios: Sequence[Scenario] | None = None) -> SweepPlan:
    """Expand the axes, drop the excluded and impossible cells (each with its reason)."""
    scen = list(scenarios) if scenarios is not None else load_sweep_scenarios(spec)
    names = {s.name for s in scen}
    for ex in spec.exclude:
        stray = [n for n in ex.match.get("scenario", ()) if n not in names]
        if stray:  # a typo would exclude nothing, silently
            raise SweepError(f"[[exclude]] names scenarios the sweep does not run: {', '.join(stray)}")
    plan = SweepPlan(spec)
    for world in spec.worlds:
        for settings in spec.settings or (default_settings(world),):
            for router in spec.routers:
                for engines in spec.engines:
                    backend = spec.backends.get(engines) if engines != LOCAL_ENGINES else None
                    for s in scen:
                        if _in_sweep(spec, s, world):
                            _expand(plan, s, world, settings, router, engines, backend)
    for name, bugs in spec.bugs.items():
        places = [(c.key.connector, c.key.transport) for c in plan.cells if c.key.scenario == name]
        absent = absent_bug(bugs, places, f"cells of {name}") if places else None  # none: skipped, said why
        if absent is not None:
            raise SweepError(f"[bugs] {absent}")
    return plan


def _in_sweep(spec: SweepSpec, s: Scenario, world: str) -> bool:
    """Whether the sweep runs `s` in `world`: one there only through `default` runs where the default suite
    holds it (`Scenario.suite_worlds`); one named or from `all`, in every world."""
    if "all" in spec.scenarios or s.name in spec.scenarios or "default" not in spec.scenarios:
        return True
    return world in s.suite_worlds


def _expand(plan: SweepPlan, s: Scenario, world: str, settings: str, router: RouterChoice, engines: str,
            backend: EngineBackend | None) -> None:
    spec = plan.spec
    bugs = spec.bugs.get(s.name, ())
    base = _with_bugs(s, bugs)
    for topology, scenario in _topologies(spec, base, plan, world, settings, router, engines):
        for _, connector, transport in scenario.matrix([topology], spec.connectors, spec.transports):
            key = CellKey(s.name, topology, connector, transport, router.label, world, settings, engines)
            why = _why_not(spec, key, scenario, router, backend, bugs)
            if why is not None:
                plan.skipped.append(Skipped(key, why))
                continue
            plan.cells.append(SweepCell(key, scenario, router, backend, bugs))


def _topologies(spec: SweepSpec, s: Scenario, plan: SweepPlan, world: str, settings: str,
                router: RouterChoice, engines: str) -> list[tuple[str, Scenario]]:
    """(topology, the scenario to run there). With extend_topologies a scenario also runs in the listed
    topologies it does not list itself, where it still makes sense (its targets exist there)."""
    if not spec.extend_topologies:
        return [(t, s) for t in s.topologies if spec.topologies is None or t in spec.topologies]
    out = []
    for t in spec.topologies or ():
        # Widened, it is no longer the scenario its file names (no replay command names it: `source` "").
        widened = s if t in s.topologies else replace(s, topologies=(*s.topologies, t), source="")
        try:
            validate(widened)
        except ScenarioError as e:
            pairs = dict.fromkeys((c, tr) for _, c, tr in s.matrix(None, spec.connectors, spec.transports))
            for c, tr in pairs:
                key = CellKey(s.name, t, c, tr, router.label, world, settings, engines)
                plan.skipped.append(Skipped(key, f"does not fit {t}: {e}"))
            continue
        out.append((t, widened))
    return out


def _with_bugs(s: Scenario, bugs: Sequence[str]) -> Scenario:
    if not bugs:
        return s
    from harness.scenario.bugs import with_bugs

    try:
        return with_bugs(s, bugs)
    except ValueError as e:
        raise SweepError(f"[bugs] {s.name}: {e}") from None


def _why_not(spec: SweepSpec, key: CellKey, s: Scenario, router: RouterChoice, backend: EngineBackend | None,
             bugs: Sequence[str]) -> str | None:
    """Why this cell cannot (or must not) run; None when it runs."""
    for ex in spec.exclude:
        if ex.matches(key.axes):
            return ex.describe()
    if key.world not in s.worlds:
        note = s.world_notes.get(key.world, "")
        return f"does not run in the {key.world} world" + (f": {note}" if note else "")
    if key.world == "sim":
        try:
            sim_router_name(router.spec)
        except ScenarioError as e:
            return str(e)
        if backend is not None:
            return "the simulated world simulates its own engines: no engine backend"
    if bugs and not _takes_router_bugs(router.spec):
        from harness.scenario.bugs import split_bugs

        router_side, _ = split_bugs(bugs)
        if router_side:
            return f"puts router bug(s) {', '.join(router_side)} back into the reference router"
    if backend is not None:
        from harness.kube.plan import unsupported

        return unsupported(s, key.connector, key.transport, backend.options)
    return None


def _takes_router_bugs(spec: str) -> bool:
    """Whether this router can take the reference router's bug switches (a gateway release is never asked:
    resolving it could install it)."""
    from harness.routers import make_router_adapter
    from harness.routers.gateways.spec import gateway_name

    return gateway_name(spec) is None and make_router_adapter(spec).supports_inject_bug
