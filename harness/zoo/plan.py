"""Which cells a zoo run runs: every cell of the chosen scenarios with no switch (the baseline, repeated to
catch flaky verdicts), and once per switch wherever the switch can occur (its transports and connectors)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.runner import Cell
from harness.scenario import Scenario
from pdchaos.bugs import BugSwitch


def parse_cell_key(key: str) -> tuple[str, str, str, str]:
    """`scenario[topology/connector/transport]` (a `ZooRun.cell_key`) as its four parts."""
    scenario, rest = key.split("[", 1)
    topology, connector, transport = rest.rstrip("]").split("/")
    return scenario, topology, connector, transport


@dataclass(frozen=True)
class ZooRun:
    """One run of one cell: `switch` None is the baseline (run `repeat` 0, 1, ...)."""

    scenario: str
    cell: Cell
    switch: str | None = None
    repeat: int = 0

    @property
    def cell_key(self) -> str:
        return f"{self.scenario}[{self.cell.topology}/{self.cell.connector}/{self.cell.transport}]"

    @property
    def folder(self) -> str:
        what = self.switch or f"baseline-{self.repeat}"
        return f"{what}/{self.scenario}-{self.cell.topology}-{self.cell.connector}-{self.cell.transport}"


def applicable(switch: BugSwitch, cell: Cell) -> bool:
    """Whether the bug can occur in this cell at all."""
    return switch.occurs_in(cell.connector, cell.transport)


def zoo_plan(
    scenarios: Sequence[Scenario], switches: Sequence[BugSwitch], baseline_runs: int = 1
) -> list[ZooRun]:
    """Baselines first (every cell, `baseline_runs` times), then each switch over the cells it applies to."""
    if baseline_runs < 1:
        raise ValueError(f"baseline runs must be at least 1, not {baseline_runs}")
    cells = [(s.name, Cell(t, c, tr)) for s in scenarios for t, c, tr in s.matrix()]
    runs = [ZooRun(name, cell, None, i) for i in range(baseline_runs) for name, cell in cells]
    for sw in switches:
        runs += [ZooRun(name, cell, sw.name) for name, cell in cells if applicable(sw, cell)]
    return runs
