"""Findings as a reader meets them: first on report.html, last in the terminal (`harness.findings`)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from harness.findings import Finding
from harness.text import clip

CELLS_SHOWN = 4
CSS = """
.findings .finding{border-left:4px solid #c9302c;padding:2px 10px;margin:.6em 0}
.findings .finding h3{margin:.2em 0;font-size:15px}
.findings p{margin:.25em 0}
"""


def _e(x: object) -> str:
    return html.escape("" if x is None else str(x))


def _cells(cells: Sequence[str], anchors: Mapping[str, str]) -> str:
    return ", ".join(f'<a href="#{_e(anchors[c])}">{_e(c)}</a>' if c in anchors else _e(c) for c in cells)


def _race(f: Finding) -> str:
    return "<b>[race]</b> " if f.status == "race" else ""


def seen_with(f: Finding) -> str:
    """The other checkers that failed in its cells: names, and the handoff problem where there is one."""
    names = [c if c.startswith("handoff:") else c.split(":", 1)[0] for c in f.consequences]
    return ", ".join(dict.fromkeys(names))


def findings_html(findings: Sequence[Finding], anchors: Mapping[str, str]) -> str:
    """The findings section; `anchors` maps a cell label to its section's id."""
    if not findings:
        return ('<section class="findings"><h2>Findings</h2><p>None: no cell failed. Unknown cells are '
                "listed below; they are not findings (the evidence is missing).</p></section>")
    parts = [f'<section class="findings"><h2>Findings ({len(findings)})</h2>',
             "<p>Each distinct problem once, with the cells that show it. A cell can show several.</p>"]
    for i, f in enumerate(findings, 1):
        also = f"<p>Failed with it: {_e(seen_with(f))}</p>" if f.consequences else ""
        clean = (f"<details><summary>Not shown by {len(f.clean_cells)} other cell(s) of the same "
                 f"scenarios</summary>{_cells(f.clean_cells, anchors)}</details>" if f.clean_cells else "")
        switches = (f"<p>Matches the symptom of bug switch(es): {_e(', '.join(f.switches))}</p>"
                    if f.switches else "")
        evidence = "".join(f"<li><code>{_e(line)}</code></li>" for line in f.evidence)
        parts.append(
            f'<div class="finding" id="finding-{_e(f.id)}"><h3>{i}. {_race(f)}{_e(f.title)}</h3>'
            f"<p>Shown by {len(f.cells)} cell(s): {_cells(f.cells, anchors)}</p>{clean}"
            f"<p>Checker: <code>{_e(f.signature)}</code></p>{also}{switches}"
            f"<ul>{evidence}</ul>"
            f"<p>Replay its smallest cell: <code>{_e(f.replay or '-')}</code></p></div>"
        )
    parts.append("</section>")
    return "".join(parts)


def findings_lines(findings: Sequence[Finding]) -> list[str]:
    """The terminal's last lines: one block per finding."""
    if not findings:
        return []
    lines = [f"pdchaos: {len(findings)} finding(s), each a distinct problem (report.html lists them first):"]
    for i, f in enumerate(findings, 1):
        shown = ", ".join(f.cells[:CELLS_SHOWN]) + (f" (+{len(f.cells) - CELLS_SHOWN} more)"
                                                     if len(f.cells) > CELLS_SHOWN else "")
        race = "[race: split over the repeated runs] " if f.status == "race" else ""
        lines.append(f"  {i}. {race}{f.title}")
        lines.append(f"     {len(f.cells)} cell(s): {shown}")
        if f.consequences:
            lines.append(f"     failed with it: {seen_with(f)}")
        lines.append(f"     {clip(f.evidence[0], 150)}" if f.evidence else f"     {f.signature}")
        if f.switches:
            lines.append(f"     matches bug switch(es): {', '.join(f.switches)}")
        if f.replay:
            lines.append(f"     replay: {f.replay}")
    return lines
