"""The summary of a search: seeds tried, runs, runs per second, failures found, distinct signatures, time to
first failure and the shrunk sizes; `summary.json` and the terminal text.

A real-time search (`world` "real") also says how its failures were confirmed: the replays and reference
runs it took, the cases redrawn because the real world cannot carry them out for the router, and the
candidate failures set aside (failed once only, or the reference router fails the case too) apart from the
findings. With `--known RUN`, each finding says whether that run of the shipped scenarios shows the same
problem (its signature as findings key it, lead or consequence), and the summary counts the new ones."""

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
    # Real time: the bug report beside the scenario file, and the reference router's verdict on the case.
    report: str | None = None
    reference: str | None = None
    # --known: the cells of that run that show the same problem (empty: a new finding); None: not compared.
    shown_by: list[str] | None = None


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
    world: str = "sim"
    # Real time: replays of failing cases, runs of the reference router, cases redrawn, and the candidate
    # failures that did not count (`harness.search.realtime.SetAside.as_dict` and the seed).
    replay_runs: int = 0
    reference_runs: int = 0
    redrawn: int = 0
    set_aside: list[dict[str, Any]] = field(default_factory=list)
    # --known: the run folder whose findings tell known problems from new ones.
    known_from: str | None = None
    # --skip-known: cases that failed only in ways the --known run shows, passed by while searching.
    skip_known: bool = False
    known_passed: int = 0

    @property
    def all_runs(self) -> int:
        return self.runs + self.shift_runs + self.replay_runs + self.reference_runs

    @property
    def runs_per_s(self) -> float:
        return round(self.all_runs / self.wall_s, 2) if self.wall_s > 0 else 0.0

    def set_aside_count(self, why: str) -> int:
        return sum(1 for a in self.set_aside if a["why"] == why)

    @property
    def signatures(self) -> list[str]:
        return sorted({f.signature for f in self.found})

    @property
    def new_signatures(self) -> list[str] | None:
        """The distinct signatures no cell of the --known run shows (None: not compared)."""
        if self.known_from is None:
            return None
        return sorted({f.signature for f in self.found if not f.shown_by})

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "world": self.world,
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
            "known_from": self.known_from,
            "new_signatures": self.new_signatures,
            "skip_known": self.skip_known,
            "known_passed": self.known_passed,
            "interrupted": self.interrupted,
            **(self._real_dict() if self.world == "real" else {}),
        }

    def _real_dict(self) -> dict[str, Any]:
        from harness.search.realtime import ONCE, REFERENCE

        return {
            "replay_runs": self.replay_runs,
            "reference_runs": self.reference_runs,
            "redrawn": self.redrawn,
            "set_aside": {"failed_once_only": self.set_aside_count(ONCE),
                          "reference_also_fails": self.set_aside_count(REFERENCE),
                          "cases": self.set_aside},
        }

    def write(self, out: Path) -> Path:
        path = out / "summary.json"
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        return path

    def text(self) -> str:
        d = self.as_dict()
        ttff = d["time_to_first_failure_s"]
        lines = [
            f"pdchaos search: world {self.world}; bugs {', '.join(self.bugs) or 'none'}; router "
            f"{self.router}; settings {self.settings}",
            *(self._real_lines(d) if self.world == "real" else self._sim_lines(d)),
            f"  failures found {len(self.found)}, distinct signatures {len(self.signatures)}, time to first "
            f"failure {'-' if ttff is None else f'{ttff} s'}",
            *self._known_lines(),
            *(["  interrupted: the running seeds stopped where they were"] if self.interrupted else []),
        ]
        for f in self.found:
            s, o = f.shrunk, f.original
            lines.append(
                f"  seed {f.seed}: {f.signature}\n    shrunk to {s['faults']} fault(s), {s['engines']} "
                f"engine(s), {s['duration_s']} s, {s.get('requests', '?')} request(s) (from {o['faults']} "
                f"fault(s), {o['engines']} engine(s)) in {f.shrink_runs} run(s): {f.file}"
            )
            if f.report is not None:
                lines.append(f"    reference router: {f.reference}; bug report: {f.report}")
            if f.shown_by is not None:
                lines.append(_shown_line(f.shown_by, self.known_from))
        return "\n".join(lines)

    def _known_lines(self) -> list[str]:
        new = self.new_signatures
        if new is None:
            if self.world == "sim" and self.router in ("reference", ""):
                return []  # the switches it searches for are the bugs put in on purpose: nothing to tell
            return ["  not compared with what the shipped scenarios show (--known RUN names a `pdchaos run` "
                    "folder of this router)"]
        known = len(self.signatures) - len(new)
        lines = [f"  new: {len(new)} distinct signature(s); already shown by {self.known_from}: {known}"]
        if self.skip_known:
            lines.append(f"  cases passed by, failing only as {self.known_from} shows: {self.known_passed}")
        return lines

    def _sim_lines(self, d: dict[str, Any]) -> list[str]:
        return [
            f"  seeds tried {self.seeds_tried}, runs {self.runs} + {self.shift_runs} shifted "
            f"({d['runs_per_s']}/s, {self.unsound_runs} unsound), wall {d['wall_s']} s, jobs {self.jobs}",
            f"  fragile failures set aside {self.fragile_failures} (gone with the schedule shifted by "
            f"{', '.join(f'{x:g}' for x in self.shifts) or '-'} s)",
        ]

    def _real_lines(self, d: dict[str, Any]) -> list[str]:
        aside = d["set_aside"]
        return [
            f"  seeds tried {self.seeds_tried}, runs {self.runs} + {self.replay_runs} replays + "
            f"{self.reference_runs} on the reference router ({d['runs_per_s']}/s, {self.unsound_runs} "
            f"unsound), wall {d['wall_s']} s, jobs {self.jobs}",
            f"  cases redrawn (the real world cannot carry them out for this router): {self.redrawn}",
            f"  set aside, not counted: {aside['failed_once_only']} failed once only, "
            f"{aside['reference_also_fails']} the reference router also fails",
            *[f"    {a['signature']} ({a['why']}: {a['detail']})" for a in self.set_aside],
        ]


def _shown_line(cells: list[str], run: str | None) -> str:
    if not cells:
        return f"    new: no cell of {run} shows it"
    more = f" (+{len(cells) - 3} more)" if len(cells) > 3 else ""
    return f"    known: {run} shows it in {len(cells)} cell(s): {', '.join(cells[:3])}{more}"
