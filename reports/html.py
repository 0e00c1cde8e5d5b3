"""report.html: one self-contained page (inline CSS, plots as base64 PNG), logs linked by relative path."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from harness.findings import cell_label, compute_findings
from harness.result import ScenarioResult, relative, summarize
from harness.text import clip
from harness.verdict import Verdict
from pdchaos import __version__
from reports.cell_part import CELL_PART, cell_part, recovery_table
from reports.findings import CSS as FINDINGS_CSS
from reports.findings import findings_html
from reports.markup import badge, esc, fmt_s

REPORT_HTML = "report.html"
MAX_LINKS = 100
REASON_CHARS = 220

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f0f0f0}
.pass{background:#dff0d8}.fail{background:#f2dede}.unknown{background:#fcf8e3}.race{background:#fde3c8}
.badge{font-weight:bold;padding:1px 6px;border-radius:3px}
section{border-top:2px solid #ddd;margin-top:1.5em;padding-top:.5em}
img{max-width:100%;border:1px solid #ddd}
code,pre{font-size:12px}
pre{background:#f7f7f7;padding:6px;overflow-x:auto}
"""


def anchor(r: ScenarioResult) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", r.key)


def _summary_table(results: list[ScenarioResult]) -> str:
    rows = []
    for r in results:
        reason = _reason_cell(r.overall.reason) if r.status != "pass" else ""
        rows.append(
            f'<tr class="{esc(r.status)}"><td><a href="#{anchor(r)}">{esc(r.scenario)}</a></td>'
            f"<td>{esc(', '.join(r.bugs))}</td><td>{esc(r.cell)}</td><td>{esc(r.router)}</td>"
            f"<td>{badge(r.status)}</td><td>{reason}</td><td>{fmt_s(r.duration_s)}</td></tr>"
        )
    head = (
        "<tr><th>Scenario</th><th>Bugs</th><th>Cell</th><th>Router</th><th>Verdict</th><th>Reason</th>"
        "<th>Wall time</th></tr>"
    )
    return f'<table class="summary">{head}{"".join(rows)}</table>'


def _runs(r: ScenarioResult, run_dir: Path) -> str:
    """A repeated cell's runs: how each went, with its folder (the plots and tables are run 1's)."""
    if not r.runs:
        return ""
    items = []
    for i, run in enumerate(r.runs, 1):
        folder = run.get("cell_dir")
        link = f' <a href="{esc(relative(Path(folder), run_dir))}/">folder</a>' if folder else ""
        why = f": {esc(clip(str(run.get('reason') or ''), REASON_CHARS))}" if run.get("reason") else ""
        items.append(f"<li>run {i}: {badge(str(run.get('status')))}{why}{link}</li>")
    return (f"<h3>Runs ({len(r.runs)})</h3><p>Each checker is judged over every run: race when it failed in "
            f"some and passed in others. The plot and tables below are run 1's.</p><ul>{''.join(items)}</ul>")


def _reason_cell(reason: str) -> str:
    """Whole clauses, then "(+N more)"; the full text one click away."""
    short = clip(reason, REASON_CHARS)
    if short == " ".join(reason.split()):
        return esc(reason)
    return f"<details><summary>{esc(short)}</summary>{esc(reason)}</details>"


