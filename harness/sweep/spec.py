"""Sweep files: what a sweep runs, read from TOML and checked before anything starts.

Why TOML: `tomllib` is in the standard library (Python 3.11+), so reading a sweep needs no new dependency
in the default install or in CI; it is the format of `pyproject.toml`, which every user of this project
already edits; and its values are typed without guessing: `smg==1.10` stays a string and `no` is not
false, where YAML's implicit typing turns version numbers into floats and country codes into booleans.

A sweep is the product of its axes (scenarios x topologies x connectors x transports x routers x worlds x
settings presets x engine backends) less its exclusions. The format, with every key optional except the
axes a sweep needs:

    [sweep]
    name = "ci-regression"            # default: the file's stem
    description = "..."
    seed = 0
    jobs = 2                          # default --jobs
    baseline = "runs/ci-baseline"     # default --baseline

    [axes]
    scenarios = ["default"]           # names, files, "default" (the default suite) or "all"
    topologies = ["1p2d", "2p2d"]     # absent: each scenario's own
    extend_topologies = false         # true: run scenarios in listed topologies they do not list themselves
    connectors = ["nixl"]             # absent: each scenario's own (a scenario never runs a connector it
    transports = ["http"]             #   does not list: its faults are connector-specific)
    routers = ["reference", "smg==latest", {spec = "smg==1.13.0", label = "smg-pinned"}]
    worlds = ["real"]                 # real | sim
    settings = ["scaled"]             # scaled | production; absent: each world's default
    engines = ["local"]               # local (fake engines on loopback) or a name from [engines.NAME]

    [[exclude]]                       # every key given must match (a value or a list of values)
    scenario = "sole_prefill_down"
    topology = ["1p2d"]
    reason = "why"

    [bugs]                            # bugs put back into one scenario's run (`--inject-bug` per scenario)
    prefill_restart_mooncake = ["stale_engine_id"]

    [compare]                         # noise thresholds for the baseline comparison (harness.sweep.compare)
    ttft_rel = 0.25

    [engines.gpu-nixl]                # an engine backend (harness.kube)
    backend = "k8s"
    preset = "vllm-nixl-gpu"
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.scenario.model import WORLDS
from harness.scenario.presets import PRESET_NAMES
from harness.topology import CONNECTORS, TRANSPORTS
from harness.usage_parser import seed_problem

LOCAL_ENGINES = "local"
# Axis names as an exclusion writes them (one value of each).
EXCLUDE_KEYS = ("scenario", "topology", "connector", "transport", "router", "world", "settings", "engine")
SWEEP_DIR = Path(__file__).resolve().parent.parent.parent / "scenarios" / "sweeps"
_TOP_KEYS = {"sweep", "axes", "exclude", "bugs", "compare", "engines"}
_AXIS_KEYS = {"scenarios", "topologies", "extend_topologies", "connectors", "transports", "routers", "worlds",
              "settings", "engines"}
_SWEEP_KEYS = {"name", "description", "seed", "jobs", "baseline"}


class SweepError(ValueError):
    """A sweep file that cannot be run as written (one line: the file and the problem)."""


@dataclass(frozen=True)
class RouterChoice:
    """A router of the sweep: its spec (`--router` syntax) and the label its cells are known by (what a
    baseline lines up with: `smg==latest` against last time's `smg==latest`, whatever release it was)."""

    spec: str
    label: str


@dataclass(frozen=True)
class Exclusion:
    """Cells to leave out: every key it names must match."""

    match: Mapping[str, tuple[str, ...]]
    reason: str = ""

    def matches(self, values: Mapping[str, str]) -> bool:
        return all(values.get(k) in allowed for k, allowed in self.match.items())

    def describe(self) -> str:
        what = ", ".join(f"{k}={'|'.join(v)}" for k, v in self.match.items())
        return f"excluded by the sweep file ({what})" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Thresholds:
    """When a change in a number is more than noise (harness.sweep.compare explains each)."""

    ttft_rel: float = 0.25
    ttft_abs_s: float = 0.05
    recovery_rel: float = 0.25
    recovery_abs_s: float = 0.1
    recovery_probe_intervals: float = 2.0
    confidence: float = 0.95
    resamples: int = 2000


@dataclass(frozen=True)
class EngineBackend:
    """An `[engines.NAME]` table: the backend (`k8s`) and its settings, passed to that backend as given."""

    name: str
    backend: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    description: str = ""
    path: Path | None = None
    seed: int = 0
    jobs: int | None = None
    baseline: str | None = None
    scenarios: tuple[str, ...] = ("default",)
    topologies: tuple[str, ...] | None = None
    extend_topologies: bool = False
    connectors: tuple[str, ...] | None = None
    transports: tuple[str, ...] | None = None
    routers: tuple[RouterChoice, ...] = (RouterChoice("reference", "reference"),)
    worlds: tuple[str, ...] = ("real",)
    settings: tuple[str, ...] | None = None
    engines: tuple[str, ...] = (LOCAL_ENGINES,)
    exclude: tuple[Exclusion, ...] = ()
    bugs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    backends: Mapping[str, EngineBackend] = field(default_factory=dict)

    def relative(self, p: str) -> Path:
        """A path the file names: relative to the file's folder when it exists there, else as given."""
        cand = Path(p)
        if not cand.is_absolute() and self.path is not None and (self.path.parent / cand).exists():
            return self.path.parent / cand
        return cand


def find_sweep(name_or_path: str) -> Path:
    """A sweep file by path, or by name among the shipped ones (`scenarios/sweeps/<name>.toml`)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (SWEEP_DIR / name_or_path, SWEEP_DIR / f"{name_or_path}.toml"):
        if cand.is_file():
            return cand
    known = ", ".join(sorted(q.stem for q in SWEEP_DIR.glob("*.toml")))
    raise SweepError(f"no sweep file {name_or_path!r} (shipped sweeps: {known or 'none'})")


def load_sweep(name_or_path: str) -> SweepSpec:
    path = find_sweep(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{path}: not TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise SweepError(f"{path}: not TOML: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise SweepError(f"{path}: {e.strerror or e}") from None
    try:
        return parse_sweep(data, path)
    except SweepError as e:
        raise SweepError(f"{path}: {e}") from None


def parse_sweep(data: Mapping[str, Any], path: Path | None = None) -> SweepSpec:
    """A SweepSpec from decoded TOML; SweepError names every problem found."""
    problems: list[str] = []
    _unknown(data, _TOP_KEYS, "top-level table", problems)
    head = _table(data, "sweep", problems)
    _unknown(head, _SWEEP_KEYS, "[sweep]", problems)
    axes = _table(data, "axes", problems)
    _unknown(axes, _AXIS_KEYS, "[axes]", problems)
    backends = _backends(_table(data, "engines", problems), problems)
    spec = SweepSpec(
        name=str(head.get("name") or (path.stem if path else "sweep")),
        description=str(head.get("description") or ""),
        path=path,
        seed=_seed(head, problems),
        jobs=_jobs(head, problems),
        baseline=_opt_str(head, "baseline", problems),
        scenarios=_strings(axes, "scenarios", problems) or ("default",),
        topologies=_topologies(axes, problems),
        extend_topologies=_bool(axes, "extend_topologies", problems),
        connectors=_choices(axes, "connectors", CONNECTORS, problems),
        transports=_choices(axes, "transports", TRANSPORTS, problems),
        routers=_routers(axes, problems),
        worlds=_choices(axes, "worlds", WORLDS, problems) or ("real",),
        settings=_choices(axes, "settings", PRESET_NAMES, problems),
        engines=_engines(axes, backends, problems),
        exclude=_exclusions(data.get("exclude", []), problems),
        bugs=_bugs(_table(data, "bugs", problems), problems),
        thresholds=_thresholds(_table(data, "compare", problems), problems),
        backends=backends,
    )
    if spec.extend_topologies and not spec.topologies:
        problems.append("extend_topologies needs [axes] topologies")
    if problems:
        raise SweepError("; ".join(problems))
    return spec


# ---------------------------------------------------------------- readers (each appends its problems)


def _unknown(table: Mapping[str, Any], known: set[str], where: str, problems: list[str]) -> None:
    for k in table:
        if k not in known:
            problems.append(f"unknown key {k!r} in {where} (known: {', '.join(sorted(known))})")


def _table(data: Mapping[str, Any], key: str, problems: list[str]) -> Mapping[str, Any]:
    v = data.get(key, {})
    if not isinstance(v, Mapping):
        problems.append(f"[{key}] must be a table")
        return {}
    return v


def _seed(table: Mapping[str, Any], problems: list[str]) -> int:
    v = table.get("seed", 0)
    problem = seed_problem(v)
    if problem is not None:
        problems.append(problem)
        return 0
    return int(v)


def _jobs(table: Mapping[str, Any], problems: list[str]) -> int | None:
    if "jobs" not in table:
        return None
    n = table["jobs"]
    if isinstance(n, bool) or not isinstance(n, int):
        problems.append(f"jobs must be a whole number, not {n!r}")
        return 1
    if n < 1:
        problems.append(f"jobs must be at least 1, not {n}")
    return n


def _bool(table: Mapping[str, Any], key: str, problems: list[str]) -> bool:
    v = table.get(key, False)
    if not isinstance(v, bool):
        problems.append(f"{key} must be true or false, not {v!r}")
        return False
    return v


def _opt_str(table: Mapping[str, Any], key: str, problems: list[str]) -> str | None:
    v = table.get(key)
    if v is not None and not isinstance(v, str):
        problems.append(f"{key} must be a string, not {v!r}")
        return None
    return v


def _strings(table: Mapping[str, Any], key: str, problems: list[str]) -> tuple[str, ...] | None:
    """An axis: a list of strings (or one string); None when absent."""
    if key not in table:
        return None
    v = table[key]
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(x, str) and x for x in items):
        problems.append(f"{key} must be a list of non-empty strings, not {v!r}")
        return None
    if not items:
        problems.append(f"{key} is empty (leave it out to keep each scenario's own)")
        return None
    return tuple(dict.fromkeys(items))


def _choices(table: Mapping[str, Any], key: str, allowed: Sequence[str], problems: list[str]
             ) -> tuple[str, ...] | None:
    items = _strings(table, key, problems)
    for x in items or ():
        if x not in allowed:
            problems.append(f"unknown {key[:-1]} {x!r} (known: {', '.join(allowed)})")
    return items


def _topologies(axes: Mapping[str, Any], problems: list[str]) -> tuple[str, ...] | None:
    from harness.topology import parse_topology

    items = _strings(axes, "topologies", problems)
    out = []
    for t in items or ():
        try:
            out.append(parse_topology(t).name)
        except ValueError as e:
            problems.append(str(e))
    return tuple(dict.fromkeys(out)) if items else None


def router_problem(spec: str) -> str | None:
    """What is wrong with a router spec, checked without installing anything (a gateway release is only
    parsed: it is resolved, and installed on first use, when the sweep runs)."""
    from harness.routers import RouterAdapterError, make_router_adapter
    from harness.routers.gateways.spec import gateway_name, parse_router_spec

    try:
        if gateway_name(spec) is not None:
            parse_router_spec(spec)
        else:
            make_router_adapter(spec)
    except (RouterAdapterError, ValueError) as e:
        return str(e)
    return None


def _routers(axes: Mapping[str, Any], problems: list[str]) -> tuple[RouterChoice, ...]:
    raw = axes.get("routers", ["reference"])
    items = [raw] if isinstance(raw, str | Mapping) else raw
    if not isinstance(items, list) or not items:
        problems.append(f"routers must be a non-empty list, not {raw!r}")
        return (RouterChoice("reference", "reference"),)
    out: list[RouterChoice] = []
    for item in items:
        if isinstance(item, str):
            spec, label = item, item
        elif isinstance(item, Mapping) and isinstance(item.get("spec"), str):
            spec = item["spec"]
            label = str(item.get("label") or spec)
            _unknown(item, {"spec", "label"}, f"router {spec!r}", problems)
        else:
            problems.append(f"a router is a spec string or {{spec = ..., label = ...}}, not {item!r}")
            continue
        why = router_problem(spec)
        if why is not None:
            problems.append(why)
            continue
        out.append(RouterChoice(spec or "reference", label or "reference"))
    labels = [r.label for r in out]
    for dup in sorted({x for x in labels if labels.count(x) > 1}):
        problems.append(f"two routers labelled {dup!r}: give them distinct labels")
    return tuple(out) or (RouterChoice("reference", "reference"),)


def _backends(table: Mapping[str, Any], problems: list[str]) -> dict[str, EngineBackend]:
    out: dict[str, EngineBackend] = {}
    for name, body in table.items():
        if name == LOCAL_ENGINES:
            problems.append(f"[engines.{LOCAL_ENGINES}] is built in: pick another name")
            continue
        if not isinstance(body, Mapping) or body.get("backend") != "k8s":
            problems.append(f"[engines.{name}] needs backend = \"k8s\" (the one cluster backend there is)")
            continue
        options = {k: v for k, v in body.items() if k != "backend"}
        from harness.kube.options import parse_options

        try:
            parse_options(options)
        except ValueError as e:
            problems.append(f"[engines.{name}]: {e}")
            continue
        out[name] = EngineBackend(name, "k8s", options)
    return out


def _engines(axes: Mapping[str, Any], backends: Mapping[str, EngineBackend], problems: list[str]
             ) -> tuple[str, ...]:
    items = _strings(axes, "engines", problems) or (LOCAL_ENGINES,)
    for x in items:
        if x != LOCAL_ENGINES and x not in backends:
            problems.append(f"engine backend {x!r} has no [engines.{x}] table")
    return items


def _exclusions(raw: Any, problems: list[str]) -> tuple[Exclusion, ...]:
    if not isinstance(raw, list):
        problems.append("exclude must be an array of tables ([[exclude]])")
        return ()
    out = []
    for item in raw:
        if not isinstance(item, Mapping):
            problems.append(f"an [[exclude]] entry must be a table, not {item!r}")
            continue
        match: dict[str, tuple[str, ...]] = {}
        for k, v in item.items():
            if k == "reason":
                continue
            if k not in EXCLUDE_KEYS:
                known = ", ".join((*EXCLUDE_KEYS, "reason"))
                problems.append(f"unknown key {k!r} in [[exclude]] (known: {known})")
                continue
            values = [v] if isinstance(v, str) else v
            if not isinstance(values, list) or not values or not all(isinstance(x, str) for x in values):
                problems.append(f"[[exclude]] {k} must be a string or a list of strings, not {v!r}")
                continue
            match[k] = tuple(values)
        if not match:
            problems.append("an [[exclude]] entry names no axis: it would exclude every cell")
            continue
        out.append(Exclusion(match, str(item.get("reason") or "")))
    return tuple(out)


def _bugs(table: Mapping[str, Any], problems: list[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for scenario, v in table.items():
        names = [v] if isinstance(v, str) else v
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            problems.append(f"[bugs] {scenario} must be a bug name or a list of them, not {v!r}")
            continue
        out[scenario] = tuple(names)
    return out


def _thresholds(table: Mapping[str, Any], problems: list[str]) -> Thresholds:
    known = {f.name: f for f in fields(Thresholds)}
    values: dict[str, Any] = {}
    for k, v in table.items():
        if k not in known:
            problems.append(f"unknown key {k!r} in [compare] (known: {', '.join(known)})")
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            problems.append(f"[compare] {k} must be a number >= 0, not {v!r}")
            continue
        values[k] = int(v) if k == "resamples" else float(v)
    if not 0 < values.get("confidence", 0.95) < 1:
        problems.append("[compare] confidence must be between 0 and 1")
        values.pop("confidence")
    return Thresholds(**values)
