"""vLLM's command line, read for a fake engine: what `pdchaos engines shim` starts where a harness starts vLLM
(`python3 -m vllm.entrypoints.openai.api_server ...`, `python3 -m vllm.entrypoints.grpc_server ...`,
`vllm serve MODEL ...`).

The flags that shape what a router sees are read: the model and served name, the port, the KV transfer config
(connector, role, engine id), the data-parallel size, and vLLM's environment (the Mooncake bootstrap port,
the NIXL side-channel port, the abort timeouts). The flags that change nothing on a fake (GPU memory, tensor
parallelism, compilation...) are accepted and listed as such. An unknown flag or a malformed config is
refused as vLLM refuses it: a usage line and `error: ...` on stderr, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_engines import registry

# vLLM's defaults for its PD environment (vllm/envs.py).
MOONCAKE_BOOTSTRAP_PORT = 8998
NIXL_SIDE_CHANNEL_PORT = 5600
ABORT_TIMEOUT_S = 480.0
# vLLM's names, as fake_engines.config has them the other way round; not imported from there, because it
# pulls in the tokenizer, and the shim must be able to say so when a bare python3 lacks it.
CONNECTORS = {"MooncakeConnector": "mooncake", "MooncakeConnectorV1": "mooncake", "NixlConnector": "nixl"}
ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}

# Flags that take a value and change nothing on a fake.
IGNORED_VALUE_FLAGS = (
    "--tensor-parallel-size",
    "-tp",
    "--pipeline-parallel-size",
    "-pp",
    "--gpu-memory-utilization",
    "--max-model-len",
    "--dtype",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--swap-space",
    "--kv-cache-dtype",
    "--tokenizer",
    "--tokenizer-mode",
    "--download-dir",
    "--load-format",
    "--quantization",
    "--distributed-executor-backend",
    "--uvicorn-log-level",
    "--chat-template",
    "--revision",
    "--max-logprobs",
    "--compilation-config",
    "-O",
    "--cpu-offload-gb",
    "--data-parallel-size-local",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--api-server-count",
    "--worker-cls",
    "--hf-overrides",
    "--override-generation-config",
    "--generation-config",
    "--limit-mm-per-prompt",
    "--reasoning-parser",
    "--tool-call-parser",
    "--api-key",
    "--root-path",
    "--ssl-keyfile",
    "--ssl-certfile",
)
# Switches that change nothing on a fake.
IGNORED_SWITCHES = (
    "--enforce-eager",
    "--trust-remote-code",
    "--disable-log-requests",
    "--disable-log-stats",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--disable-custom-all-reduce",
    "--enable-log-requests",
    "--enable-auto-tool-choice",
    "--headless",
    "--disable-frontend-multiprocessing",
    "--enable-expert-parallel",
    "--no-enable-log-requests",
)


class VllmUsageError(ValueError):
    """A command line vLLM would refuse."""


@dataclass
class VllmArgs:
    entrypoint: str
    model: str
    served_name: str
    host: str
    port: int
    role: str
    connector: str
    engine_id: str | None
    dp_size: int
    dp_rank: int
    bootstrap_port: int
    side_channel_port: int
    abort_timeout_s: float
    notes: list[str] = field(default_factory=list)


def _kv_config(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"Value {text} cannot be converted to KVTransferConfig: {exc}"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"Value {text} cannot be converted to KVTransferConfig: not an object"
        )
    known = {
        "kv_connector",
        "kv_role",
        "engine_id",
        "kv_connector_extra_config",
        "kv_buffer_device",
        "kv_buffer_size",
        "kv_rank",
        "kv_parallel_size",
        "kv_ip",
        "kv_port",
        "kv_connector_module_path",
    }
    unknown = sorted(set(value) - known)
    if unknown:
        raise argparse.ArgumentTypeError(f"KVTransferConfig: unexpected keyword argument(s) {unknown}")
    role = value.get("kv_role")
    if role is not None and role not in ROLES:
        raise argparse.ArgumentTypeError(f"Unsupported kv_role: {role}. Supported roles are {sorted(ROLES)}")
    connector = value.get("kv_connector")
    if connector is not None and connector not in CONNECTORS:
        raise argparse.ArgumentTypeError(
            f"Unsupported kv_connector: {connector} (a fake engine speaks {', '.join(sorted(CONNECTORS))})"
        )
    return value


def build_parser(entrypoint: str) -> argparse.ArgumentParser:
    prog = {"serve": "vllm serve", "api_server": "api_server.py", "grpc_server": "grpc_server.py"}[entrypoint]
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"pdchaos's fake vLLM engine behind vLLM's command line ({entrypoint}).",
        epilog="Accepted, no effect on a fake: " + " ".join(IGNORED_VALUE_FLAGS + IGNORED_SWITCHES) + ".\n"
        "Environment: VLLM_MOONCAKE_BOOTSTRAP_PORT (a Mooncake prefill's bootstrap port, default 8998), "
        "VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600), VLLM_NIXL_ABORT_REQUEST_TIMEOUT / "
        "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (seconds before a prefill frees unread KV, default 480), "
        "PDCHAOS_ENGINE_NAME (the name `pdchaos fault` knows it by), PDCHAOS_ENGINES_REGISTRY, "
        "PDCHAOS_SHIM_PYTHON (the Python to run the fake engine under, when the caller's python3 lacks "
        "pdchaos's dependencies).",
    )
    if entrypoint == "serve":
        p.add_argument("model_tag", metavar="MODEL", help="the model name or path (any string)")
    p.add_argument(
        "--model", default=None, help="the model name or path (any string; the fake serves its own tokenizer)"
    )
    p.add_argument("--served-model-name", nargs="+", default=None, help="the name(s) clients use")
    p.add_argument(
        "--host", default=None, help="bind address (a fake binds loopback only; 0.0.0.0 -> 127.0.0.1)"
    )
    p.add_argument("--port", type=int, default=50051 if entrypoint == "grpc_server" else 8000)
    p.add_argument(
        "--kv-transfer-config",
        type=_kv_config,
        default=None,
        help="JSON: kv_connector (MooncakeConnector, NixlConnector), kv_role (kv_producer, "
        "kv_consumer, kv_both), engine_id, kv_connector_extra_config",
    )
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-rank", "-dpn", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    for flag in IGNORED_VALUE_FLAGS + IGNORED_SWITCHES:
        dest = f"ignored_{flag.lstrip('-').replace('-', '_')}"
        action = "store_true" if flag in IGNORED_SWITCHES else "store"
        p.add_argument(flag, dest=dest, action=action, help=argparse.SUPPRESS)
    return p


def _env_port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise VllmUsageError(f"{name}={raw!r} is not a port")
    return int(raw)


def _env_seconds(env: Mapping[str, str], names: Sequence[str], default: float) -> float:
    for name in names:
        raw = env.get(name)
        if raw:
            try:
                return float(raw)
            except ValueError:
                raise VllmUsageError(f"{name}={raw!r} is not a number of seconds") from None
    return default


def read_args(argv: Sequence[str], entrypoint: str, env: Mapping[str, str]) -> VllmArgs:
    """vLLM's command line and environment as the fake engine's settings. Exits 2 (argparse) on bad flags."""
    args = build_parser(entrypoint).parse_args(list(argv))
    model = getattr(args, "model_tag", None) or args.model or "facebook/opt-125m"
    notes: list[str] = []
    host = args.host or "0.0.0.0"
    if host in ("0.0.0.0", "::", ""):
        notes.append(f"--host {host}: bound to 127.0.0.1 (a fake engine serves loopback only)")
        host = "127.0.0.1"
    elif not (host.startswith("127.") or host == "localhost"):
        raise VllmUsageError(f"--host {host}: a fake engine binds a loopback address only")
    kv = args.kv_transfer_config or {}
    role = ROLES.get(kv.get("kv_role", "kv_both"), "both")
    connector = CONNECTORS.get(kv.get("kv_connector", ""), "none")
    engine_id = kv.get("engine_id")
    if engine_id is not None and args.data_parallel_size > 1:
        engine_id = f"{engine_id}_dp{args.data_parallel_rank}"  # vLLM suffixes the id per DP rank
    return VllmArgs(
        entrypoint=entrypoint,
        model=model,
        served_name=(args.served_model_name or [model])[0],
        host=host,
        port=args.port,
        role=role,
        connector=connector,
        engine_id=engine_id,
        dp_size=args.data_parallel_size,
        dp_rank=args.data_parallel_rank,
        bootstrap_port=_env_port(env, "VLLM_MOONCAKE_BOOTSTRAP_PORT", MOONCAKE_BOOTSTRAP_PORT),
        side_channel_port=_env_port(env, "VLLM_NIXL_SIDE_CHANNEL_PORT", NIXL_SIDE_CHANNEL_PORT),
        abort_timeout_s=_env_seconds(
            env, ("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"), ABORT_TIMEOUT_S
        ),
        notes=notes,
    )


def fake_argv(v: VllmArgs, name: str, control_port: int, records: str) -> list[str]:
    """The fake engine's own command line for these settings."""
    out = [
        "--name", name,
        "--role", v.role,
        "--connector", v.connector,
        "--host", v.host,
        "--model", v.served_name,
        "--dp-size", str(v.dp_size),
        "--kv-abort-timeout-s", f"{v.abort_timeout_s:g}",
        "--control-port", str(control_port),
        "--log-level", "INFO",
        "--records", records,
    ]
    out += ["--grpc-port", str(v.port)] if v.entrypoint == "grpc_server" else ["--http-port", str(v.port)]
    if v.connector == "mooncake" and v.role in ("prefill", "both"):
        out += ["--bootstrap-port", str(v.bootstrap_port)]
    if v.connector == "nixl":
        out += ["--nixl-port", str(v.side_channel_port)]
    if v.engine_id:
        out += ["--engine-id", v.engine_id]
    return out