def _verdict_table(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "<p>No checker verdicts.</p>"
    rows = []
    for v in verdicts:
        ev = ""
        if v.evidence:
            items = "".join(f"<li><code>{esc(e)}</code></li>" for e in v.evidence[:30])
            ev = f"<details><summary>{len(v.evidence)} evidence item(s)</summary><ul>{items}</ul></details>"
        rows.append(
            f'<tr class="{esc(v.status)}"><td>{esc(v.name)}</td><td>{badge(v.status)}</td>'
            f"<td>{esc(v.reason)}{ev}</td></tr>"
        )
    return f"<table><tr><th>Checker</th><th>Status</th><th>Reason</th></tr>{''.join(rows)}</table>"


def _recovery(r: ScenarioResult, from_history: str) -> str:
    """The recovery table: from the cell's own recovery verdict, else as its history alone gives it."""
    verdict = next((v for v in r.verdicts if v.name == "recovery"), None)
    return from_history if verdict is None else recovery_table(verdict)


def _links(r: ScenarioResult, run_dir: Path) -> str:
    files: list[Path] = []
    if r.history_path is not None:
        files.append(r.history_path)
    files += r.logs()
    folder = r.folder()
    # Everything else the cell left behind (engine records, router events), unless the cell has no folder
    # of its own (then its folder is the run folder, full of other cells' files).
    if folder is not None and folder.is_dir() and os.path.abspath(folder) != os.path.abspath(run_dir):
        # Not the part this page is built from (a cache, `reports.cell_part`).
        files += sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CELL_PART)[:MAX_LINKS]
    seen: set[str] = set()
    items = []
    for p in files:
        rel = relative(p, run_dir)
        if rel in seen:
            continue
        seen.add(rel)
        missing = "" if p.exists() else " (missing)"
        items.append(f'<li><a href="{esc(rel)}">{esc(rel)}</a>{missing}</li>')
    return f"<ul>{''.join(items)}</ul>" if items else "<p>No files.</p>"


def _section(r: ScenarioResult, run_dir: Path, plots: bool) -> str:
    part = cell_part(r, plots)
    when = ""
    # A simulated history's start is its virtual epoch: only the run's own record says when it ran.
    start = r.started_at if r.started_at is not None or r.world == "sim" else part.wall_start
    if start is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
    parts = [
        f'<section id="{anchor(r)}"><h2>{esc(r.scenario)} &mdash; {esc(r.cell)} {badge(r.status)}</h2>',
        f"<p>{esc(r.description)}</p>" if r.description else "",
        f"<p>Router <b>{esc(r.router)}</b>; bugs {esc(', '.join(r.bugs) or '-')}; seed {esc(r.seed)}; "
        f"wall time {fmt_s(r.duration_s)}; started {esc(when or '-')}; "
        f"run ended: {esc(r.run_reason or '-')}</p>",
        f"<p>World <b>{esc(r.world)}</b> (times in {esc(r.time_unit)}), settings <b>{esc(r.settings)}</b>. "
        f"Replay: <code>{esc(r.replay or '-')}</code></p>",
        f"<p><b>{esc(part.problem)}</b></p>" if part.problem else "",
        f"<p>Verdict: {esc(r.overall.reason)}</p>" if r.status != "pass" else "",
        _runs(r, run_dir),
        _verdict_table(r.verdicts),
        part.plot,
        "<h3>Recovery latency</h3>",
        _recovery(r, part.recovery),
        "<h3>Handoff outcomes</h3>",
        part.handoffs,
        "<h3>Client latency</h3>",
        part.latency,
        "<h3>Files</h3>",
        _links(r, run_dir),
    ]
    if r.notes:
        parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{esc(n)}</li>" for n in r.notes) + "</ul>")
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def render_html(results: list[ScenarioResult], run_dir: Path, plots: bool = True) -> str:
    s = summarize(results)
    title = f"pdchaos report: {run_dir.name}"
    races = f", {s['race']} race" if s.get("race") else ""
    counts = f"{s['total']} run(s): {s['pass']} pass, {s['fail']} fail, {s['unknown']} unknown{races}"
    body = [
        f"<h1>{esc(title)}</h1>",
        f"<p>Overall {badge(s['status'])} &mdash; {esc(counts)}. Unknown means the harness could not tell: "
        f"it is not a pass. pdchaos {esc(__version__)}.</p>",
        findings_html(compute_findings(results), {cell_label(r): anchor(r) for r in results}),
        "<h2>Cells</h2>",
        _summary_table(results),
        *(_section(r, run_dir, plots) for r in results),
    ]
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{CSS}{FINDINGS_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_html(
    results: list[ScenarioResult], run_dir: Path, plots: bool = True, name: str = REPORT_HTML
) -> Path:
    """`plots=False` leaves the timeline plots out (fast re-render of a big run)."""
    path = run_dir / name
    tmp = path.with_suffix(f".html.{os.getpid()}.tmp")
    tmp.write_text(render_html(results, run_dir, plots), encoding="utf-8")
    os.replace(tmp, path)
    return path
