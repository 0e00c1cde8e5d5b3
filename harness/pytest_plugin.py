"""pytest plugin `pdchaos` (entry point `pytest11`): scenarios as tests, and a `pd_cluster` fixture.

Scenarios as tests (opt-in, so a project's own `pytest` run never runs the chaos suite by accident):
- `pytest --pdchaos` runs the default suite (scenarios tagged `default`) and nothing else: the shipped
  scenario folder replaces the default test paths.
- `pytest --pdchaos --pdchaos-world sim` runs them in simulated time (`--pdchaos-settings` picks the preset).
- `pytest --pdchaos path/to/scenarios/ my_scenarios.py` collects scenario files: `*.py` files in a folder
  named `scenarios` (not starting with `_` or `test_`), and any `.py` file named on the command line. A file
  named explicitly contributes all its scenarios; one found in a folder only its `default` ones, unless
  `--pdchaos-all`.
- Each scenario becomes one test per cell: `restarts.py::prefill_restart_mooncake[1p2d-mooncake-http]`.
  `--pdchaos-topology/--pdchaos-connector/--pdchaos-transport` filter the cells, `-k` works as usual.
- pass -> passed; fail -> failed with the checkers' reasons; unknown -> failed (never a pass; with
  `--pdchaos-unknown=skip`, skipped). `--junitxml` works as usual; each test case carries the verdict and the
  cell folder as properties. The run folder (`--pdchaos-out`, default a pytest temp folder) gets
  report.json, junit.xml and report.html at the end of the session.

`pd_cluster` fixture: a running topology (fake engines + the reference router on loopback) for your own
tests; see `harness.pd_cluster.PDCluster`. Configure it with `@pytest.mark.pd_cluster(topology="1p2d",
connector="nixl", transport="grpc", router=RouterSettings(...), engines=EngineSettings(...))` or indirect
parametrization (`@pytest.mark.parametrize("pd_cluster", ["1p2d", {"topology": "2p1d"}], indirect=True)`).
It is a plain (sync) fixture, so it works in sync and async tests under any pytest-asyncio mode.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.cli_args import repeat_arg
from harness.pd_cluster import ClusterConfig, PDCluster, running_cluster
from harness.scenario.model import WORLDS
from harness.scenario.presets import PRESET_NAMES
from harness.usage_parser import seed_arg

_SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"
_RESULTS_KEY = pytest.StashKey[list[Any]]()
_OUT_KEY = pytest.StashKey[Path]()


# ---------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pdchaos", "pdchaos chaos scenarios")
    group.addoption("--pdchaos", action="store_true", default=False,
                    help="collect pdchaos scenarios as tests (alone: the default suite)")
    group.addoption("--pdchaos-all", action="store_true", default=False,
                    help="collect every scenario of scenario folders, not only those tagged 'default'")
    group.addoption("--pdchaos-topology", action="append", default=None, metavar="T",
                    help="only these topologies (repeatable or comma separated)")
    group.addoption("--pdchaos-connector", action="append", default=None, metavar="C",
                    help="only these connectors: mooncake, nixl")
    group.addoption("--pdchaos-transport", action="append", default=None, metavar="TR",
                    help="only these transports: http, grpc")
    group.addoption("--pdchaos-router", default="reference", metavar="ROUTER",
                    help="router under test: 'reference', 'profile:NAME', 'cmd:<template>' or a gateway "
                    "release such as smg==X.Y.Z (as `pdchaos run --router`)")
    group.addoption("--pdchaos-seed", type=seed_arg, default=0, metavar="N",
                    help="workload seed, 0 to 2**32-1")
    group.addoption("--pdchaos-world", choices=WORLDS, default="real",
                    help="real: processes on loopback (default); sim: simulated time (reference router)")
    group.addoption("--pdchaos-settings", choices=PRESET_NAMES, default=None,
                    help="settings preset (default: scaled in real time, production in simulation)")
    group.addoption("--pdchaos-engines", default="fake", metavar="BACKEND",
                    help="engine backend: fake (default), vllm, command:FILE (as `pdchaos run --engines`); "
                    "cells the backend cannot run are skipped with the reason")
    group.addoption("--pdchaos-out", default=None, metavar="DIR",
                    help="run folder for histories, logs and reports (default: a pytest temp folder)")
    group.addoption("--pdchaos-repeat", type=repeat_arg, default=1, metavar="N",
                    help="run each cell N times (real time only): a check that failed in some runs and "
                    "passed in others is a race (as `pdchaos run --repeat`)")
    group.addoption("--pdchaos-fail-on", choices=("race", "fail"), default="race",
                    help="with --pdchaos-repeat: a race fails the test (default) or passes it, counted")
    group.addoption("--pdchaos-unknown", choices=("fail", "skip"), default="fail",
                    help="how an unknown verdict is reported (default: fail; never a pass). skip also "
                    "skips a cell whose router could not start at all")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pd_cluster(topology='1p1d', connector='mooncake', transport='http', router=None, engines=None, "
        "ready_timeout_s=20): configure the pd_cluster fixture",
    )
    if config.getoption("--pdchaos"):
        from harness.routers import CommandRouter, RouterAdapterError, make_router_adapter
        from harness.runner import sim_router_name
        from harness.scenario import ScenarioError
        from harness.suite import out_folder_problem

        router = config.getoption("--pdchaos-router")
        try:
            adapter = make_router_adapter(router)
            if config.getoption("--pdchaos-world") == "sim":
                sim_router_name(router)
        except (RouterAdapterError, ScenarioError) as e:
            raise pytest.UsageError(f"--pdchaos-router: {e}") from None
        if isinstance(adapter, CommandRouter) and (problem := adapter.executable_problem()) is not None:
            raise pytest.UsageError(f"--pdchaos-router: {problem}")
        if config.getoption("--pdchaos-repeat") > 1 and config.getoption("--pdchaos-world") == "sim":
            raise pytest.UsageError("--pdchaos-repeat: a simulated run replays exactly (real time only)")
        given = config.getoption("--pdchaos-out")
        # As `pdchaos run --out`: a folder with an earlier run in it would mix the two in one report.
        if given and (problem := out_folder_problem(Path(given), "--pdchaos-out folder")) is not None:
            raise pytest.UsageError(problem)
        from harness.worlds.real.backends import EngineChoiceError, parse_engines

        try:
            parse_engines(config.getoption("--pdchaos-engines"))
        except EngineChoiceError as e:
            raise pytest.UsageError(f"--pdchaos-engines: {e}") from None
    if config.getoption("--pdchaos") and config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --pdchaos` with no paths: the suite alone, not the project's tests as well.
        config.args = [str(_SCENARIO_DIR)]


def _split(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    out = [p.strip() for v in values for p in v.split(",") if p.strip()]
    return out or None


# ---------------------------------------------------------------- scenario collection


def _is_scenario_file(file_path: Path, parent: pytest.Collector) -> bool:
    if file_path.suffix != ".py" or file_path.name.startswith(("_", "test_")):
        return False
    if parent.session.isinitpath(file_path):
        return True
    return file_path.parent.name == "scenarios"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if not parent.config.getoption("--pdchaos") or not _is_scenario_file(file_path, parent):
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


class ScenarioFile(pytest.File):
    """A scenario file: one item per (scenario, cell)."""

    def collect(self) -> Iterator[pytest.Item]:
        from harness.runner import expand_matrix
        from harness.scenario import ScenarioError, scenarios_in_file
        from harness.topology import parse_topology

        cfg = self.config
        from harness.checkers import validate_expect

        try:
            scenarios = scenarios_in_file(self.path)
        except ScenarioError as e:
            raise self.CollectError(str(e)) from None
        for s in scenarios:
            bad = [p for x in s.expect for p in validate_expect(x.checker, x.params)]
            if bad:
                raise self.CollectError(f"{self.path}: scenario {s.name!r}: " + "; ".join(bad))
        explicit = self.session.isinitpath(self.path)
        if not explicit and not cfg.getoption("--pdchaos-all"):
            # The default suite's cells, as `pdchaos run` cuts them (Scenario.suite_cut).
            scenarios = [s.suite_cut() for s in scenarios if _in_default_suite(s, self.path.parent, cfg)]
        topologies = _split(cfg.getoption("--pdchaos-topology"))
        if topologies:
            try:
                topologies = [parse_topology(t).name for t in topologies]
            except ValueError as e:
                raise self.CollectError(str(e)) from None
        cells = expand_matrix(
            scenarios, topologies, _split(cfg.getoption("--pdchaos-connector")),
            _split(cfg.getoption("--pdchaos-transport")),
        )
        world = cfg.getoption("--pdchaos-world")
        for scenario, cell in cells:
            if world not in scenario.worlds:
                continue
            item = ScenarioItem.from_parent(self, name=f"{scenario.name}[{cell.label}]")
            item.scenario = scenario
            item.cell = cell
            for tag in scenario.tags:
                if tag.isidentifier():
                    # Tags become markers (`-m default`); registered so --strict-markers accepts them.
                    cfg.addinivalue_line("markers", f"{tag}: pdchaos scenario tag")
                    item.add_marker(tag)
            yield item


_DEFAULTS_BY_DIR = pytest.StashKey[dict[Path, set[str]]]()


def _in_default_suite(scenario: Any, folder: Path, config: pytest.Config) -> bool:
    """As `pdchaos run` decides (`harness.suite.default_suite`), over the scenarios of the file's folder."""
    from harness.scenario import ScenarioError, all_scenario_files, scenarios_in_file
    from harness.suite import default_suite

    defaults = config.stash.setdefault(_DEFAULTS_BY_DIR, {})
    if folder not in defaults:
        found: list[Any] = []
        for f in all_scenario_files(folder):
            with contextlib.suppress(ScenarioError):
                found += scenarios_in_file(f)
        defaults[folder] = {s.name for s in default_suite(found, config.getoption("--pdchaos-world"))}
    return scenario.name in defaults[folder]


