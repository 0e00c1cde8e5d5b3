"""A found file's replay commands: a search against a gateway profile names the profile, since its switches
and timings are not in the scenario file (without it the replay ran the plain reference router and passed)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from harness.search.case import SearchCase
from harness.search.faults import FaultSpec
from harness.search.found import write_found
from harness.search.signature import Signature

CASE = SearchCase(topology="1p1d", faults=(FaultSpec("restart", "prefill-0", 1.0, 1.0),), run_seed=4)
SIG = Signature("nothing_lost", "lost requests")


def _replays(path: Path) -> list[list[str]]:
    lines = path.read_text().splitlines()
    return [shlex.split(ln) for ln in lines if ln.strip().startswith("pdchaos run ")]


def test_a_profile_search_replays_with_that_profile(tmp_path: Path) -> None:
    path = write_found(tmp_path, SIG, 3, ("shutdown_drops_pulls",), CASE, CASE, "3 lost",
                       router="profile:smg-1.13.0")
    sim, real = _replays(path)
    for words in (sim, real):
        assert words[2] == str(path) and words[words.index("--router") + 1] == "profile:smg-1.13.0"
        assert words[words.index("--seed") + 1] == "4"
    assert "Router: profile:smg-1.13.0" in path.read_text()


def test_a_reference_search_replays_without_a_router_flag(tmp_path: Path) -> None:
    path = write_found(tmp_path, SIG, 3, ("stale_engine_id",), CASE, CASE, "3 lost")
    assert all("--router" not in words for words in _replays(path))


def test_the_replay_names_the_file_by_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_found(Path("runs/search-x"), SIG, 3, ("stale_engine_id",), CASE, CASE, "3 lost")
    for words in _replays(tmp_path / path):
        assert words[2] == str(tmp_path / path)


def test_a_case_the_real_worlds_proxy_cannot_follow_is_written_for_simulation_only(tmp_path: Path) -> None:
    """A side_channel link fault and a restart of the same Mooncake prefill: its found file still loads."""
    from harness.scenario.files import scenarios_in_file

    cut = FaultSpec("partition_down", "prefill-0", 1.0, 1.0, "side_channel")
    case = SearchCase(topology="1p1d", faults=(cut, FaultSpec("restart", "prefill-0", 1.5, 0.5)), run_seed=4)
    path = write_found(tmp_path, SIG, 3, (), case, case, "lost")
    (s,) = scenarios_in_file(path)
    assert s.worlds == ("sim",) and "side-channel port" in s.world_notes["real"]
    assert len(_replays(path)) == 1 and "Not in real time: a side_channel link fault" in path.read_text()
    plain = write_found(tmp_path, SIG, 3, (), CASE, CASE, "lost")
    assert scenarios_in_file(plain)[0].worlds == ("real", "sim")
