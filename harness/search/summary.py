"""The summary of a search: seeds tried, runs, runs per second, failures found, distinct signatures, time to
first failure and the shrunk sizes; `summary.json` and the terminal text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "pdchaos.search/1"


@dataclass
class FoundEntry:
    seed: int
    signature: str
    file: str
    found_after_s: float
    original: dict[str, float]
    shrunk: dict[str, float]
    shrink_runs: int


@dataclass
class Summary:
    bugs: list[str]
    router: str
    settings: str
    budget_s: float
    jobs: int
    seeds_tried: int = 0
    runs: int = 0
    unsound_runs: int = 0
    # Failures set aside because the schedule shifted did not fail the same way, and the runs that told.
    fragile_failures: int = 0
    shift_runs: int = 0
    shifts: tuple[float, ...] = ()
    wall_s: float = 0.0
    time_to_first_failure_s: float | None = None
    found: list[FoundEntry] = field(default_factory=list)
    # Ctrl-C: the seeds that were running stopped where they were (what they had found and shrunk is kept).
    interrupted: bool = False

    @property
    def runs_per_s(self) -> float:
        return round((self.runs + self.shift_runs) / self.wall_s, 2) if self.wall_s > 0 else 0.0

    @property
    def signatures(self) -> list[str]:
        return sorted({f.signature for f in self.found})

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "bugs": self.bugs,
            "router": self.router,
            "settings": self.settings,
            "budget_s": self.budget_s,
            "jobs": self.jobs,
            "seeds_tried": self.seeds_tried,
            "runs": self.runs,
            "unsound_runs": self.unsound_runs,
            "shift_runs": self.shift_runs,
            "shifts_s": list(self.shifts),
            "fragile_failures": self.fragile_failures,
            "wall_s": round(self.wall_s, 3),
            "runs_per_s": self.runs_per_s,
            "seeds_per_s": round(self.seeds_tried / self.wall_s, 3) if self.wall_s > 0 else 0.0,
            "failures_found": len(self.found),
            "distinct_signatures": self.signatures,
            "time_to_first_failure_s": (None if self.time_to_first_failure_s is None
                                        else round(self.time_to_first_failure_s, 3)),
            "found": [vars(f) for f in self.found],
            "interrupted": self.interrupted,
        }

    def write(self, out: Path) -> Path:
        path = out / "summary.json"
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        return path

    def text(self) -> str:
        d = self.as_dict()
        ttff = d["time_to_first_failure_s"]
        lines = [
            f"pdchaos search: bugs {', '.join(self.bugs) or 'none'}; router {self.router}; settings "
            f"{self.settings}",
            f"  seeds tried {self.seeds_tried}, runs {self.runs} + {self.shift_runs} shifted "
            f"({d['runs_per_s']}/s, {self.unsound_runs} unsound), wall {d['wall_s']} s, jobs {self.jobs}",
            f"  fragile failures set aside {self.fragile_failures} (gone with the schedule shifted by "
            f"{', '.join(f'{x:g}' for x in self.shifts) or '-'} s)",
            f"  failures found {len(self.found)}, distinct signatures {len(self.signatures)}, time to first "
            f"failure {'-' if ttff is None else f'{ttff} s'}",
            *(["  interrupted: the running seeds stopped where they were"] if self.interrupted else []),
        ]
        for f in self.found:
            s, o = f.shrunk, f.original
            lines.append(
                f"  seed {f.seed}: {f.signature}\n    shrunk to {s['faults']} fault(s), {s['engines']} "
                f"engine(s), {s['duration_s']} s, {s.get('requests', '?')} request(s) (from {o['faults']} "
                f"fault(s), {o['engines']} engine(s)) in {f.shrink_runs} run(s): {f.file}"
            )
        return "\n".join(lines)
