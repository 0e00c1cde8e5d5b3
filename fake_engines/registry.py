"""The engines started through the vLLM shim, each with what `pdchaos fault` needs to reach it: its name,
role, ports, control port and token. One JSON file (`PDCHAOS_ENGINES_REGISTRY`, else
`$XDG_CACHE_HOME/pdchaos/engines.json`), changed under an exclusive lock; an entry whose process is gone is
dropped whenever the file is read."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV = "PDCHAOS_ENGINES_REGISTRY"


def path() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pdchaos" / "engines.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked() -> Iterator[dict[str, Any]]:
    """The registry's entries (live ones only), written back on exit."""
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_suffix(p.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entries = json.loads(p.read_text()) if p.exists() and p.stat().st_size else {}
        except json.JSONDecodeError:
            entries = {}  # a registry cut by a crash: its engines register again when they start
        entries = {n: e for n, e in entries.items() if isinstance(e, dict) and _alive(int(e.get("pid", 0)))}
        yield entries
        tmp = p.with_suffix(p.suffix + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
        tmp.replace(p)


def register(role: str, info: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """Add this process's engine; its name is `name`, else the first free `<role>-N`."""
    with _locked() as entries:
        if name is None:
            n = 0
            while f"{role}-{n}" in entries:
                n += 1
            name = f"{role}-{n}"
        elif name in entries and entries[name]["pid"] != os.getpid():
            raise ValueError(f"engine {name!r} is already registered by pid {entries[name]['pid']}")
        records = str(path().parent / "records" / f"{name}.jsonl")
        Path(records).parent.mkdir(parents=True, exist_ok=True)
        entry = {**info, "name": name, "pid": os.getpid(), "started_at": time.time(), "records": records}
        entries[name] = entry
        return entry


def unregister(name: str, pid: int) -> None:
    with _locked() as entries:
        if name in entries and entries[name].get("pid") == pid:
            del entries[name]


def engines() -> dict[str, dict[str, Any]]:
    """The live engines by name."""
    with _locked() as entries:
        return dict(entries)
