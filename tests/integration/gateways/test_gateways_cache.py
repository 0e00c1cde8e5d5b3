"""Cached release venvs: built on first use, reused after, rebuilt after a broken install, resolved from
$PDCHAOS_SMG / PATH / cache / index. pip and venv are faked: a Python runner, and once a real fake `python`
script run as a subprocess."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.routers import RouterAdapterError, make_router_adapter
from harness.routers.gateways import installed_version, make_gateway_adapter
from harness.routers.gateways.adapters import SmgRouter, VllmRouter
from harness.routers.gateways.cache import (
    CACHE_ENV,
    MARKER,
    GatewayInstallError,
    ReleaseCache,
    cache_root,
    run_command,
)
from harness.routers.gateways.spec import GATEWAYS, parse_router_spec

SMG = GATEWAYS["smg"]
INDEX = "smg (1.13.0)\nAvailable versions: 1.13.0, 1.12.0, 1.11.0\n"


def _exe(path: Path, text: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class FakePip:
    """Stands in for `python -m venv`, `pip install` and `pip index versions`; records every call."""

    def __init__(self, fail_install: bool = False, index: str = INDEX, no_exe: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail_install = fail_install
        self.index = index
        self.no_exe = no_exe

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        assert timeout_s > 0
        argv = list(argv)
        self.calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            _exe(Path(argv[3]) / "bin" / "pip")
            return 0, ""
        if argv[1:4] == ["-m", "pip", "index"]:
            return 0, self.index
        if argv[1] == "install":
            if self.fail_install:
                return 1, "ERROR: No matching distribution found"
            pkg, version = argv[-1].split("==")
            venv = Path(argv[0]).parent.parent
            if not self.no_exe:
                _exe(venv / "bin" / pkg)
            site = venv / "lib" / "python3.11" / "site-packages"
            (site / f"{pkg.replace('-', '_')}-{version}.dist-info").mkdir(parents=True)
            return 0, ""
        return 2, f"unexpected call {argv}"

    def installs(self) -> list[str]:
        return [c[-1] for c in self.calls if len(c) > 1 and c[1] == "install"]


def test_cache_root_env_override(tmp_path: Path) -> None:
    assert cache_root({CACHE_ENV: str(tmp_path / "c")}) == tmp_path / "c"
    assert cache_root({}) == Path("~/.cache/pdchaos/gateways").expanduser()


def test_install_once_then_reuse(tmp_path: Path) -> None:
    pip = FakePip()
    cache = ReleaseCache(tmp_path, runner=pip, python="/usr/bin/python3")
    exe = cache.ensure(SMG, "1.12.0")
    assert exe == tmp_path / "smg-1.12.0" / "bin" / "smg"
    assert (tmp_path / "smg-1.12.0" / MARKER).is_file()
    assert pip.installs() == ["smg==1.12.0"]
    # The venv comes from the given interpreter; pip is the venv's own, never the project's.
    assert pip.calls[0] == ["/usr/bin/python3", "-m", "venv", str(tmp_path / "smg-1.12.0")]
    assert pip.calls[1][0] == str(tmp_path / "smg-1.12.0" / "bin" / "pip")
    assert cache.ensure(SMG, "1.12.0") == exe
    assert len(pip.calls) == 2
    assert cache.cached_versions(SMG) == ["1.12.0"]


def test_failed_install_leaves_no_good_venv_and_is_retried(tmp_path: Path) -> None:
    bad = FakePip(fail_install=True)
    cache = ReleaseCache(tmp_path, runner=bad)
    with pytest.raises(GatewayInstallError, match=r"pip install smg==9\.9\.9 failed"):
        cache.ensure(SMG, "9.9.9")
    assert cache.cached(SMG, "9.9.9") is None
    assert cache.cached_versions(SMG) == []
    good = FakePip()
    cache.runner = good
    assert cache.ensure(SMG, "9.9.9").is_file()
    assert good.installs() == ["smg==9.9.9"]


def test_install_without_executable_is_an_error(tmp_path: Path) -> None:
    cache = ReleaseCache(tmp_path, runner=FakePip(no_exe=True))
    with pytest.raises(GatewayInstallError, match="no 'smg' executable"):
        cache.ensure(SMG, "1.0.0")
    assert cache.cached(SMG, "1.0.0") is None


def test_half_built_venv_without_marker_is_not_cached(tmp_path: Path) -> None:
    _exe(tmp_path / "smg-1.11.0" / "bin" / "smg")
    cache = ReleaseCache(tmp_path, runner=FakePip())
    assert cache.cached(SMG, "1.11.0") is None
    cache.ensure(SMG, "1.11.0")
    assert cache.cached(SMG, "1.11.0") is not None


def test_cached_versions_newest_first(tmp_path: Path) -> None:
    cache = ReleaseCache(tmp_path, runner=FakePip())
    for v in ("1.9.0", "1.10.1", "1.2.0"):
        cache.ensure(SMG, v)
    (tmp_path / "smg-2.0.0").mkdir()  # no marker: not a release in the cache
    assert cache.cached_versions(SMG) == ["1.10.1", "1.9.0", "1.2.0"]
    assert cache.cached_versions(GATEWAYS["vllm-router"]) == []


def test_resolve_order(tmp_path: Path) -> None:
    pip = FakePip()
    cache = ReleaseCache(tmp_path / "cache", runner=pip)
    spec = parse_router_spec("smg")
    explicit = _exe(tmp_path / "elsewhere" / "smg")
    on_path = _exe(tmp_path / "pathdir" / "smg")
    r = cache.resolve(spec, env={"PDCHAOS_SMG": str(explicit), "PATH": str(on_path.parent)})
    assert (r.executable, r.source) == (str(explicit), "env")
    r = cache.resolve(spec, env={"PATH": str(on_path.parent)})
    assert (r.executable, r.source) == (str(on_path), "path")
    # Nothing on PATH, nothing cached: the newest release on the index is installed.
    r = cache.resolve(spec, env={"PATH": str(tmp_path / "empty")})
    assert (r.version, r.source) == ("1.13.0", "installed")
    cache.ensure(SMG, "1.11.0")
    r = cache.resolve(spec, env={"PATH": str(tmp_path / "empty")})
    assert (r.version, r.source) == ("1.13.0", "cache")
    assert pip.installs() == ["smg==1.13.0", "smg==1.11.0"]


def test_resolve_latest_and_pinned(tmp_path: Path) -> None:
    pip = FakePip()
    cache = ReleaseCache(tmp_path, runner=pip)
    assert cache.resolve(parse_router_spec("smg==latest"), env={}).version == "1.13.0"
    r = cache.resolve(parse_router_spec("smg==1.12.0"), env={})
    assert (r.version, r.source) == ("1.12.0", "installed")
    assert cache.resolve(parse_router_spec("smg==1.12.0"), env={}).source == "cache"


def test_resolve_errors(tmp_path: Path) -> None:
    cache = ReleaseCache(tmp_path, runner=FakePip(index="ERROR: nothing\n"))
    with pytest.raises(GatewayInstallError, match="no release of smg"):
        cache.resolve(parse_router_spec("smg==latest"), env={})
    with pytest.raises(RouterAdapterError, match="PDCHAOS_SMG"):
        cache.resolve(parse_router_spec("smg"), env={"PDCHAOS_SMG": str(tmp_path / "nope")})

    def broken(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        return 1, "network unreachable"

    with pytest.raises(GatewayInstallError, match="cannot list smg releases"):
        ReleaseCache(tmp_path, runner=broken).available_versions(SMG)


def test_real_subprocess_with_fake_python(tmp_path: Path) -> None:
    """The default runner with a fake interpreter script: venv and pip are separate processes."""
    fake_python = _exe(tmp_path / "fakepy", """#!/bin/sh
