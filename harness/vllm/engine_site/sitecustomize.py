"""Loaded by every Python process of a pdchaos-started vLLM engine (its PYTHONPATH names this folder).

Two changes, each made when its module is first imported; nothing else of vLLM or NIXL changes.
Standalone: it runs in the vLLM venv, where pdchaos is not installed.

- NIXL's agent runs its progress thread with no delay between polls (`nixl_agent` sets `pthrDelay = 0`),
  so each idle engine keeps a core busy; on a 2-core machine two engines then starve the router and the
  harness beside them and every timing a scenario judges. The delay becomes
  `PDCHAOS_NIXL_PROGRESS_DELAY_US` (microseconds).
- vLLM's CPU NIXL worker pins its main thread (the one that starts KV loads) to the last core of each NUMA
  node (`CpuPlatform.discover_numa_topology`), the same core for every engine on the machine: a decode
  spinning on a KV fetch from a dead peer then starved the other engine's worker there (seen: a killed
  prefill's worker left unscheduled with SIGKILL pending for minutes, its successor stuck moving cores).
  With `PDCHAOS_KV_TRANSFER_CORE` set, that thread goes to the engine's own core instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_DELAY_US = int(os.environ.get("PDCHAOS_NIXL_PROGRESS_DELAY_US", "0") or 0)
_KV_CORE = os.environ.get("PDCHAOS_KV_TRANSFER_CORE", "").strip()
_NIXL_APIS = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")
_CPU_PLATFORM = "vllm.platforms.cpu"


def _patch_nixl(api) -> None:
    bind = api.nixlBind
    make_agent = bind.nixlAgent

    def agent_with_delay(name, config):
        config.pthrDelay = _DELAY_US
        return make_agent(name, config)

    api.nixlBind = type(sys)("nixlBind_with_delay")
    api.nixlBind.__dict__.update({k: getattr(bind, k) for k in dir(bind) if not k.startswith("__")})
    api.nixlBind.nixlAgent = agent_with_delay


def _patch_cpu_platform(module) -> None:
    core = int(_KV_CORE)
    module.CpuPlatform.discover_numa_topology = classmethod(lambda cls: [[core]])


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner = inner
        self.patch = patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, patch)
        return spec


_PATCHES = {}
if _DELAY_US > 0:
    _PATCHES.update(dict.fromkeys(_NIXL_APIS, _patch_nixl))
if _KV_CORE.isdigit():
    _PATCHES[_CPU_PLATFORM] = _patch_cpu_platform
if _PATCHES:
    sys.meta_path.insert(0, _Finder(_PATCHES))
