"""Scenario files: Python files that define `SCENARIOS = [Scenario(...), ...]`, found by path or by name."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.scenario.model import Scenario, ScenarioError, validate


def _scenario_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "scenarios"


def _load_module(path: Path) -> Any:
    mod_name = f"pdchaos_scenarios_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ScenarioError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        sys.modules.pop(mod_name, None)
        raise
    except SystemExit as e:
        # A file that calls sys.exit() must not end pdchaos (with its exit code, having run nothing).
        sys.modules.pop(mod_name, None)
        raise ScenarioError(f"{path}: exited while being imported (sys.exit({e.code!r}))") from None
    except BaseException as e:
        sys.modules.pop(mod_name, None)
        raise ScenarioError(f"{path}: failed to import: {type(e).__name__}: {_one_line(e)}") from e
    return module


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def scenarios_in_file(path: str | Path) -> list[Scenario]:
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"{p}: no such scenario file")
    module = _load_module(p)
    found = getattr(module, "SCENARIOS", None)
    if found is None:
        raise ScenarioError(f"{p}: defines no SCENARIOS list")
    if not isinstance(found, (list, tuple)):
        raise ScenarioError(f"{p}: SCENARIOS must be a list of Scenario, got {type(found).__name__}")
    out = []
    seen: dict[str, int] = {}
    for i, s in enumerate(found):
        if not isinstance(s, Scenario):
            raise ScenarioError(f"{p}: SCENARIOS[{i}] is a {type(s).__name__}, not a Scenario")
        try:
            validate(s)
        except ScenarioError as e:
            raise ScenarioError(f"{p}: {e}") from None
        # Names key run folders, reports and test ids: a second one would silently replace the first.
        if s.name in seen:
            raise ScenarioError(f"{p}: scenario name {s.name!r} defined twice (SCENARIOS[{seen[s.name]}] and "
                                f"SCENARIOS[{i}])")
        seen[s.name] = i
        out.append(replace(s, source=str(p)))
    return out


def split_file_item(item: str) -> tuple[str, str | None]:
    """`FILE.py::NAME` as (FILE.py, NAME); any other item as (item, None)."""
    path, sep, name = item.rpartition("::")
    if sep and path.endswith(".py"):
        return path, name
    return item, None


def is_file_item(item: str) -> bool:
    """Whether a command-line item names a scenario file (or one scenario of it), not a shipped scenario."""
    path, _ = split_file_item(item)
    return path.endswith(".py") or "/" in path


def scenario_in_file(path: str | Path, name: str) -> Scenario:
    """The scenario called `name` in a scenario file; ScenarioError naming the ones it has otherwise."""
    found = scenarios_in_file(path)
    for s in found:
        if s.name == name:
            return s
    have = ", ".join(s.name for s in found) or "none"
    raise ScenarioError(f"{path}: no scenario named {name!r} (it defines: {have})")


def all_scenario_files(directory: Path | None = None) -> list[Path]:
    d = directory or _scenario_dir()
    return sorted(p for p in d.glob("*.py") if not p.name.startswith("_"))


def load_scenarios(
    items: Iterable[str | Path] | None = None, directory: Path | None = None
) -> list[Scenario]:
    """Scenarios from files (paths ending .py; `FILE.py::NAME` picks one scenario of a file) or names (of
    scenarios in the scenario directory).

    No items: every scenario in the directory. An unknown name or a bad file is a ScenarioError saying which.
    Duplicate names across files are an error (names key reports and test ids).
    """
    files = all_scenario_files(directory)
    pool: dict[str, Scenario] = {}
    origin: dict[str, Path] = {}

    def add(s: Scenario, f: Path) -> None:
        if s.name in pool and origin[s.name] != f:
            raise ScenarioError(f"scenario name {s.name!r} defined in both {origin[s.name]} and {f}")
        pool[s.name] = s
        origin[s.name] = f

    wanted = [str(i) for i in (items or [])]
    if not wanted:
        for f in files:
            for s in scenarios_in_file(f):
                add(s, f)
        return list(pool.values())
    out: list[Scenario] = []
    names_needed = [w for w in wanted if not is_file_item(w)]
    if names_needed:
        for f in files:
            for s in scenarios_in_file(f):
                add(s, f)
    chosen: dict[str, str] = {}

    def take(s: Scenario, where: str) -> None:
        # The same scenario named twice runs once; two different ones under one name are an error.
        if s.name in chosen:
            if chosen[s.name] != where:
                raise ScenarioError(f"scenario name {s.name!r} comes from both {chosen[s.name]} and {where}: "
                                    "rename one (names key run folders and reports)")
            return
        chosen[s.name] = where
        out.append(s)

    for w in wanted:
        if is_file_item(w):
            path, name = split_file_item(w)
            found = scenarios_in_file(path) if name is None else [scenario_in_file(path, name)]
            if not found:
                raise ScenarioError(f"{path}: SCENARIOS is empty: no scenario to run")
            for s in found:
                take(s, str(Path(path).resolve()))
        elif w in pool:
            take(pool[w], str(origin[w].resolve()))
        else:
            known = ", ".join(sorted(pool)) or "none"
            raise ScenarioError(f"unknown scenario {w!r} (known: {known})")
    return out
