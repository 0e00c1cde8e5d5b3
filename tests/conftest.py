"""Shared test configuration: markers by folder (`unit`, `integration`); `pytester` for the plugin tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_HERE = Path(__file__).resolve().parent
_FOLDER_MARKERS = {"unit": pytest.mark.unit, "integration": pytest.mark.integration}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = Path(str(item.path)).resolve().relative_to(_HERE).parts[0]
        except (ValueError, IndexError):
            continue
        marker = _FOLDER_MARKERS.get(top)
        if marker is not None:
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _run_marker_kept() -> Iterator[None]:
    """A command called in-process (run, sweep, matrix, zoo, bisect) marks its processes through the
    environment (`mark_processes`): the marker must not outlive the test and mark the next tests' ones."""
    before = os.environ.get("PDCHAOS_RUN_MARKER")
    yield
    if before is None:
        os.environ.pop("PDCHAOS_RUN_MARKER", None)
    else:
        os.environ["PDCHAOS_RUN_MARKER"] = before
