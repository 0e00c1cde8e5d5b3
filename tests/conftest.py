"""Shared test configuration: markers by folder (`unit`, `integration`); `pytester` for the plugin tests."""

from __future__ import annotations

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
