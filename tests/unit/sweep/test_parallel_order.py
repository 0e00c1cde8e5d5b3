"""The order cells start in when several run at once: one cell of each scenario in turn (cells of one
scenario would otherwise restart and load their engines at the same moments)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness.jobs import default_jobs, jobs_arg
from harness.parallel import CellJob, spread
from harness.runner import Cell
from harness.scenario import Scenario, Workload


def job(name: str, i: int, seconds: float = 4.0, topology: str = "1p1d") -> CellJob:
    scenario = Scenario(name=name, description="d", workload=Workload(duration_s=seconds))
    return CellJob(scenario, Cell(topology, "mooncake", "http"), Path(f"/x/{i}"))


def test_cells_of_one_scenario_do_not_start_side_by_side() -> None:
    jobs = [job("a", 0), job("a", 1), job("a", 2), job("b", 3), job("c", 4), job("c", 5)]
    assert spread(jobs) == [0, 3, 4, 1, 5, 2]
    assert sorted(spread(jobs)) == list(range(len(jobs)))
    assert spread([]) == []


def test_the_longest_cells_start_first() -> None:
    jobs = [job("short", 0, 3.0), job("long", 1, 8.0, "1p1d"), job("long", 2, 8.0, "2p2d"),
            job("mid", 3, 6.0)]
    # The long scenario first (its 2p2d cell before its 1p1d one), then the others by length, in turns.
    assert spread(jobs) == [2, 3, 0, 1]


def test_the_default_is_one_per_cpu_within_bounds() -> None:
    assert default_jobs(2) == 2
    assert default_jobs(1) == 1
    assert default_jobs(64) == 8


def test_real_time_cells_default_to_two_per_cpu_within_bounds() -> None:
    assert default_jobs(2, real_time=True) == 4
    assert default_jobs(1, real_time=True) == 2
    assert default_jobs(6, real_time=True) == 8


@pytest.mark.parametrize("text", ["0", "-2", "two"])
def test_a_job_count_below_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        jobs_arg(text)
    assert jobs_arg("3") == 3
