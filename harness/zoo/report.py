"""The zoo's files: zoo.json (the whole matrix) and zoo.md (what a reader looks at: per switch, where it was
caught and the evidence; then the switch x scenario grid; then holes and false alarms)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from harness.findings import signatures_from_zoo
from harness.zoo.matrix import ZooMatrix
from harness.zoo.plan import parse_cell_key

_EVIDENCE_CHARS = 160


def _scenario_of(cell_key: str) -> str:
    return parse_cell_key(cell_key)[0]


def _short(text: str, n: int = _EVIDENCE_CHARS) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 3] + "..."


def markdown(m: ZooMatrix) -> str:
    time_unit = "simulated" if m.world == "sim" else "real-time"
    verdict = "every switch caught on every transport it can occur on, no false alarm"
    if m.unjudged:
        verdict = (f"UNKNOWN: interrupted, {m.unjudged} planned run(s) not judged (pdchaos zoo --resume runs "
                   "them)")
    elif not m.ok:
        verdict = "HOLES OR FALSE ALARMS (below)"
    lines = [
        f"# Bug zoo detection matrix ({m.world} world, {m.settings} settings, {time_unit} seconds)",
        "",
        f"{len(m.switches)} switches x {len(m.cells)} cells; baseline (no switch) run {m.baseline_runs} "
        f"time(s) per cell. Verdict: {verdict}.",
        "",
        "| switch | side | zoo | occurs on | caught by | checkers | findings | evidence |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, sw in sorted(m.switches.items()):
        caught = m.caught_by(name)
        outcomes = m.outcomes.get(name, {})
        checkers = sorted({c for k in caught for c in outcomes[k].checkers})
        seen = [outcomes[k].evidence for k in caught if outcomes[k].evidence]
        sided = [x for x in seen if "router side" in x or "engine side" in x]
        first = (sided or seen or [""])[0]
        where = f"{'/'.join(sw.transports)}; {'/'.join(sw.connectors)}"
        by = ", ".join(sorted({_scenario_of(k) for k in caught})) or "**nothing**"
        missing = m.missing_transports(name)
        if missing:
            by += f" (**not on {'/'.join(missing)}**)"
        lines.append(f"| {name} | {sw.side} | {sw.zoo} | {where} | {by} | {', '.join(checkers)} | "
                     f"{len(m.findings.get(name, []))} | {_short(first)} |")
    scenarios = list(dict.fromkeys(_scenario_of(k) for k in m.cells))
    lines += ["", "## Switch x scenario (cells caught / cells run)", "",
              "| switch | " + " | ".join(scenarios) + " |", "|---|" + "---|" * len(scenarios)]
    for name in sorted(m.switches):
        per: dict[str, list[bool]] = defaultdict(list)
        for k, o in m.outcomes.get(name, {}).items():
            per[_scenario_of(k)].append(o.caught)
        row = [f"{sum(per[s])}/{len(per[s])}" if per.get(s) else "-" for s in scenarios]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    one = sum(1 for name in m.switches if len(m.findings.get(name, [])) == 1)
    lines += ["", "## Findings per switch", "",
              f"{one} of {len(m.switches)} switches give one finding on their catching cells (the report's "
              "findings: one problem, named once). The others:", ""]
    for name in sorted(m.switches):
        found = m.findings.get(name, [])
        if len(found) != 1:
            sigs = "; ".join(f"{f.signature} ({len(f.cells)} cells)" for f in found) or "none"
            lines.append(f"- {name}: {len(found)}: {_short(sigs, 400)}")
    lines += ["", "## False alarms (a checker failing with no switch on)", ""]
    if m.false_alarms:
        lines += [f"- {k}: {'; '.join(_short(x) for x in v)}" for k, v in m.false_alarms.items()]
    else:
        lines.append(f"None in {m.baseline_runs} baseline run(s) of each of the {len(m.cells)} cells.")
    return "\n".join(lines) + "\n"


SIGNATURES_JSON = "signatures.json"


def write_zoo(out: Path, m: ZooMatrix) -> tuple[Path, Path]:
    """zoo.json, zoo.md, and signatures.json (the catalogue `harness/findings/known_signatures.json` is a
    copy of, from a full zoo run)."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "zoo.json", out / "zoo.md"
    doc = m.as_dict()
    js.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    catalogue = json.dumps(signatures_from_zoo(doc), indent=2) + "\n"
    (out / SIGNATURES_JSON).write_text(catalogue, encoding="utf-8")
    md.write_text(markdown(m), encoding="utf-8")
    return js, md
