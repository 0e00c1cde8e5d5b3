"""Loaded by every Python process of a pdchaos-started vLLM engine (its PYTHONPATH names this folder).

NIXL's agent runs its progress thread with no delay between polls (`nixl_agent` sets `pthrDelay = 0`),
so each idle engine keeps a core busy; on a 2-core machine two engines then starve the router and the
harness beside them and every timing a scenario judges. This hook sets the delay to
`PDCHAOS_NIXL_PROGRESS_DELAY_US` (microseconds) when NIXL's Python API is first imported; nothing else of
vLLM or NIXL changes. Standalone: it runs in the vLLM venv, where pdchaos is not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_DELAY_US = int(os.environ.get("PDCHAOS_NIXL_PROGRESS_DELAY_US", "0") or 0)
_TARGETS = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")


def _patch(api) -> None:
    bind = api.nixlBind
    make_agent = bind.nixlAgent

    def agent_with_delay(name, config):
        config.pthrDelay = _DELAY_US
        return make_agent(name, config)

    api.nixlBind = type(sys)("nixlBind_with_delay")
    api.nixlBind.__dict__.update({k: getattr(bind, k) for k in dir(bind) if not k.startswith("__")})
    api.nixlBind.nixlAgent = agent_with_delay


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if _DELAY_US > 0:
    sys.meta_path.insert(0, _Finder())