class ScenarioVerdictError(Exception):
    """A scenario cell that did not pass."""


class ScenarioItem(pytest.Item):
    scenario: Any
    cell: Any

    def runtest(self) -> None:
        from harness.parallel import repeat_dir_name
        from harness.races import fold_runs
        from harness.runner import cell_dir_name, run_scenario
        from harness.worlds.real.backends import not_applicable, parse_engines

        cfg = self.config
        engines = parse_engines(cfg.getoption("--pdchaos-engines"))
        why = not_applicable(engines, self.scenario, self.cell.connector, self.cell.transport)
        if why:
            pytest.skip(why)
        repeat = cfg.getoption("--pdchaos-repeat")
        runs = []
        for i in range(1, repeat + 1):
            out = _run_dir(cfg) / repeat_dir_name(cell_dir_name(self.scenario.name, self.cell), i, repeat)
            runs.append(asyncio.run(
                run_scenario(
                    self.scenario, self.cell.topology, self.cell.connector, self.cell.transport,
                    cfg.getoption("--pdchaos-router"), out, seed=cfg.getoption("--pdchaos-seed"),
                    world=cfg.getoption("--pdchaos-world"), settings=cfg.getoption("--pdchaos-settings"),
                    engines=engines.label,
                )
            ))
        result = fold_runs(runs)
        out = result.folder() or out
        cfg.stash.setdefault(_RESULTS_KEY, []).append(result)
        self.user_properties.append(("pdchaos_status", result.status))
        self.user_properties.append(("pdchaos_cell_dir", str(out)))
        race_passes = result.status == "race" and cfg.getoption("--pdchaos-fail-on") == "fail"
        if result.status == "pass" or race_passes:
            return
        lines = [f"{result.status.upper()}: {self.scenario.name} {self.cell.label}"]
        for v in result.verdicts:
            if v.status != "pass":
                lines.append(f"  {v.status:8} {v.name}: {v.reason}")
        logs = f"  logs: {result.log_dir}" if result.log_dir is not None else ""  # a simulated cell has none
        lines.append(f"  history: {out / 'history.jsonl'}{logs}")
        if result.replay:
            lines.append(f"  replay: {result.replay}")
        text = "\n".join(lines)
        self.user_properties.append(("pdchaos_reason", result.reason))
        if result.status == "unknown" and cfg.getoption("--pdchaos-unknown") == "skip":
            pytest.skip(text)
        raise ScenarioVerdictError(text)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ScenarioVerdictError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"pdchaos scenario {self.name}"


