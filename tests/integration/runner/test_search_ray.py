"""`pdchaos search --ray local`: seeds as Ray tasks on a Ray instance started for the search; the failure a
seed finds comes back and is written here. Runs only where the `ray` extra is installed (CI does not install
it: Ray's services listen on every interface, and the default run keeps to loopback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs pdchaos[ray]")

from harness.search.cli import main


def test_search_on_a_local_ray_finds_and_writes_the_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    out = tmp_path / "s"
    code = main(["--inject-bug", "stale_engine_id", "--ray", "local", "--jobs", "2", "--seeds", "2",
                 "--budget", "60", "--shrink-budget", "30", "--out", str(out)])
    assert code == 1, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds_tried"] == 2 and summary["jobs"] == 2
    assert summary["found"] and all(Path(f["file"]).exists() for f in summary["found"])
    assert {f["signature"].split(":")[0] for f in summary["found"]} == {"handoff"}
