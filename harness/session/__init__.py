"""The run logic of one cell, sans-IO: `ScenarioSession` takes the time and the world's events and answers
with commands (`commands`), the events it understands are in `events`; `ledger` tracks faults, `requests`
and `arrivals` say what the load sends and when, `workers` folds the router's worker reads."""

from harness.session.session import CellPlan, Phase, ScenarioSession, SessionResult, scenario_settings

__all__ = ["CellPlan", "Phase", "ScenarioSession", "SessionResult", "scenario_settings"]
