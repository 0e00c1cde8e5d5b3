"""`pdchaos fidelity` end to end on loopback: the fakes against the same fakes started by command templates
(the command backend standing in for remote engines), so every fact must agree; bad input is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.fidelity.cli import EXIT_OK, EXIT_USAGE, main
from harness.fidelity.grpc_probes import GRPC_PROBES

ROOT = Path(__file__).resolve().parents[3]
LOCAL_FAKE = ROOT / "examples" / "engines" / "local-fake.toml"


def test_fakes_against_command_started_fakes_agree_on_every_fact(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    probes = "handoff,errors,prefill_restarted,prefill_frozen"
    code = main(["--real", f"command:{LOCAL_FAKE}", "--probes", probes, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    data = json.loads((tmp_path / "fidelity.json").read_text())
    assert data["unexplained"] == 0
    rows = {(r["probe"], r["fact"]): r for r in data["rows"]}
    assert all(r["agree"] for r in rows.values()), [r for r in rows.values() if not r["agree"]]
    assert rows[("prefill_restarted", "new engine id after restart")]["fake"] == "true"
    assert rows[("handoff", "remote_engine_id is the prefill's id")]["real"] == "true"
    assert "| probe | fact | fake |" in (tmp_path / "fidelity.md").read_text()


def test_grpc_probes_fakes_against_command_started_fakes(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--transport", "grpc", "--real", f"command:{LOCAL_FAKE}", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    data = json.loads((tmp_path / "fidelity.json").read_text())
    assert data["transport"] == "grpc" and data["unexplained"] == 0
    rows = {(r["probe"], r["fact"]): r for r in data["rows"]}
    assert all(r["agree"] for r in rows.values()), [r for r in rows.values() if not r["agree"]]
    assert {r[0] for r in rows} == {p.name for p in GRPC_PROBES}
    assert rows[("grpc_abort", "stream after Abort")]["fake"] == "OK; last message complete (abort)"
    assert rows[("grpc_errors", "past the context: how it ends")]["fake"].startswith("length, 4 of 50")
    assert rows[("grpc_handoff", "typed kv_transfer_params")]["fake"] == "remote_host, remote_port"


@pytest.mark.parametrize("argv", [["--probes", "nope"], ["--real", "fake"], ["--real", "bogus"],
                                  ["--real", "k8s:examples/engines/k8s-fake.toml"], ["--probes", ""],
                                  ["--probes", "handoff,,errors"],
                                  ["--connector", "grpc"], ["--transport", "grpc", "--connector", "mooncake"],
                                  ["--transport", "grpc", "--probes", "handoff"]])
def test_bad_input_is_a_usage_error(argv: list[str], tmp_path: Path) -> None:
    try:
        code = main([*argv, "--out", str(tmp_path)])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    assert code == EXIT_USAGE