# -m venv DIR: make DIR/bin/pip, itself a script that 'installs' by writing DIR/bin/<pkg>
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cat > "$3/bin/pip" <<'PIP'
#!/bin/sh
spec=""; for a in "$@"; do spec="$a"; done
pkg="${spec%%==*}"
d="$(dirname "$0")"
printf '#!/bin/sh\\necho "%s"\\n' "$spec" > "$d/$pkg"
chmod +x "$d/$pkg"
PIP
  chmod +x "$3/bin/pip"
  exit 0
fi
exit 5
""")
    cache = ReleaseCache(tmp_path / "c", python=str(fake_python))
    exe = cache.ensure(GATEWAYS["vllm-router"], "0.1.17")
    rc, out = run_command([str(exe)], 10.0)
    assert (rc, out.strip()) == (0, "vllm-router==0.1.17")
    rc, out = run_command([str(tmp_path / "does-not-exist")], 5.0)
    assert rc == 127
    rc, _ = run_command([sys.executable, "-c", "import time; time.sleep(5)"], 0.2)
    assert rc == 124


def test_make_router_adapter_installs_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make_router_adapter("smg==X")` resolves through the cache named by $PDCHAOS_GATEWAY_CACHE."""
    root = tmp_path / "gwcache"
    ReleaseCache(root, runner=FakePip()).ensure(SMG, "1.12.0")
    ReleaseCache(root, runner=FakePip()).ensure(GATEWAYS["vllm-router"], "0.1.17")
    monkeypatch.setenv(CACHE_ENV, str(root))
    a = make_router_adapter("smg==1.12.0")
    assert isinstance(a, SmgRouter)
    assert (a.name, a.version) == ("smg-1.12.0", "1.12.0")
    assert a.executable == str(root / "smg-1.12.0" / "bin" / "smg")
    b = make_router_adapter("vllm-router==0.1.17")
    assert isinstance(b, VllmRouter) and b.name == "vllm-router-0.1.17"
    # An unversioned binary named by the env var: its release read from the venv it lives in.
    monkeypatch.setenv("PDCHAOS_SMG", str(root / "smg-1.12.0" / "bin" / "smg"))
    c = make_gateway_adapter("smg", cache=ReleaseCache(root, runner=FakePip()))
    assert c.name == "smg-1.12.0"


def test_installed_version(tmp_path: Path) -> None:
    exe = _exe(tmp_path / "venv" / "bin" / "vllm-router")
    assert installed_version(str(exe), "vllm-router") is None
    (tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm_router-0.1.16.dist-info").mkdir(
        parents=True
    )
    assert installed_version(str(exe), "vllm-router") == "0.1.16"
    assert os.path.isfile(exe)