def _run_dir(config: pytest.Config) -> Path:
    if _OUT_KEY not in config.stash:
        given = config.getoption("--pdchaos-out")
        if given:
            path = Path(given)
        else:
            factory = config._tmp_path_factory  # type: ignore[attr-defined]
            path = factory.mktemp("pdchaos-run", numbered=True)
        path.mkdir(parents=True, exist_ok=True)
        config.stash[_OUT_KEY] = path
    return config.stash[_OUT_KEY]


def pytest_sessionfinish(session: pytest.Session) -> None:
    results = session.config.stash.get(_RESULTS_KEY, [])
    if not results:
        return
    from reports import write_reports

    write_reports(_run_dir(session.config), results)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS_KEY, [])
    if results:
        counts = {s: sum(1 for r in results if r.status == s) for s in ("pass", "fail", "unknown", "race")}
        races = f", {counts['race']} race" if counts["race"] else ""
        terminalreporter.write_line(
            f"pdchaos: {len(results)} cell{'' if len(results) == 1 else 's'}: {counts['pass']} pass, "
            f"{counts['fail']} fail, {counts['unknown']} unknown{races}; reports in {_run_dir(config)}"
        )


# ---------------------------------------------------------------- pd_cluster


def _cluster_config(request: pytest.FixtureRequest) -> ClusterConfig:
    """The `pd_cluster` marker's arguments, then an indirect parameter (a topology or a dict) over them."""
    values: dict[str, Any] = {}
    marker = request.node.get_closest_marker("pd_cluster")
    if marker is not None:
        if marker.args:
            values["topology"] = marker.args[0]
        values.update(marker.kwargs)
    param = getattr(request, "param", None)
    if isinstance(param, str):
        values["topology"] = param
    elif isinstance(param, Mapping):
        values.update(param)
    elif param is not None:
        pytest.fail(f"pd_cluster param must be a topology or a dict, got {param!r}", pytrace=False)
    known = set(ClusterConfig.__dataclass_fields__)
    bad = sorted(set(values) - known)
    if bad:
        pytest.fail(f"pd_cluster: unknown option(s) {bad} (known: {sorted(known)})", pytrace=False)
    return ClusterConfig(**values)


@pytest.fixture
def pd_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PDCluster]:
    """A running PD topology (fake engines + reference router); see `harness.pd_cluster.PDCluster`."""
    from harness.topology import parse_topology

    cfg = _cluster_config(request)
    problem = None
    try:
        parse_topology(cfg.topology)
    except ValueError as e:
        problem = str(e)
    if problem is not None:
        pytest.fail(f"pd_cluster: {problem}", pytrace=False)
    out = tmp_path_factory.mktemp(f"pd_cluster-{cfg.topology}", numbered=True)
    with running_cluster(cfg, out) as cluster:
        yield cluster


__all__ = ["ClusterConfig", "PDCluster", "ScenarioFile", "ScenarioItem", "pd_cluster"]
