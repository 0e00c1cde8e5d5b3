"""`pdchaos fidelity`: ask a fake and a real engine pair the same questions, print them side by side.

    pdchaos fidelity                          fake vs real vLLM, NIXL, every probe
    pdchaos fidelity --connector mooncake     fake (run) vs vLLM's Mooncake connector (from its source)
    pdchaos fidelity --transport grpc         fake vs vLLM's gRPC server (smg's VllmEngine service), NIXL
    pdchaos fidelity --probes handoff,errors  some probes only
    pdchaos fidelity --real command:FILE      real engines started by command templates

Exit codes: 0 no router-actionable difference left unexplained, 1 at least one, 2 the engines could not
be started (the reason is printed), 3 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from harness.fidelity.grpc_probes import GRPC_PROBES, run_grpc_probes
from harness.fidelity.mooncake_source import mooncake_results, restrict_to_source
from harness.fidelity.observe import ProbeResult
from harness.fidelity.probes import PROBES, run_probes
from harness.fidelity.table import compare, render_markdown, render_text, unexplained
from harness.suite import out_folder_problem
from harness.topology import CONNECTORS, TRANSPORTS
from harness.usage_parser import UsageParser
from harness.worlds.real.backends import EngineChoiceError, parse_engines
from harness.worlds.real.processes import ProcessStartError

EXIT_OK, EXIT_DIFFERS, EXIT_NO_ENGINES, EXIT_USAGE = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="pdchaos fidelity", description=__doc__.split("\n\n")[0],
        epilog="Probes (HTTP): " + "; ".join(f"{x.name}: {x.question}" for x in PROBES)
        + "\n\nProbes (gRPC): " + "; ".join(f"{x.name}: {x.question}" for x in GRPC_PROBES)
        + "\n\n" + __doc__.split("\n\n")[-1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connector", choices=CONNECTORS, default="nixl",
                   help="KV connector of both pairs (mooncake: the real side is read from vLLM's source, "
                   "since its connector needs an accelerator)")
    p.add_argument("--transport", choices=TRANSPORTS, default="http",
                   help="what the probes speak: the OpenAI HTTP API (default) or the VllmEngine gRPC service "
                   "(vLLM's gRPC server; NIXL only)")
    p.add_argument("--real", default="vllm", metavar="BACKEND",
                   help="the real engine backend: vllm (default; `pdchaos engines install vllm` first) or "
                   "command:FILE")
    p.add_argument("--probes", default=None, metavar="LIST",
                   help="comma-separated probe names (default: all)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for fidelity.json, fidelity.md and the engines' logs (default: "
                   "runs/fidelity-<time>)")
    return p


async def _probe_backend(spec: str, connector: str, transport: str, out: Path,
                         names: list[str] | None) -> list[ProbeResult]:
    from harness.fidelity.pair import EnginePair

    choice = parse_engines(spec)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    say(f"pdchaos fidelity: starting a {connector} pair of {choice.label} engines ({transport})")
    async with EnginePair(choice, out, connector=connector, transport=transport) as pair:
        if transport == "grpc":
            return await run_grpc_probes(pair, names, say)
        return await run_probes(pair, names, say)


def _usage(message: str) -> int:
    print(f"pdchaos fidelity: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n.strip() for n in args.probes.split(",")] if args.probes is not None else None
    if names is not None and not all(names):
        return _usage(f"--probes {args.probes!r}: an empty probe name (leave --probes out to run every "
                      "probe)")
    if args.transport == "grpc" and args.connector != "nixl":
        return _usage("--transport grpc compares NIXL pairs only (vLLM's Mooncake connector needs an "
                      "accelerator; its side is read from source, over HTTP)")
    known = {p.name for p in (GRPC_PROBES if args.transport == "grpc" else PROBES)}
    if names and (bad := [n for n in names if n not in known]):
        return _usage(f"unknown probe(s) {bad}; known: {sorted(known)}")
    try:
        real = parse_engines(args.real)
    except EngineChoiceError as e:
        return _usage(f"--real: {e}")
    if real.kind == "vllm" and args.connector != "mooncake":  # the Mooncake side is read from source
        from harness.vllm import VllmNotInstalled, find_install

        try:
            find_install()
        except VllmNotInstalled as e:  # said now, not after the fakes were probed
            return _usage(f"--real vllm: {e}")
    if real.kind not in ("vllm", "command"):
        # The probes drive a local engine pair; fakes against fakes compare nothing, and a Kubernetes
        # backend's engines are not beside the harness.
        return _usage(f"--real must name a real backend (vllm or command:FILE), not {args.real}")
    out = args.out or Path("runs") / time.strftime("fidelity-%Y%m%d-%H%M%S")
    problem = out_folder_problem(out, "fidelity folder")
    if problem:
        return _usage(problem)
    out.mkdir(parents=True, exist_ok=True)
    real_label = "vLLM (from source)" if args.connector == "mooncake" else args.real
    try:
        fake = asyncio.run(_probe_backend("fake", args.connector, args.transport, out / "fake", names))
        if args.connector == "mooncake":
            real = mooncake_results(names)
            fake = restrict_to_source(fake, real)
        else:
            real = asyncio.run(_probe_backend(args.real, args.connector, args.transport, out / "real", names))
    except (ProcessStartError, OSError, RuntimeError) as e:
        print(f"pdchaos fidelity: engines did not start: {e}", file=sys.stderr)
        return EXIT_NO_ENGINES
    except KeyboardInterrupt:  # the engines were stopped as the probes unwound
        print("pdchaos fidelity: interrupted: no table (it needs both sides probed)", file=sys.stderr)
        return EXIT_NO_ENGINES
    rows = compare(fake, real)
    left = unexplained(rows)
    (out / "fidelity.json").write_text(json.dumps(
        {"connector": args.connector, "transport": args.transport, "real": real_label,
         "rows": [r.to_json() for r in rows], "unexplained": len(left)}, indent=1), encoding="utf-8")
    (out / "fidelity.md").write_text(render_markdown(rows, real_label) + "\n", encoding="utf-8")
    print(render_text(rows, real_label))
    compared = [r for r in rows if r.compared]
    same = sum(r.agree for r in compared)
    only = f", {len(rows) - len(compared)} from source only" if len(compared) < len(rows) else ""
    facts = "fact" if len(compared) == 1 else "facts"
    print(f"\npdchaos fidelity: {len(compared)} {facts} compared, {same} the same, {len(compared) - same} "
          f"different{only}, {len(left)} router-actionable and unexplained -> {out / 'fidelity.md'}")
    return EXIT_DIFFERS if left else EXIT_OK
