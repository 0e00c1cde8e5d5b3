"""`pdchaos incident` from the command line: build writes a cited scenario and never overwrites; replay
in simulation (the gateway's profile at the incident's own settings) says reproduced; a bad bundle is one
line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.incident.judge import REPRODUCED, SIM_ONLY

pytestmark = pytest.mark.integration

BUNDLES = Path(__file__).resolve().parents[2] / "data" / "incidents"
needs_gateways = pytest.mark.skipif(
    os.environ.get("PDCHAOS_EXTERNAL") != "1", reason="external gateway test: PDCHAOS_EXTERNAL=1"
)


def test_build_writes_the_scenario_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "i.py"
    assert (
        main(["incident", "build", str(BUNDLES / "smg-1.13.0-restart-between-probes"), "--out", str(out)])
        == 0
    )
    text = out.read_text()
    assert "gateway.log:" in text and "SCENARIOS = [INCIDENT]" in text
    assert main(["list", str(out)]) == 0
    assert (
        main(["incident", "build", str(BUNDLES / "smg-1.13.0-restart-between-probes"), "--out", str(out)])
        == 3
    )
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == text


def test_bad_bundle_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.bin").write_bytes(b"\x00\x01" * 100)
    out = tmp_path / "i.py"
    assert main(["incident", "build", str(tmp_path / "b"), "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("pdchaos: error:") and "\n" not in err and not out.exists()


def test_replay_in_simulation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(
        ["incident", "replay", str(BUNDLES / "smg-1.10.1-mooncake-restart"), "--no-real", "--out", str(out)]
    )
    assert code == 0, capsys.readouterr()
    result = json.loads((out / "incident.json").read_text())
    assert result["outcome"] == SIM_ONLY
    assert result["worlds"]["sim"]["checkers"] == {"recovery": ["fail", "pass"]}
    md = (out / "incident.md").read_text()
    assert "reproduced only in simulation" in md and "| `recovery` | fail | pass |" in md
    assert (out / "sim" / "release" / "report.json").exists() and (
        out / "sim" / "reference" / "report.json"
    ).exists()


def test_replay_needs_a_release_when_the_bundle_names_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(BUNDLES / "vllm-router-0.1.17-hung-decode", bundle)
    (bundle / "incident.toml").unlink()
    assert main(["incident", "replay", str(bundle), "--no-real", "--out", str(tmp_path / "o")]) == 3
    assert "--router" in capsys.readouterr().err


@pytest.mark.external
@needs_gateways
@pytest.mark.parametrize("name", sorted(p.name for p in BUNDLES.iterdir() if p.is_dir()))
def test_each_bundle_reproduces_on_its_release(tmp_path: Path, name: str) -> None:
    """The issue's criterion: each bundle, made with a real release, replays as reproduced on it in real time
    with the reference router passing."""
    out = tmp_path / "run"
    assert main(["incident", "replay", str(BUNDLES / name), "--no-sim", "--out", str(out)]) == 0
    assert json.loads((out / "incident.json").read_text())["outcome"] == REPRODUCED


def test_sigterm_ends_a_replay_as_ctrl_c_does() -> None:
    """SIGTERM raises KeyboardInterrupt, so the run in progress tears its processes down."""
    import signal

    from harness.incident.cli import _interrupt_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        _interrupt_on_signals()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


@pytest.mark.external
@needs_gateways
def test_repeated_replay_folds_the_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    bundle = BUNDLES / "smg-1.13.0-restart-between-probes"
    assert main(["incident", "replay", str(bundle), "--no-sim", "--repeat", "2", "--out", str(out)]) == 0
    cells = sorted(p.name for p in (out / "real" / "release").iterdir() if p.is_dir())
    assert [c.rsplit("__", 1)[1] for c in cells] == ["run1", "run2"]
    assert json.loads((out / "incident.json").read_text())["outcome"] == REPRODUCED
