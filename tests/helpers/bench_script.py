"""A bench script (bench/*.py, run as scripts, not a package) loaded as a module, for tests of its parts."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from helpers.paths import ROOT

BENCH = ROOT / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/`name`.py as the module `bench_<name>`."""
    # The scripts import their siblings (closed_loop, sim_speed) as top-level modules.
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up by name.
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
