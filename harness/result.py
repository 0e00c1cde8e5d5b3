"""The result of one scenario run in one cell (topology x connector x transport): what a run returns and the
reports render."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.verdict import Verdict, combine


def time_unit(world: str) -> str:
    """The unit of a history's clock, and of every time a verdict gives (wall times are seconds always)."""
    return "simulated seconds" if world == "sim" else "seconds"


def _path(p: str | os.PathLike[str] | None) -> Path | None:
    return None if p is None or str(p) == "" else Path(p)


@dataclass
class ScenarioResult:
    """One cell's outcome. `verdict` is the combined verdict, `verdicts` the per-checker ones.

    Paths may be absolute or relative to the run folder; the writers show them relative to it. `log_paths`
    empty means "every file under `log_dir`". `started_at`/`ended_at` are wall-clock seconds (None: taken
    from the history when it has them).
    """

    scenario: str
    topology: str
    connector: str
    transport: str = ""
    router: str = ""
    verdict: Verdict | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    bugs: list[str] = field(default_factory=list)
    description: str = ""
    seed: int | None = None
    world: str = "real"
    settings: str = "scaled"
    # The one command that replays this cell (a simulated cell: exactly).
    replay: str = ""
    status: str | None = None
    reason: str = ""
    run_reason: str = ""
    duration_s: float | None = None
    history_path: Path | None = None
    log_dir: Path | None = None
    log_paths: list[Path] = field(default_factory=list)
    out_dir: Path | None = None
    cell_dir: Path | None = None
    started_at: float | None = None
    ended_at: float | None = None
    notes: list[str] = field(default_factory=list)
    # A cell run several times (`--repeat`): each run's status, reason and folder, in order
    # (`harness.races`). Empty for a cell run once.
    runs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict is None:
            self.verdict = combine(self.verdicts, name=self.scenario)
        # The status always follows the verdict: a caller cannot claim a pass the verdict does not hold.
        self.status = self.verdict.status
        self.history_path = _path(self.history_path)
        self.log_dir = _path(self.log_dir)
        self.out_dir = _path(self.out_dir)
        self.cell_dir = _path(self.cell_dir)
        self.log_paths = [Path(p) for p in self.log_paths]
        self.bugs = [str(b) for b in self.bugs]

    @property
    def time_unit(self) -> str:
        return time_unit(self.world)

    @property
    def cell(self) -> str:
        return "-".join(x for x in (self.topology, self.connector, self.transport) if x)

    @property
    def key(self) -> str:
        """Unique within a run: scenario and cell."""
        return f"{self.scenario}__{self.cell}"

    @property
    def overall(self) -> Verdict:
        assert self.verdict is not None  # set in __post_init__
        return self.verdict

    def folder(self) -> Path | None:
        """The cell's own folder (where its history lives)."""
        for p in (self.cell_dir, self.out_dir):
            if p is not None:
                return p
        return self.history_path.parent if self.history_path is not None else None

    def logs(self) -> list[Path]:
        if self.log_paths:
            return list(self.log_paths)
        if self.log_dir is not None and self.log_dir.is_dir():
            return sorted(p for p in self.log_dir.rglob("*") if p.is_file())
        return []

    def to_dict(self, base: Path | None = None) -> dict[str, Any]:
        """JSON-able form; paths relative to `base` when they lie under it."""

        def rel(p: Path | None) -> str | None:
            return None if p is None else relative(p, base)

        return {
            "scenario": self.scenario,
            "description": self.description,
            "bugs": self.bugs,
            "topology": self.topology,
            "connector": self.connector,
            "transport": self.transport,
            "router": self.router,
            "seed": self.seed,
            "world": self.world,
            "settings": self.settings,
            "time_unit": self.time_unit,
            "replay": self.replay,
            "status": self.status,
            "reason": self.reason or (self.overall.reason if self.status != "pass" else ""),
            "run_reason": self.run_reason,
            "verdict": self.overall.to_dict(),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "duration_s": self.duration_s,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "history": rel(self.history_path),
            "cell_dir": rel(self.folder()),
            "log_dir": rel(self.log_dir),
            "logs": [rel(p) for p in self.logs()],
            "notes": list(self.notes),
            "runs": [{"status": r.get("status"), "reason": r.get("reason", ""),
                      "cell_dir": rel(_path(r.get("cell_dir")))} for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: Path | None = None) -> ScenarioResult:
        """Inverse of `to_dict`; relative paths are resolved against `base`."""

        def path(v: Any) -> Path | None:
            if not v:
                return None
            p = Path(str(v))
            return p if p.is_absolute() or base is None else base / p

        verdicts = [Verdict.from_dict(v) for v in data.get("verdicts") or [] if isinstance(v, Mapping)]
        raw = data.get("verdict")
        verdict = Verdict.from_dict(raw) if isinstance(raw, Mapping) else None
        return cls(
            scenario=str(data.get("scenario", "?")),
            topology=str(data.get("topology", "")),
            connector=str(data.get("connector", "")),
            transport=str(data.get("transport", "")),
            router=str(data.get("router", "")),
            verdict=verdict,
            verdicts=verdicts,
            bugs=list(data.get("bugs") or []),
            description=str(data.get("description") or ""),
            seed=data.get("seed"),
            world=str(data.get("world") or "real"),
            settings=str(data.get("settings") or "scaled"),
            replay=str(data.get("replay") or ""),
            reason=str(data.get("reason") or ""),
            run_reason=str(data.get("run_reason") or ""),
            duration_s=data.get("duration_s"),
            history_path=path(data.get("history")),
            log_dir=path(data.get("log_dir")),
            log_paths=[p for p in (path(x) for x in data.get("logs") or []) if p is not None],
            cell_dir=path(data.get("cell_dir")),
            started_at=data.get("started_at"),
            ended_at=data.get("ended_at"),
            notes=[str(n) for n in data.get("notes") or []],
            runs=[{"status": str(r.get("status")), "reason": str(r.get("reason") or ""),
                   "cell_dir": path(r.get("cell_dir"))}
                  for r in data.get("runs") or [] if isinstance(r, Mapping)],
        )


def relative(p: Path, base: Path | None) -> str:
    """`p` relative to `base` when it lies under it, else as given (posix separators)."""
    if base is not None:
        try:
            return Path(os.path.abspath(p)).relative_to(os.path.abspath(base)).as_posix()
        except ValueError:
            pass
    return p.as_posix()


def summarize(results: list[ScenarioResult]) -> dict[str, Any]:
    counts = {s: sum(1 for r in results if r.status == s) for s in ("pass", "fail", "unknown", "race")}
    status = combine([r.overall for r in results], name="run").status if results else "unknown"
    return {"total": len(results), **counts, "status": status}
