"""A failure counts only when the case fails the same way with its fault schedule shifted (`SeedJob.shifts`):
one that needs the exact phase simulated time gives it is set aside as fragile. The world is replaced here by
a rule on the schedule's phase, so that which cases fail is known exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.search import seedrun
from harness.search.case import SearchCase, shifted
from harness.search.execute import RunOutcome
from harness.search.faults import FaultSpec
from harness.search.seedrun import SeedJob, search_seed
from harness.search.signature import Signature

SIG = Signature("recovery", "no correct handoff through <engine> within #s of heal")


def test_shifted_moves_every_fault_and_nothing_else() -> None:
    case = SearchCase(faults=(FaultSpec("crash", "prefill-0", 1.0, 0.5),
                              FaultSpec("link_reset", "decode-0", 2.25, 1.0, "serve")))
    later = shifted(case, 0.1)
    assert [f.start_s for f in later.faults] == [1.1, 2.35]
    assert [(f.kind, f.target, f.length_s, f.link) for f in later.faults] == [
        (f.kind, f.target, f.length_s, f.link) for f in case.faults]
    assert later.load == case.load and later.topology == case.topology


def _world(monkeypatch: pytest.MonkeyPatch, fails: object) -> list[SearchCase]:
    ran: list[SearchCase] = []

    def run_case(case: SearchCase, bugs: tuple[str, ...], out_dir: Path,
                 router: str = "reference") -> RunOutcome:
        ran.append(case)
        sigs = (SIG,) if case.faults and fails(case) else ()  # type: ignore[operator]
        return RunOutcome(signatures=sigs, sound=True, verdicts=(), requests=10)

    monkeypatch.setattr(seedrun, "run_case", run_case)
    return ran


def _phase_tenths(case: SearchCase) -> int:
    return round(case.faults[0].start_s * 100) % 10


def test_a_failure_that_needs_one_phase_is_set_aside(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    # Fails only when the first fault starts on a whole tenth of a second: a 0.05 s shift always passes.
    ran = _world(monkeypatch, lambda c: _phase_tenths(c) == 0)
    res = search_seed(SeedJob(seed=0, bugs=(), work_dir=tmp_path, max_examples=30, shifts=(0.05,)))
    assert res.found is None and res.fragile > 0
    assert res.shift_runs == res.fragile and len(ran) == res.runs + res.shift_runs


def test_a_failure_at_every_phase_is_found_and_shrunk(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    _world(monkeypatch, lambda c: True)
    res = search_seed(SeedJob(seed=0, bugs=(), work_dir=tmp_path, max_examples=30, shifts=(0.05, 0.1)))
    assert res.found is not None and res.fragile == 0 and res.found.signature == SIG
    assert len(res.found.shrunk.faults) == 1
    # Each failing case it kept was checked at both shifts.
    assert res.shift_runs >= 2


def test_no_shifts_counts_every_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _world(monkeypatch, lambda c: _phase_tenths(c) == 0)
    res = search_seed(SeedJob(seed=0, bugs=(), work_dir=tmp_path, max_examples=30, shifts=()))
    assert res.found is not None and res.shift_runs == 0 and res.fragile == 0


def test_only_seed_0_draws_the_simplest_case(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hypothesis draws its simplest case first under any seed: the others skip it, so one short seed each
    (`--examples 1`) runs as many different cases as there are seeds."""
    ran = _world(monkeypatch, lambda c: False)
    firsts = []
    for seed in range(4):
        ran.clear()
        search_seed(SeedJob(seed=seed, bugs=(), work_dir=tmp_path / str(seed), max_examples=1, shifts=()))
        assert len(ran) == 1
        firsts.append(ran[0])
    assert firsts[0] == seedrun.simplest_case(SeedJob(seed=0, bugs=(), work_dir=tmp_path).space)
    assert len(set(map(repr, firsts))) == 4
    # The simplest case is still where every seed's shrinking may end.
    ran = _world(monkeypatch, lambda c: True)
    res = search_seed(SeedJob(seed=3, bugs=(), work_dir=tmp_path / "s", max_examples=5, shifts=()))
    assert res.found is not None


def test_an_interrupted_seed_keeps_what_it_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Ctrl-C (in this process) or the driver's halt file (a pool worker): the seed stops at once and hands
    in its failure as shrunk so far."""
    ran = _world(monkeypatch, lambda c: True)
    inner = seedrun.run_case
    failed: list[int] = []

    def interrupted_once_one_failed(*a: object, **kw: object) -> RunOutcome:
        if failed:
            raise KeyboardInterrupt
        out = inner(*a, **kw)  # type: ignore[arg-type]
        if out.signatures:
            failed.append(len(ran))
        return out

    monkeypatch.setattr(seedrun, "run_case", interrupted_once_one_failed)
    res = search_seed(SeedJob(seed=0, bugs=(), work_dir=tmp_path / "a", max_examples=50, shifts=()))
    assert res.stopped == seedrun.INTERRUPTED and res.found is not None and len(ran) == failed[0]
    halt = tmp_path / "halt"
    halt.touch()
    res = search_seed(SeedJob(seed=1, bugs=(), work_dir=tmp_path / "b", max_examples=50, shifts=(),
                              halt_file=halt))
    assert res.stopped == seedrun.INTERRUPTED and res.runs == 0
