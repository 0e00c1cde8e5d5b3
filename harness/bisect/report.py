"""What a bisect says: the text printed, `bisect.md`, and `bisect.json` (schema `pdchaos.bisect/1`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.bisect.search import BisectResult, Outcome

SCHEMA = "pdchaos.bisect/1"


def to_json(res: BisectResult, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "written_at": time.time(),
        **meta,
        "found": res.found,
        "pair": [o.to_dict() for o in res.pair] if res.pair else None,
        "reason": res.reason,
        "narrowed": list(res.narrowed) if res.narrowed else None,
        "differing_checkers": differing_checkers(res) if not res.found else [],
        "chain": res.chain,
        "tested": [o.to_dict() for o in res.tested],
    }


def differing_checkers(res: BisectResult) -> list[str]:
    """When the ends give the same verdict: the checkers whose verdicts differ between them (candidates for
    `--checker`), from their runs' not-passed lists; empty when an end was not judged."""
    by_version = {o.version: o for o in res.tested}
    ends = [by_version.get(v) for v in (res.chain[:1] + res.chain[-1:])] if res.chain else []
    if len(ends) != 2 or any(o is None or not o.detail.get("runs") for o in ends):
        return []

    def not_passed(o: Outcome) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for run in o.detail["runs"]:
            for v in run.get("not_passed", []):
                out.setdefault(v["checker"], set()).add(v["status"])
        return out

    a, b = (not_passed(o) for o in ends if o is not None)
    return sorted(c for c in set(a) | set(b) if a.get(c) != b.get(c))


def _evidence_lines(o: Outcome) -> list[str]:
    lines = [f"  {o.version}: {o.status.upper()}" + (f" ({o.reason})" if o.reason else "")]
    for run in o.detail.get("runs", []):
        lines.append(f"    run {run.get('router')}: {str(run.get('status')).upper()}, {run.get('cell_dir')}")
        for v in run.get("not_passed", []):
            lines.append(f"      {v['checker']} {v['status']}: {v['reason']}")
            lines += [f"        - {e}" for e in v.get("evidence", [])]
    return lines


def render_text(res: BisectResult, meta: dict[str, Any]) -> str:
    """The human summary: what was bisected, each release judged, the pair and the evidence of both runs."""
    chain = res.chain
    head = [
        f"bisect {meta['scenario']} {meta['cell']} on {meta['router']}, judged by {meta['judged_by']}",
        f"releases {chain[0]} (good) .. {chain[-1]} (bad): {len(chain)} on the list: {', '.join(chain)}"
        if chain else "no releases",
        "judged:",
    ]
    head += [f"  {o.version:<12} {o.status.upper()}" + (f"  {o.reason}" if o.reason else "")
             for o in res.tested]
    if res.pair is not None:
        g, b = res.pair
        head.append(f"the verdict changes between {g.version} ({g.status}) and {b.version} ({b.status}), "
                    "adjacent on the list")
        head.append("evidence:")
        head += _evidence_lines(g) + _evidence_lines(b)
    else:
        head.append(f"no pair: {res.reason}")
        if res.narrowed:
            head.append(f"the change lies between {res.narrowed[0]} and {res.narrowed[1]}")
        differ = differing_checkers(res)
        if differ:
            head.append(f"checkers whose verdicts differ between the ends: {', '.join(differ)} "
                        "(bisect one with --checker NAME)")
        for o in res.tested:
            if o.status == "unknown":
                head += _evidence_lines(o)
    return "\n".join(head) + "\n"


def write(out: Path, res: BisectResult, meta: dict[str, Any]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    j = out / "bisect.json"
    j.write_text(json.dumps(to_json(res, meta), indent=2) + "\n", encoding="utf-8")
    md = out / "bisect.md"
    md.write_text("```\n" + render_text(res, meta) + "```\n", encoding="utf-8")
    return j, md
