"""The sweep report: `sweep.html` (self-contained) and, with a baseline, `comparison.json`
(schema `pdchaos.sweep-compare/1`).

The HTML puts the differences from the baseline first (regressions, then new and gone cells,
improvements, other changes), each with its numbers, the threshold it was held to, and the evidence of
the checkers that did not pass; then every cell, then the cells left out and why, then each group's own
run report.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness.sweep.cells import CellRecord
from harness.sweep.compare import CellChange, MetricChange, SweepComparison
from harness.sweep.keys import CellKey

SWEEP_HTML = "sweep.html"
COMPARISON_JSON = "comparison.json"
_FINDING_COLOR = {"new": "#c62828", "gone": "#2e7d32", "unchanged": "#777"}
_KIND_COLOR = {"regression": "#c62828", "new": "#1565c0", "gone": "#6d4c41", "improvement": "#2e7d32",
               "changed": "#ef6c00", "same": "#757575"}
_STATUS_COLOR = {"pass": "#2e7d32", "fail": "#c62828", "unknown": "#ef6c00"}
_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;
vertical-align:top;font-size:.9em}th{background:#f3f3f3}.badge{color:#fff;border-radius:3px;padding:0 .4em;
font-size:.85em}.card{border-left:4px solid #999;padding:.3em .8em;margin:.8em 0;background:#fafafa}
code,pre{font-size:.85em}pre{white-space:pre-wrap;margin:.2em 0}.num{text-align:right;font-family:monospace}
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def badge(text: str, color: str) -> str:
    return f'<span class="badge" style="background:{color}">{esc(text)}</span>'


def status_badge(status: str) -> str:
    return badge(status, _STATUS_COLOR.get(status, "#777"))


def _fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.4f} {unit}"


def _link(path: str | None, base: Path) -> str:
    if not path:
        return "-"
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        rel = path
    return f'<a href="{esc(rel)}">{esc(rel)}</a>'


def write_sweep_report(out: Path, sweep: Mapping[str, Any], current: Mapping[CellKey, CellRecord],
                       comparison: SweepComparison | None = None) -> dict[str, Path]:
    written: dict[str, Path] = {}
    if comparison is not None:
        path = out / COMPARISON_JSON
        path.write_text(json.dumps(comparison.to_dict(), indent=2) + "\n", encoding="utf-8")
        written["comparison"] = path
    page = out / SWEEP_HTML
    page.write_text(render_html(out, sweep, current, comparison), encoding="utf-8")
    written["html"] = page
    return written


def render_html(out: Path, sweep: Mapping[str, Any], current: Mapping[CellKey, CellRecord],
                comparison: SweepComparison | None) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>sweep {esc(sweep.get('name'))}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>Sweep {esc(sweep.get('name'))}</h1>",
             f"<p>{esc(sweep.get('description') or '')}</p>",
             f"<p>File <code>{esc(sweep.get('file'))}</code>; {len(current)} cells run, "
             f"{len(sweep.get('skipped') or [])} left out; {esc(sweep.get('jobs'))} at once; written "
             f"{esc(time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime()))} UTC.</p>"]
    if comparison is not None:
        parts.append(_findings_delta(comparison))
        parts.append(_differences(out, comparison))
    parts.append(_cells_table(out, current, comparison))
    parts.append(_skipped(sweep))
    groups = sweep.get("groups") or []
    if groups:
        parts.append("<h2>Run reports by group</h2><ul>"
                     + "".join(f'<li><a href="{esc(g)}/report.html">{esc(g)}</a></li>' for g in groups)
                     + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _findings_delta(comp: SweepComparison) -> str:
    """The findings of both runs lined up: what this run brought, what it fixed, what stayed."""
    if not comp.findings:
        return "<h2>Findings against the baseline</h2><p>No finding in either run.</p>"
    rows = "".join(
        f"<tr><td>{badge(c.kind, _FINDING_COLOR[c.kind])}</td><td>{esc(c.finding.title)}<br>"
        f"<code>{esc(c.finding.signature)}</code></td><td>{c.baseline_cells}</td><td>{c.current_cells}</td>"
        f"<td><code>{esc(c.finding.replay or '-')}</code></td></tr>" for c in comp.findings)
    return ("<h2>Findings against the baseline</h2><table><tr><th>change</th><th>finding</th>"
            f"<th>baseline cells</th><th>cells now</th><th>replay</th></tr>{rows}</table>")


def _differences(out: Path, comp: SweepComparison) -> str:
    counts = comp.counts()
    head = " ".join(badge(f"{k} {n}", _KIND_COLOR[k]) for k, n in counts.items())
    rows = comp.differences()
    body = "".join(_row_card(out, r) for r in rows) or "<p>No difference from the baseline.</p>"
    return (f"<h2>Differences from the baseline</h2><p>Baseline <code>{esc(comp.baseline_dir)}</code>. "
            f"{head}</p>{body}{_thresholds(comp)}")


def _row_card(out: Path, r: CellChange) -> str:
    color = _KIND_COLOR[r.kind]
    parts = [f'<div class="card" style="border-color:{color}">',
             f"<h3>{badge(r.kind, color)} {esc(r.key.label)}</h3>"]
    if r.verdict_change:
        parts.append(f"<p>Verdict: <b>{esc(r.verdict_change)}</b></p>")
    if r.why:
        parts.append("<ul>" + "".join(f"<li>{esc(w)}</li>" for w in r.why) + "</ul>")
    if r.check_changes:
        parts.append("<p>Checkers: " + ", ".join(f"<code>{esc(c)}</code>" for c in r.check_changes) + "</p>")
    if r.metrics:
        parts.append(_metrics_table(r.metrics, r.current or r.baseline))
    rec = r.current if r.current is not None and r.current.failing else None
    if rec is not None:
        parts.append("<p>Evidence (this run's checkers that did not pass):</p><ul>")
        for v in rec.failing:
            ev = "".join(f"<pre>{esc(e)}</pre>" for e in v.get("evidence") or [])
            st = str(v.get("status"))
            name, why = esc(v.get("name")), esc(v.get("reason"))
            parts.append(f"<li>{status_badge(st)} <b>{name}</b>: {why}{ev}</li>")
        parts.append("</ul>")
    for label, c in (("this run", r.current), ("baseline", r.baseline)):
        if c is not None:
            replay = f"; replay: <code>{esc(c.replay)}</code>" if c.replay else ""
            parts.append(f"<p>{label}: {status_badge(c.status)} "
                         f"{_link(c.cell_dir, out)}{replay}</p>")
    parts.append("</div>")
    return "".join(parts)


def _metrics_table(metrics: list[MetricChange], rec: CellRecord | None) -> str:
    unit = "simulated s" if rec is not None and rec.time_unit.startswith("simulated") else "s"
    head = ("<table><tr><th>number</th><th>baseline</th><th>this run</th><th>change</th><th>threshold</th>"
            "<th>confidence interval of the change</th><th>samples</th><th>beyond noise</th>"
            "<th>rule</th></tr>")
    rows = []
    for m in metrics:
        ci = "-" if m.ci is None else f"[{m.ci[0]:+.4f}, {m.ci[1]:+.4f}]"
        samples = "-" if m.samples is None else f"{m.samples[0]} / {m.samples[1]}"
        flag = ("worse" if m.worse else "better") if m.significant else "no"
        rows.append(f"<tr><td>{esc(m.name)}</td><td class=num>{_fmt(m.baseline, unit)}</td>"
                    f"<td class=num>{_fmt(m.current, unit)}</td><td class=num>{m.delta:+.4f}</td>"
                    f"<td class=num>{m.threshold:.4f}</td><td class=num>{ci}</td><td>{samples}</td>"
                    f"<td>{flag}</td><td>{esc(m.rule)}</td></tr>")
    return head + "".join(rows) + "</table>"


def _thresholds(comp: SweepComparison) -> str:
    th = comp.thresholds
    items = [("recovery", f"max({th.recovery_abs_s:g} s, {th.recovery_rel:.0%} of the baseline, "
                          f"{th.recovery_probe_intervals:g} probe intervals)"),
             ("time to first token (p50, p95)",
              f"max({th.ttft_abs_s:g} s, {th.ttft_rel:.0%} of the baseline) and the {th.confidence:.0%} "
              f"bootstrap interval ({th.resamples} resamples) excludes 0")]
    return ("<h3>Noise thresholds</h3><table><tr><th>number</th><th>a change counts when</th></tr>"
            + "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td></tr>" for a, b in items) + "</table>")


def _cells_table(out: Path, current: Mapping[CellKey, CellRecord], comp: SweepComparison | None) -> str:
    kinds = {r.key: r for r in comp.rows} if comp is not None else {}
    head = ("<h2>Cells</h2><table><tr><th>cell</th><th>status</th>"
            + ("<th>baseline</th><th>vs baseline</th>" if comp is not None else "")
            + "<th>recovery</th><th>TTFT p50</th><th>TTFT p95</th><th>folder</th></tr>")
    rows = []
    for key in sorted(current):
        rec = current[key]
        p50 = p95 = None
        if rec.ttft_s:
            p50, p95 = (float(x) for x in np.quantile(np.asarray(rec.ttft_s), [0.5, 0.95]))
        extra = ""
        if comp is not None:
            row = kinds.get(key)
            base = row.baseline.status if row is not None and row.baseline is not None else "-"
            kind = row.kind if row is not None else "-"
            extra = f"<td>{esc(base)}</td><td>{badge(kind, _KIND_COLOR.get(kind, '#777'))}</td>"
        rows.append(f"<tr><td>{esc(key.label)}</td><td>{status_badge(rec.status)}</td>{extra}"
                    f"<td class=num>{_fmt(rec.recovery_s)}</td><td class=num>{_fmt(p50)}</td>"
                    f"<td class=num>{_fmt(p95)}</td><td>{_link(rec.cell_dir, out)}</td></tr>")
    return head + "".join(rows) + "</table>"


def _skipped(sweep: Mapping[str, Any]) -> str:
    items = sweep.get("skipped") or []
    if not items:
        return ""
    rows = "".join(
        f"<tr><td>{esc(s['scenario'])} {esc(s['topology'])}-{esc(s['connector'])}-{esc(s['transport'])} "
        f"[{esc(s['router'])}, {esc(s['world'])}, {esc(s['settings'])}, {esc(s['engines'])}]</td>"
        f"<td>{esc(s['reason'])}</td></tr>" for s in items)
    return f"<h2>Left out</h2><table><tr><th>cell</th><th>why</th></tr>{rows}</table>"
