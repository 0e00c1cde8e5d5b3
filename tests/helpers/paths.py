"""Where things are, for tests that run the CLI or copy scenario files."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
SCENARIO_FILES = TESTS / "scenario_files"
