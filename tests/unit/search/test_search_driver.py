"""The search driver: `--stop-at-first` starts no seed once one has found a failure, and every seed is told
where the stop file is."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.search import driver
from harness.search.driver import SearchOptions, run_search
from harness.search.seedrun import SeedJob, SeedResult


def _fake_seeds(monkeypatch: pytest.MonkeyPatch, finder: int) -> list[SeedJob]:
    """Seeds that find nothing, except `finder`, which (as a real seed does on its first failure) makes the
    stop file when there is one."""
    jobs: list[SeedJob] = []

    def fake(job: SeedJob) -> SeedResult:
        jobs.append(job)
        if job.seed == finder and job.stop_file is not None:
            job.stop_file.touch()
        return SeedResult(job.seed, runs=3)

    monkeypatch.setattr(driver, "search_seed", fake)
    return jobs


def test_stop_at_first_starts_no_seed_after_a_find(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jobs = _fake_seeds(monkeypatch, finder=1)
    opts = SearchOptions(out=tmp_path / "s", seeds=5, jobs=1, budget_s=30.0, stop_at_first=True)
    summary = run_search(opts)
    assert [j.seed for j in jobs] == [0, 1] and summary.seeds_tried == 2 and summary.runs == 6
    assert all(j.stop_file == tmp_path / "s" / "work" / "found-one" for j in jobs)
    assert all(j.shrink_s == 60.0 for j in jobs)


def test_without_it_every_seed_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jobs = _fake_seeds(monkeypatch, finder=1)
    summary = run_search(SearchOptions(out=tmp_path / "s", seeds=5, jobs=1, budget_s=30.0))
    assert [j.seed for j in jobs] == [0, 1, 2, 3, 4] and summary.seeds_tried == 5
    assert all(j.stop_file is None for j in jobs)


def test_a_finding_a_known_lead_absorbs_is_shown_by_that_leads_cells() -> None:
    from harness.search.driver import _shown_by
    from harness.search.execute import RunOutcome
    from harness.search.signature import Signature

    lead = "handoff_params: # handoff parameter not what the contract derives"
    symptom = Signature("availability", "<fault> after: # < #")
    absorbed = ((lead, ("availability: <fault> after: # < #",)),)
    outcome = RunOutcome((symptom,), True, (), 10, absorbed=absorbed)
    known = {lead: ["prefill_restart_mooncake[1p1d/mooncake/http]"]}
    assert _shown_by(known, symptom, outcome) == ["prefill_restart_mooncake[1p1d/mooncake/http]"]
    assert _shown_by(known, symptom, RunOutcome((symptom,), True, (), 10)) == []  # alone: new
    assert _shown_by({}, symptom, outcome) == []