# The modules each entrypoint is started as, for a handover to pdchaos's own Python.
ENTRY_MODULES = {
    "grpc_server": "vllm.entrypoints.grpc_server",
    "api_server": "vllm.entrypoints.openai.api_server",
    "serve": "vllm.entrypoints.cli.main",
}
# Set to the Python that has pdchaos's dependencies: a shim started by another Python (a gateway's test suite
# whose `python3` must have the gateway's own packages) runs the fake engine under that one instead.
SHIM_PYTHON_ENV = "PDCHAOS_SHIM_PYTHON"
_HANDED_OVER_ENV = "PDCHAOS_SHIM_HANDED_OVER"


def handover_argv(
    argv: Sequence[str], entrypoint: str, env: Mapping[str, str], executable: str
) -> list[str] | None:
    """The command line that runs this shim under `$PDCHAOS_SHIM_PYTHON`, or None to run here (unset, already
    that Python, or already handed over once)."""
    target = env.get(SHIM_PYTHON_ENV, "")
    if not target or env.get(_HANDED_OVER_ENV) or os.path.abspath(target) == os.path.abspath(executable):
        return None
    return [target, "-m", ENTRY_MODULES[entrypoint], *argv]


def main(argv: Sequence[str] | None, entrypoint: str) -> int:
    """Start a fake engine from vLLM's command line, registered for `pdchaos fault` while it runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    handover = handover_argv(argv, entrypoint, os.environ, sys.executable)
    if handover is not None:
        if not os.access(handover[0], os.X_OK):
            print(f"pdchaos vllm shim: {SHIM_PYTHON_ENV}={handover[0]} is not an executable", file=sys.stderr)
            return 2
        os.environ[_HANDED_OVER_ENV] = "1"
        # `vllm serve` put the shim on its own sys.path only: the other Python needs it on PYTHONPATH.
        shim = str(Path(__file__).resolve().parent / "vllm_shim")
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if shim not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([shim, *paths])
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(handover[0], handover)
    if entrypoint == "serve":
        if not argv or argv[0] != "serve":
            print("usage: vllm serve MODEL [options]  (the pdchaos shim runs `serve` only)", file=sys.stderr)
            return 2
        argv = argv[1:]
    try:
        v = read_args(argv, entrypoint, os.environ)
    except VllmUsageError as exc:
        print(f"{build_parser(entrypoint).prog}: error: {exc}", file=sys.stderr)
        return 2
    for note in v.notes:
        print(f"pdchaos vllm shim: {note}", file=sys.stderr)
    try:
        from fake_engines.cli import main as engine_main
        from pdchaos.ports import free_port
    except ImportError as exc:
        print(f"pdchaos vllm shim: {sys.executable} lacks pdchaos's dependencies ({exc}); put pdchaos's "
              'environment first: eval "$(pdchaos engines shim --env)", or name its Python in '
              f"{SHIM_PYTHON_ENV}", file=sys.stderr)
        return 2
    control_port, token = free_port(), secrets.token_hex(16)
    entry = registry.register(
        v.role,
        {
            "role": v.role,
            "connector": v.connector,
            "host": v.host,
            "entrypoint": entrypoint,
            "port": v.port,
            "bootstrap_port": v.bootstrap_port if v.connector == "mooncake" else None,
            "side_channel_port": v.side_channel_port if v.connector == "nixl" else None,
            "control_port": control_port,
            "control_token": token,
            "model": v.served_name,
        },
        name=os.environ.get("PDCHAOS_ENGINE_NAME") or None,
    )
    print(
        f"INFO pdchaos vllm shim: engine {entry['name']} ({v.role}, {v.connector}) on {v.host}:{v.port}; "
        f"`pdchaos fault {entry['name']} ACTION` applies a fault; records {entry['records']}",
        flush=True,
    )
    os.environ["PDCHAOS_CONTROL_TOKEN"] = token
    try:
        return engine_main(fake_argv(v, entry["name"], control_port, entry["records"]))
    finally:
        registry.unregister(entry["name"], os.getpid())
