"""This checkout for a child Python interpreter: the harness may run from a checkout that is not installed
(a bench script that put the root on sys.path), and its helper processes must import the same code."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def env_with_checkout(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with this checkout first on PYTHONPATH."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), out.get("PYTHONPATH")) if p)
    return out
