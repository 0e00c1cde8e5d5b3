"""The bug zoo's detection matrix: the scenario set run once per bug switch and once with none, and which
scenario (and which checker, with what evidence) catches each switch (`pdchaos zoo`).

Modules: `plan` (which cells run with which switch), `matrix` (caught or not, holes and false alarms, from
the results), `report` (zoo.json and zoo.md), `cli` (the command).
"""

from harness.zoo.matrix import ZooMatrix, build_matrix
from harness.zoo.plan import ZooRun, applicable, zoo_plan

__all__ = ["ZooMatrix", "ZooRun", "applicable", "build_matrix", "zoo_plan"]
