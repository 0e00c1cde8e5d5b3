"""Where seeds run: the Ray address forms `--ray` takes, the error without Ray, and the driver on any
`concurrent.futures` executor."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.search import driver
from harness.search.cli import main
from harness.search.driver import SearchOptions, run_search
from harness.search.executors import ExecutorError, RayExecutor, parse_ray_address
from harness.search.seedrun import SeedJob, SeedResult


@pytest.mark.parametrize("text", ["local", "auto", "10.0.0.5:6379", "ray://head.example:10001"])
def test_ray_addresses(text: str) -> None:
    assert parse_ray_address(text) == text


@pytest.mark.parametrize("text", ["", "cluster", "ray://head", "head:port", "head:70000", ":6379"])
def test_bad_ray_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="--ray takes"):
        parse_ray_address(text)


def test_bad_ray_address_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--ray", "nowhere", "--out", str(tmp_path / "s")]) == 3
    assert "--ray takes" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_without_ray_installed_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ExecutorError, match=r"pdchaos\[ray\]"):
        RayExecutor("local", 2)


def test_search_exits_3_without_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["--ray", "local", "--seeds", "1", "--budget", "5", "--out", str(tmp_path / "s")]) == 3
    assert "pdchaos[ray]" in capsys.readouterr().err


def test_driver_runs_seeds_on_the_executor_it_is_given(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """The driver only needs submit() and futures: a thread pool stands in for the process pool here."""
    seen: list[int] = []

    def seed_job(job: SeedJob) -> SeedResult:
        seen.append(job.seed)
        return SeedResult(job.seed, runs=2)

    monkeypatch.setattr(driver, "search_seed", seed_job)
    monkeypatch.setattr(driver, "open_executor", lambda ray, jobs: ThreadPoolExecutor(max_workers=jobs))
    summary = run_search(SearchOptions(out=tmp_path / "s", seeds=6, jobs=3, budget_s=30.0))
    assert sorted(seen) == list(range(6)) and summary.seeds_tried == 6 and summary.runs == 12
    assert summary.jobs == 3
