"""`python -m harness.gateways`: run scenarios against several routers and write the comparison report.

    python -m harness.gateways                                            default suite: reference, newest smg
    python -m harness.gateways --router smg==latest                       newest smg only
    python -m harness.gateways --router smg==1.13.0 --router smg==1.12.0 --router vllm-router
    python -m harness.gateways --compare-only runs/compare-X              re-render compare.* of a matrix

Exit codes as `pdchaos run`: 0 every cell passed, 1 a cell failed, 2 unknown, 3 usage error. Skipped cells
(a router that cannot run them) are neither.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from harness.routers import RouterAdapterError

EXIT_BY_STATUS = {"pass": 0, "fail": 1, "unknown": 2}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.gateways", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help="scenario names or files (none: the default suite)")
    p.add_argument("--router", action="append", metavar="SPEC",
                   help="repeatable: reference, smg, smg==X.Y.Z, smg==latest, vllm-router[==X.Y.Z], "
                   "cmd:<template> (default: reference and smg==latest)")
    p.add_argument("--topology", action="append", metavar="T", help="repeatable or comma separated")
    p.add_argument("--connector", choices=("mooncake", "nixl"))
    p.add_argument("--transport", choices=("http", "grpc"))
    p.add_argument("--out", type=Path, metavar="DIR", help="default: runs/compare-<timestamp-id>")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--compare-only", type=Path, metavar="MATRIX_DIR",
                   help="only re-render compare.json/html/md of a finished (or partial) matrix folder")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from reports.compare import load_comparison, markdown_table, write_comparison

    if args.compare_only is not None:
        try:
            write_comparison(args.compare_only)
        except (OSError, ValueError) as e:
            print(f"pdchaos: error: {e}", file=sys.stderr)
            return 3
        comp = load_comparison(args.compare_only)
        print(markdown_table(comp))
        return EXIT_BY_STATUS.get(comp.status, 2)
    from harness.cli import UsageError, select_suite
    from harness.gateways.matrix import run_matrix
    from harness.gateways.spec import parse_router_spec

    routers = args.router or ["reference", "smg==latest"]
    try:
        for spec in routers:
            parse_router_spec(spec)
        topologies, scenarios = select_suite(args)
    except (UsageError, RouterAdapterError) as e:
        print(f"pdchaos: error: {e}", file=sys.stderr)
        return 3
    out = args.out or Path("runs") / ("compare-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
                                      + "-" + uuid.uuid4().hex[:6])
    if out.exists() and any(out.iterdir()):
        print(f"pdchaos: error: {out} exists and is not empty", file=sys.stderr)
        return 3
    try:
        asyncio.run(run_matrix(
            scenarios, routers, out, topologies,
            [args.connector] if args.connector else None,
            [args.transport] if args.transport else None,
            seed=args.seed, progress=not args.no_progress,
        ))
    except RouterAdapterError as e:
        print(f"pdchaos: error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("pdchaos: interrupted; partial comparison: python -m harness.gateways --compare-only "
              f"{out}", file=sys.stderr)
        return 2
    comp = load_comparison(out)
    print(markdown_table(comp))
    print(f"pdchaos: comparison: {out / 'compare.html'} ({out / 'compare.md'}, {out / 'compare.json'})")
    return EXIT_BY_STATUS.get(comp.status, 2)


if __name__ == "__main__":
    sys.exit(main())
