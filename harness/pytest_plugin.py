"""pytest plugin `pdchaos` (entry point pytest11): placeholder until the scenario runner lands."""

from __future__ import annotations
