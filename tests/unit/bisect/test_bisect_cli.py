"""`pdchaos bisect` bad input (exit 3, one line saying what is wrong) and the dry run, with a package index
that is a table (no network, nothing installed, nothing run)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.bisect.cli import main
from harness.cli import main as pdchaos_main
from harness.routers.gateways.cache import ReleaseCache

INDEX = "smg (1.13.0)\nAvailable versions: 1.13.0, 1.12.0, 1.11.0, 1.10.1, 1.10.0\n"


class Index:
    """`pip index versions` only; any other command (an install) fails the test."""

    def __init__(self, output: str = INDEX, rc: int = 0) -> None:
        self.output = output
        self.rc = rc

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        assert list(argv)[1:4] == ["-m", "pip", "index"], argv
        return self.rc, self.output


def _cache(tmp_path: Path, index: Index | None = None) -> ReleaseCache:
    return ReleaseCache(tmp_path / "cache", runner=index or Index(), python="/usr/bin/python3")


BASE = ["prefill_restart_mooncake", "--good", "1.13.0", "--bad", "1.10.1", "--transport", "grpc"]


@pytest.mark.parametrize(("argv", "says"), [
    (["prefill_restart_mooncake", "--good", "1.13.0"], "--bad"),
    ([*BASE, "--router", "reference"], "is not a gateway"),
    ([*BASE, "--router", "cmd:x {port}"], "is not a gateway"),
    ([*BASE, "--router", "smg==1.12.0"], "name the gateway only"),
    ([*BASE, "--router", "nginx"], "unknown router"),
    (["prefill_restart_mooncake", "--good", "one", "--bad", "1.10.1"], "--good 'one' is not a release"),
    (["prefill_restart_mooncake", "--good", "latest", "--bad", "1.10.1"], "not 'latest'"),
    (["prefill_restart_mooncake", "--good", "1.13.0", "--bad", "1.13.0"], "same release"),
    (["prefill_restart_mooncake", "--good", "1.14.0", "--bad", "1.10.1"], "1.14.0 is not on the list"),
    (["no_such_scenario", "--good", "1.13.0", "--bad", "1.10.1"], "no_such_scenario"),
    ([*BASE, "--checker", "nope"], "has no checker 'nope'"),
    ([*BASE, "--repeat", "0"], "--repeat must be at least 1"),
    ([*BASE, "--connector", "nixl"], "applies to no cell"),
    ([*BASE, "--topology", "zz"], "zz"),
    ([*BASE, "--transport", "carrier-pigeon"], "invalid choice"),
])
def test_bad_input_exits_3_with_one_line(argv: list[str], says: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main([*argv, "--out", str(tmp_path / "out")], cache=_cache(tmp_path)))
    assert e.value.code == 3
    err = capsys.readouterr().err
    assert says in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_non_empty_out_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("x")
    assert main([*BASE, "--out", str(out)], cache=_cache(tmp_path)) == 3
    assert "exists and is not empty" in capsys.readouterr().err


def test_dry_run_lists_the_releases_and_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--dry-run", "--checker", "handoff"], cache=_cache(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "prefill_restart_mooncake 1p1d-mooncake-grpc on smg, judged by checker handoff" in out
    assert "releases 1.13.0 (good) .. 1.10.1 (bad): 1.13.0, 1.12.0, 1.11.0, 1.10.1" in out
    assert "at most 4 release(s) to run" in out


def test_unreadable_index_falls_back_to_cached_releases(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing cached: the ends are on no list, which is said (and is a usage error, not a guess).
    assert main([*BASE, "--dry-run"], cache=_cache(tmp_path, Index("no network", rc=1))) == 3
    err = capsys.readouterr().err
    assert "cannot read the package index" in err and "1.13.0, 1.10.1 is not on the list" in err


def test_pdchaos_bisect_is_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        pdchaos_main(["bisect", "--help"])
    assert e.value.code == 0
    assert "first release of a gateway" in capsys.readouterr().out


def test_ctrl_c_writes_the_releases_judged_so_far(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.bisect import release_run
    from harness.bisect.search import Outcome

    class TwoThenCtrlC:
        def __init__(self, *_a: object) -> None:
            self.asked = 0

        async def __call__(self, version: str) -> Outcome:
            self.asked += 1
            if self.asked > 2:
                raise KeyboardInterrupt
            return Outcome(version, "pass" if version == "1.13.0" else "fail", "")

    monkeypatch.setattr(release_run, "ReleaseRunner", TwoThenCtrlC)
    out = tmp_path / "b"
    assert main([*BASE, "--out", str(out)], cache=_cache(tmp_path)) == 2
    doc = json.loads((out / "bisect.json").read_text())
    assert "interrupted" in doc["reason"] and [t["version"] for t in doc["tested"]] == ["1.13.0", "1.10.1"]
    assert "partial bisect" in capsys.readouterr().err
