"""Judging one release: install it into the gateway cache if needed, run the scenario's cell against it (as
many times as asked), and reduce the result to the status the search compares, with the evidence a reader
needs to believe it: the checkers that did not pass, their reasons and first evidence items."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bisect.search import UNKNOWN, Outcome
from harness.matrix import router_dir_name
from harness.routers.base import RouterAdapterError
from harness.routers.gateways import make_gateway_adapter
from harness.routers.gateways.cache import ReleaseCache
from harness.runner import Cell, cell_dir_name, run_scenario
from harness.scenario import Scenario

# Evidence items kept per checker (a checker may list hundreds of requests; the first few name the
# mechanism, the run folder has the rest).
EVIDENCE_ITEMS = 3
EVIDENCE_CHARS = 300


@dataclass(frozen=True)
class Target:
    """What is bisected: one scenario cell against one gateway spec name (`smg`, `smg-flags`,
    `vllm-router`), judged by the whole verdict or by one checker's."""

    scenario: Scenario
    cell: Cell
    gateway: str
    checker: str | None = None
    settings: str | None = None
    seed: int = 0
    repeat: int = 1
    # Gateway flags passed last, verbatim, to every release (e.g. `--disable-circuit-breaker`: to look past a
    # behaviour that hides the one bisected).
    gateway_args: tuple[str, ...] = ()

    @property
    def judged_by(self) -> str:
        return f"checker {self.checker}" if self.checker else "the scenario's verdict"


def _short(x: Any) -> Any:
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= EVIDENCE_CHARS else s[: EVIDENCE_CHARS - 3] + "..."


def run_summary(res: Any, checker: str | None) -> dict[str, Any]:
    """One run: its status (of the checker when one is named), why, and the checkers that did not pass."""
    if checker is None:
        status, reason = res.status, res.reason
    else:
        named = [v for v in res.verdicts if v.name == checker]
        if named:
            status, reason = named[0].status, named[0].reason
        else:
            status, reason = UNKNOWN, f"no verdict from checker {checker} ({res.run_reason or res.reason})"
    if res.run_reason and res.run_reason != "done":
        # A run that broke judges nothing, whatever its checkers said about the part that ran.
        status, reason = UNKNOWN, f"the run did not finish: {res.run_reason}"
    not_passed = [
        {"checker": v.name, "status": v.status, "reason": v.reason,
         "evidence": [_short(e) for e in list(v.evidence)[:EVIDENCE_ITEMS]]}
        for v in res.verdicts if v.status != "pass"
    ]
    return {"status": status, "reason": reason, "router": res.router, "cell_dir": str(res.folder()),
            "duration_s": res.duration_s, "not_passed": not_passed}


def combine_runs(version: str, runs: list[dict[str, Any]]) -> Outcome:
    """The release's outcome over its runs: their common status; runs that disagree are unknown (flaky), as
    is any run with no verdict."""
    statuses = [r["status"] for r in runs]
    detail = {"runs": runs}
    if not runs:
        return Outcome(version, UNKNOWN, "not run", detail)
    broken = [r for r in runs if r["status"] == UNKNOWN]
    if broken:
        return Outcome(version, UNKNOWN, broken[0]["reason"], detail)
    if len(set(statuses)) > 1:
        counts = ", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses)))
        return Outcome(version, UNKNOWN, f"flaky: the runs disagree ({counts})", detail)
    reason = "" if statuses[0] == "pass" else runs[0]["reason"]
    return Outcome(version, statuses[0], reason, detail)


class ReleaseRunner:
    """The judge `bisect_releases` calls: one release, one or more runs of the target cell."""

    def __init__(self, target: Target, out: Path, cache: ReleaseCache | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.target = target
        self.out = out
        self.cache = cache
        self.say = say or (lambda _line: None)

    async def __call__(self, version: str) -> Outcome:
        t = self.target
        spec = f"{t.gateway}=={version}"
        self.say(f"{spec}: installing if needed")
        try:
            # pip may run for minutes: off the event loop, so an interrupt still reaches the run.
            adapter = await asyncio.to_thread(make_gateway_adapter, spec, self.cache, t.gateway_args)
        except RouterAdapterError as e:
            return Outcome(version, UNKNOWN, f"cannot get {spec}: {e}")
        why = adapter.cannot_run(t.scenario, t.cell.topology, t.cell.connector, t.cell.transport)
        if why is not None:
            return Outcome(version, UNKNOWN, f"{adapter.name} cannot run {t.cell.label}: {why}")
        runs = []
        for i in range(t.repeat):
            sub = self.out / router_dir_name(adapter.name) / (f"run{i + 1}" if t.repeat > 1 else "run")
            self.say(f"{adapter.name}: running {t.scenario.name} {t.cell.label}"
                     + (f" ({i + 1}/{t.repeat})" if t.repeat > 1 else ""))
            # Laid out as `pdchaos run` lays out a run folder: reports on top, the cell in its own folder.
            res = await run_scenario(t.scenario, t.cell.topology, t.cell.connector, t.cell.transport, adapter,
                                     sub / cell_dir_name(t.scenario.name, t.cell), seed=t.seed,
                                     settings=t.settings)
            _write_reports(res, sub)
            runs.append(run_summary(res, t.checker))
            self.say(f"{adapter.name}: {runs[-1]['status'].upper()}"
                     + (f" ({_short(runs[-1]['reason'])})" if runs[-1]["reason"] else ""))
        return combine_runs(version, runs)


def _write_reports(res: Any, out: Path) -> None:
    """The run's own report.json/junit.xml/report.html (the same as `pdchaos run` writes)."""
    from reports import write_reports

    write_reports([res], out)
