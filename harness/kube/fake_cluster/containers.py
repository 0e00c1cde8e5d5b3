"""What a container of the fake runs: its argv, environment and paths, from the pod spec.

There are no images and no mount namespaces: a container is a local process on the host's filesystem.
Only the project's own image (repository `pdchaos`, any registry and tag) can run, because everything it
holds (Python, this package, the console scripts) is already in the venv that runs the fake. The image
is taken to have no ENTRYPOINT: `command` + `args` is the argv (`args` alone when `command` is absent).
The Toxiproxy image (repository `toxiproxy`: a cell's link-fault sidecar) runs as the project's embedded
Toxiproxy-compatible server, `pdchaos-toxiproxy`, with the container's args (its ENTRYPOINT is
`toxiproxy-server`, whose flags that server takes).

There are no network namespaces either: every pod has its own loopback address, and a container that asks
for every interface (`0.0.0.0` in its command or args, e.g. `-host=0.0.0.0`) gets its pod's address.

Mounts are emulated by path translation: every occurrence of a volume's `mountPath` at the start of a
path inside the strings of `command`, `args`, `env` values, `workingDir` and exec commands is replaced by
that volume's folder on the host. `/tmp` is not translated (the host's paths, this venv's included, may
live under it); a pod's TMPDIR is a folder of its own. A path a program builds at run time, or reads from
a file, is not translated.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
RUNNABLE_REPOSITORY = "pdchaos"
TOXIPROXY_REPOSITORY = "toxiproxy"
TOXIPROXY_ENTRYPOINT = "pdchaos-toxiproxy"
_ANY_ADDRESS = re.compile(r"(?<![\d.])0\.0\.0\.0(?![\d.])")
# Host variables a pod's processes inherit: the run marker the process supervision looks for
# (harness/worlds/real/processes.py), so an orphan check finds pod processes too.
_PASS_THROUGH_PREFIX = "PDCHAOS_RUN_MARKER"
_PASS_THROUGH = ("PDCHAOS_RUN",)


class ConfigError(Exception):
    """The container cannot be configured yet (a missing Secret or key): `CreateContainerConfigError`."""


def image_repository(image: str) -> str:
    """`registry:5000/org/pdchaos:0.1.0@sha256:...` -> `pdchaos` (last path part, no tag or digest)."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[0]


def runnable(image: str) -> bool:
    return image_repository(image) in (RUNNABLE_REPOSITORY, TOXIPROXY_REPOSITORY)


class PathMap:
    """Container paths -> host folders, applied to strings (see the module's docstring)."""

    def __init__(self, mounts: Mapping[str, Path]) -> None:
        self.mounts = {self._norm(k): Path(v) for k, v in mounts.items()}
        if self.mounts:
            alternatives = "|".join(re.escape(k) for k in sorted(self.mounts, key=len, reverse=True))
            # A mount path counts only as a whole leading path: "/data" in "x=/data/f" or "/data", not in
            # "/database" or "a/data". One pass, so a host folder put in is never translated again.
            self._re: re.Pattern[str] | None = re.compile(
                rf"(?<![\w.~/-])({alternatives})(?=/|$|[^\w.-])")
        else:
            self._re = None

    @staticmethod
    def _norm(path: str) -> str:
        return path.rstrip("/") or "/"

    def translate(self, text: str) -> str:
        if self._re is None:
            return text
        return self._re.sub(lambda m: str(self.mounts[m.group(1)]), text)


