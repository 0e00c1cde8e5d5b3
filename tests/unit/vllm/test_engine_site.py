"""The engine-side hook that slows NIXL's idle progress thread from a busy loop to a 1 ms poll."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.topology import EngineSpec
from harness.vllm.launch import ENGINE_SITE, NIXL_PROGRESS_DELAY_US, vllm_env

FAKE_API = '''
class _Config:
    pthrDelay = 0

class nixlBind:
    @staticmethod
    def nixlAgentConfig():
        return _Config()

    @staticmethod
    def nixlAgent(name, config):
        return (name, config.pthrDelay)

def make(name):
    cfg = nixlBind.nixlAgentConfig()
    cfg.pthrDelay = 0
    return nixlBind.nixlAgent(name, cfg)
'''


def _run(tmp_path: Path, delay: str) -> str:
    pkg = tmp_path / "nixl_cu13"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_api.py").write_text(FAKE_API)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENGINE_SITE), str(tmp_path)]),
           "PDCHAOS_NIXL_PROGRESS_DELAY_US": delay}
    out = subprocess.run([sys.executable, "-c", "import nixl_cu13._api as a; print(a.make('x')[1])"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_the_hook_sets_the_progress_delay_when_nixl_is_imported(tmp_path: Path) -> None:
    assert _run(tmp_path, "1000") == "1000"


def test_without_a_delay_nothing_is_patched(tmp_path: Path) -> None:
    assert _run(tmp_path, "0") == "0"


FAKE_CPU_PLATFORM = '''
class CpuPlatform:
    @classmethod
    def discover_numa_topology(cls):
        return [[7]]
'''


def _kv_core(tmp_path: Path, core: str) -> str:
    pkg = tmp_path / "vllm" / "platforms"
    pkg.mkdir(parents=True, exist_ok=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cpu.py").write_text(FAKE_CPU_PLATFORM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENGINE_SITE), str(tmp_path)]),
           "PDCHAOS_KV_TRANSFER_CORE": core}
    code = "from vllm.platforms.cpu import CpuPlatform; print(CpuPlatform.discover_numa_topology())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    return out.stdout.strip()


def test_the_kv_transfer_thread_goes_to_the_engines_own_core(tmp_path: Path) -> None:
    assert _kv_core(tmp_path, "1") == "[[1]]"
    assert _kv_core(tmp_path, "") == "[[7]]"  # unset: vLLM's own choice


def test_engines_get_the_hook_on_their_path() -> None:
    spec = EngineSpec("prefill-0", "prefill", 0, 1, 2, 3, 4, 5)
    env = vllm_env(spec, 0)
    assert env["PYTHONPATH"] == str(ENGINE_SITE)
    assert env["PDCHAOS_NIXL_PROGRESS_DELAY_US"] == str(NIXL_PROGRESS_DELAY_US)
    assert env["PDCHAOS_KV_TRANSFER_CORE"] == env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert (ENGINE_SITE / "sitecustomize.py").is_file()
