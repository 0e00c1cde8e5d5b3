"""Gateway releases in cached virtual environments of their own.

`smg==1.12.0` lives in `<cache>/smg-1.12.0/` (a venv; `<cache>` is `$PDCHAOS_GATEWAY_CACHE`, else
`~/.cache/pdchaos/gateways`). It is built in place on first use with a marker file written last, so a
half-built venv is never taken for a good one (it is rebuilt). The project's own environment is never touched.
Every subprocess goes through `Runner` so tests can stand a fake pip in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.routers.base import RouterAdapterError
from harness.routers.gateways.spec import LATEST, Gateway, RouterSpec, version_key

CACHE_ENV = "PDCHAOS_GATEWAY_CACHE"
MARKER = ".pdchaos-installed"
INSTALL_TIMEOUT_S = 900.0
INDEX_TIMEOUT_S = 60.0

# (argv, timeout_s) -> (returncode, combined output)
Runner = Callable[[Sequence[str], float], tuple[int, str]]


def run_command(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:g} s: {' '.join(argv)}"
    except OSError as e:
        return 127, f"{argv[0]}: {e}"
    return p.returncode, (p.stdout or "") + (p.stderr or "")


class GatewayInstallError(RouterAdapterError):
    pass


def cache_root(env: dict[str, str] | None = None) -> Path:
    e = os.environ if env is None else env
    explicit = e.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return Path("~/.cache/pdchaos/gateways").expanduser()


@dataclass(frozen=True)
class Resolved:
    """A gateway binary ready to run: where it is, which release, and how it was found."""

    executable: str
    version: str | None
    source: str  # env, path, cache, installed


def _bin(venv: Path, gw: Gateway) -> Path:
    return venv / "bin" / gw.executable


class ReleaseCache:
    def __init__(
        self,
        root: Path | None = None,
        runner: Runner = run_command,
        python: str = sys.executable,
        pip_args: Sequence[str] = ("-q", "--disable-pip-version-check"),
    ) -> None:
        self.root = root if root is not None else cache_root()
        self.runner = runner
        self.python = python
        self.pip_args = tuple(pip_args)

    def venv_dir(self, gw: Gateway, version: str) -> Path:
        return self.root / f"{gw.package}-{version}"

    def cached(self, gw: Gateway, version: str) -> Path | None:
        """The binary of a complete cached install of that release, else None."""
        venv = self.venv_dir(gw, version)
        exe = _bin(venv, gw)
        if (venv / MARKER).is_file() and os.access(exe, os.X_OK):
            return exe
        return None

    def cached_versions(self, gw: Gateway) -> list[str]:
        """Complete cached releases, newest first."""
        if not self.root.is_dir():
            return []
        out = []
        prefix = gw.package + "-"
        for d in self.root.iterdir():
            if d.name.startswith(prefix) and ".partial" not in d.name:
                v = d.name[len(prefix):]
                if self.cached(gw, v) is not None:
                    out.append(v)
        return sorted(out, key=version_key, reverse=True)

    def available_versions(self, gw: Gateway) -> list[str]:
        """Releases on the package index, newest first (`pip index versions`)."""
        rc, out = self.runner(
            [self.python, "-m", "pip", "index", "versions", gw.package, "--disable-pip-version-check"],
            INDEX_TIMEOUT_S,
        )
        if rc != 0:
            raise GatewayInstallError(f"cannot list {gw.package} releases (pip index rc={rc}): {_tail(out)}")
        return parse_index_versions(out, gw.package)

    def ensure(self, gw: Gateway, version: str) -> Path:
        """The binary of that release, installing it into its own venv on first use."""
        hit = self.cached(gw, version)
        if hit is not None:
            return hit
        self.root.mkdir(parents=True, exist_ok=True)
        venv = self.venv_dir(gw, version)
        # No marker: an earlier install broke half-way. Venvs are not relocatable, so build in place.
        shutil.rmtree(venv, ignore_errors=True)
        rc, out = self.runner([self.python, "-m", "venv", str(venv)], INSTALL_TIMEOUT_S)
        if rc != 0:
            raise GatewayInstallError(f"cannot create venv for {gw.package}=={version}: {_tail(out)}")
        pip = venv / "bin" / "pip"
        argv = [str(pip), "install", *self.pip_args, f"{gw.package}=={version}"]
        rc, out = self.runner(argv, INSTALL_TIMEOUT_S)
        if rc != 0:
            raise GatewayInstallError(f"pip install {gw.package}=={version} failed (rc={rc}): {_tail(out)}")
        if not os.access(_bin(venv, gw), os.X_OK):
            raise GatewayInstallError(f"{gw.package}=={version} installed no {gw.executable!r} executable")
        (venv / MARKER).write_text(f"{gw.package}=={version}\n", encoding="utf-8")
        return _bin(venv, gw)

    def resolve(self, spec: RouterSpec, env: dict[str, str] | None = None) -> Resolved:
        """Where the binary for a gateway spec comes from. Unversioned: `$<ENV_VAR>`, then PATH, then the
        newest cached release, then the newest release on the index (installed)."""
        gw = spec.gateway
        if gw is None:
            raise RouterAdapterError(f"{spec.raw!r} names no gateway")
        e = os.environ if env is None else env
        if spec.version is None:
            explicit = e.get(gw.env_var)
            if explicit:
                if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
                    raise RouterAdapterError(f"${gw.env_var}={explicit!r} is not an executable file")
                return Resolved(explicit, None, "env")
            found = shutil.which(gw.executable, path=e.get("PATH"))
            if found:
                return Resolved(found, None, "path")
            cached = self.cached_versions(gw)
            if cached:
                return Resolved(str(self.cached(gw, cached[0])), cached[0], "cache")
            version = self._newest(gw)
        elif spec.version == LATEST:
            version = self._newest(gw)
        else:
            version = spec.version
        was = self.cached(gw, version)
        exe = self.ensure(gw, version)
        return Resolved(str(exe), version, "cache" if was else "installed")

    def _newest(self, gw: Gateway) -> str:
        versions = self.available_versions(gw)
        if not versions:
            raise GatewayInstallError(f"no release of {gw.package} on the package index")
        return versions[0]


def parse_index_versions(output: str, package: str) -> list[str]:
    """Versions from `pip index versions` output (`Available versions: 1.2.0, 1.1.0`), newest first."""
    m = re.search(r"Available versions:\s*(.+)", output)
    if m is None:
        m2 = re.search(rf"^{re.escape(package)}\s*\(([^)]+)\)", output, re.MULTILINE | re.IGNORECASE)
        return [m2.group(1).strip()] if m2 else []
    versions = [v.strip() for v in m.group(1).split(",") if v.strip()]
    return sorted(dict.fromkeys(versions), key=version_key, reverse=True)


def _tail(text: str, n: int = 400) -> str:
    t = " ".join(text.strip().split())
    return t[-n:]