_REF_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` references in command, args and env values; `$$` is a literal `$`; a reference
    to a variable the container does not define stays as written."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REF_RE.sub(sub, text)


def base_env(pod: Obj, home: Path, tmp: Path) -> dict[str, str]:
    """What every container starts from (not the host's environment)."""
    env = {
        # This venv's bin first: the image's console scripts (pdchaos-engine, ...) resolve as in the image.
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # The image's own setting: a Python container's log is readable while it runs.
        "PYTHONUNBUFFERED": "1",
        "HOSTNAME": pod["metadata"]["name"],
    }
    for key, value in os.environ.items():
        if key.startswith(_PASS_THROUGH_PREFIX) or key in _PASS_THROUGH:
            env[key] = value
    return env


_FIELD_RE = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: Obj, path: str) -> str:
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP"), "status.podIPs": status.get("podIP"),
        "status.hostIP": status.get("hostIP"), "status.hostIPs": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    if m := _FIELD_RE.match(path):
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ConfigError(f"unsupported fieldRef fieldPath {path!r}")


SecretLookup = Callable[[str], Obj | None]


def _secret_value(ns: str, ref: Obj, secrets: SecretLookup) -> str | None:
    name, key = ref.get("name", ""), ref.get("key", "")
    secret = secrets(name)
    if secret is None:
        if ref.get("optional"):
            return None
        raise ConfigError(f'secret "{name}" not found')
    data = secret.get("data") or {}
    if key not in data:
        if ref.get("optional"):
            return None
        raise ConfigError(f"couldn't find key {key} in Secret {ns}/{name}")
    try:
        return base64.b64decode(data[key]).decode()
    except (binascii.Error, UnicodeDecodeError) as e:
        raise ConfigError(f"key {key} of Secret {ns}/{name} is not UTF-8 text: {e}") from e


def container_env(pod: Obj, container: Obj, secrets: SecretLookup) -> dict[str, str]:
    """The variables the spec gives the container (`envFrom` secrets, then `env`: later entries win, and
    `$(VAR)` sees the entries before it), untranslated. Raises ConfigError as the kubelet would refuse to
    start the container."""
    ns = pod["metadata"].get("namespace", "")
    own: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        ref = source.get("secretRef")
        if ref is None:
            raise ConfigError("only secretRef is supported in envFrom by the fake cluster")
        secret = secrets(ref.get("name", ""))
        if secret is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f'secret "{ref.get("name")}" not found')
        prefix = source.get("prefix", "")
        for key, value in (secret.get("data") or {}).items():
            own[prefix + key] = base64.b64decode(value).decode(errors="replace")
    for item in container.get("env") or ():
        name = item.get("name", "")
        source = item.get("valueFrom")
        if source is None:
            own[name] = expand(str(item.get("value", "")), own)
        elif "fieldRef" in source:
            own[name] = field_value(pod, source["fieldRef"].get("fieldPath", ""))
        elif "secretKeyRef" in source:
            value = _secret_value(ns, source["secretKeyRef"], secrets)
            if value is not None:
                own[name] = value
        else:
            kinds = ", ".join(sorted(source))
            raise ConfigError(f"env {name}: valueFrom {kinds} is not supported by the fake cluster "
                              "(fieldRef and secretKeyRef are)")
    return own


def process_env(base: Mapping[str, str], own: Mapping[str, str], paths: PathMap) -> dict[str, str]:
    return {**base, **{k: paths.translate(v) for k, v in own.items()}}


def container_argv(container: Obj, own: Mapping[str, str], paths: PathMap, pod_ip: str) -> list[str]:
    """`$(VAR)` is expanded from the spec's own variables before translation, so that a path is translated
    exactly once (a host folder put in must not be taken for a mount path again). `0.0.0.0` becomes
    the pod's address (see the module's docstring)."""
    words = [*(container.get("command") or ()), *(container.get("args") or ())]
    toxiproxy = image_repository(str(container.get("image", ""))) == TOXIPROXY_REPOSITORY
    if toxiproxy and not container.get("command"):
        words = [TOXIPROXY_ENTRYPOINT, *words]
    return [_ANY_ADDRESS.sub(pod_ip, paths.translate(expand(str(w), own))) for w in words]


def volume_folders(pod: Obj, pod_dir: Path) -> tuple[dict[str, Path], str | None]:
    """Each emptyDir volume's host folder; the second item is why the pod cannot run, if it cannot."""
    folders: dict[str, Path] = {}
    for vol in pod.get("spec", {}).get("volumes") or ():
        name = vol.get("name", "")
        kinds = sorted(k for k in vol if k != "name")
        if kinds != ["emptyDir"]:
            return folders, (f'volume "{name}": the fake cluster supports only emptyDir volumes '
                             f"(got {', '.join(kinds) or 'none'})")
        folders[name] = pod_dir / "volumes" / name
    return folders, None


def container_paths(container: Obj, folders: Mapping[str, Path]) -> PathMap:
    mounts: dict[str, Path] = {}
    for m in container.get("volumeMounts") or ():
        folder = folders[m["name"]]
        mounts[m["mountPath"]] = folder / m["subPath"] if m.get("subPath") else folder
    return PathMap(mounts)
