"""The run marker: every process one harness command starts carries it (one fork server per run, and the
proof that nothing is left), whichever command it is."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from harness.worlds.real.processes import MARKER_ENV, mark_processes


def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set, then deleted: the monkeypatch restores the environment as it was, marker or not, after the test.
    monkeypatch.setenv(MARKER_ENV, "before")
    monkeypatch.delenv(MARKER_ENV)


def test_the_marker_is_named_after_the_output_folder_and_set_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _unset(monkeypatch)
    first = mark_processes(tmp_path / "run-1")
    assert first.startswith("pdchaos-run-1-")
    # A second folder in the same command (a matrix's routers, a zoo's resume) keeps the command's marker.
    assert mark_processes(tmp_path / "run-2") == first


def test_a_zoo_marks_its_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.zoo.cli import _execute

    _unset(monkeypatch)
    asyncio.run(_execute([], {}, tmp_path / "zoo-x", "real", "scaled", 0, 1, True))
    assert os.environ[MARKER_ENV].startswith("pdchaos-zoo-x-")
