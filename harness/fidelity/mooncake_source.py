"""The real side of the Mooncake fidelity table, answered from vLLM's connector source rather than by
running it: vLLM's MooncakeConnector needs an accelerator, which these machines lack.

Each fact is a committed row of `data/mooncake_vllm.json` (probe, fact, value, source file and lines
read, whether a router could act on it), written from vLLM 0.32's installed source. The rows carry
`source`, so the table marks them "from source".
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.fidelity.observe import SOURCE_ONLY, ProbeResult

FACTS_FILE = Path(__file__).resolve().parent / "data" / "mooncake_vllm.json"


def mooncake_results(names: list[str] | None = None, path: Path = FACTS_FILE) -> list[ProbeResult]:
    """One ProbeResult per probe named in the facts file (all, or those in `names`); facts that no probe
    can measure on a fake come under `source_only`, not compared."""
    rows = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, ProbeResult] = {}
    for row in rows:
        if names is not None and row["probe"] not in names and row["probe"] != SOURCE_ONLY:
            continue
        r = out.setdefault(row["probe"], ProbeResult(row["probe"], row.get("question", "")))
        r.add(row["fact"], row["value"], bool(row.get("router_actionable", True)),
              source=f"from source: vLLM {row.get('version', '0.32.0')} {row['source']}")
    return list(out.values())


def restrict_to_source(fake: list[ProbeResult], source: list[ProbeResult]) -> list[ProbeResult]:
    """The fake's facts that the source answers too, in the fake's order, then the source-only facts (the
    fake side reads "not probed")."""
    known = {(r.probe, f.name) for r in source for f in r.facts}
    out: list[ProbeResult] = []
    for r in fake:
        kept = ProbeResult(r.probe, r.question, skipped=r.skipped)
        kept.facts = [f for f in r.facts if (r.probe, f.name) in known]
        if kept.facts:
            out.append(kept)
    for r in source:
        if r.probe == SOURCE_ONLY:
            info = ProbeResult(SOURCE_ONLY, "facts read from vLLM's source that no probe measures")
            for f in r.facts:
                info.add(f.name, "not probed (read from source)", actionable=False)
            out.append(info)
    return out
