"""The comparison report: scenario cells x routers (and releases), verdicts and key numbers side by side.

Input: a matrix folder (`harness.matrix`): `matrix.json` plus one run folder per router, each with
its `report.json` and the cells' `history.jsonl`. Without a matrix.json every sub-folder holding a report.json
counts as one router. Output: `compare.json` (schema `pdchaos.compare/1`), `compare.html` (self-contained)
and `compare.md` (a markdown table for READMEs and notes).

For each row whose routers disagree (status, or the verdict of any checker), the evidence is kept per router:
the verdicts that did not pass with their own evidence, the handoff records that were not clean pulls, the
router's worker status changes and events, and the error status counts.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.findings import (
    Finding,
    FindingChange,
    compute_findings,
    delta_lines,
    findings_delta,
    findings_of,
)
from harness.result import ScenarioResult
from harness.run_folder import collect_results
from harness.text import strip_ansi
from harness.value_checks import number_or_none
from pdchaos.jsonl import read_jsonl
from reports.markup import esc, fmt_s

COMPARE_JSON = "compare.json"
COMPARE_HTML = "compare.html"
COMPARE_MD = "compare.md"
SCHEMA = "pdchaos.compare/1"
MATRIX_JSON = "matrix.json"
EVIDENCE_ITEMS = 8
STATUSES = ("pass", "fail", "unknown", "race")
ROUTER_LOG = "logs/router.log"
# Router log lines worth showing next to a difference: status changes, engine ids, failed probes and legs.
_LOG_LINE = re.compile(
    r"status transition|engine id|engine_id|probe failed|no available workers|kv load|transfer|"
    r"not ?ready|failed|error|timed? ?out",
    re.IGNORECASE,
)
_KEY_LINE = re.compile(r"status transition|engine id|probe failed|worker_url", re.IGNORECASE)
_IDS = re.compile(r"(cmpl|chatcmpl|req|xfer)-[A-Za-z0-9_-]+|\b\d{2}:\d{2}:\d{2}(\.\d+)?\b|"
                  r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class Outcome:
    """One router's outcome for one scenario cell. `status`: pass | fail | unknown | skipped | missing."""

    status: str
    reason: str = ""
    checks: dict[str, str] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    cell_dir: str | None = None


@dataclass
class CellOutcomes:
    scenario: str
    cell: str
    outcomes: dict[str, Outcome]
    differs: bool = False

    @property
    def key(self) -> str:
        return f"{self.scenario} {self.cell}"


@dataclass
class RouterInfo:
    label: str
    spec: str = ""
    version: str | None = None
    dir: str = ""
    executable: str | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)
    adjustments: list[str] = field(default_factory=list)


@dataclass
class RouterComparison:
    routers: list[RouterInfo]
    rows: list[CellOutcomes]
    generated_at: float = field(default_factory=time.time)
    # Per router, its findings against the router before it (the first: against none, all new).
    findings: dict[str, list[FindingChange]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for r in self.routers:
            c = Counter(row.outcomes[r.label].status for row in self.rows if r.label in row.outcomes)
            out[r.label] = {k: c.get(k, 0) for k in (*STATUSES, "skipped", "missing")}
        return out

    @property
    def status(self) -> str:
        """fail > unknown > race > pass over every cell that ran (skipped and missing cells do not count)."""
        seen = {o.status for row in self.rows for o in row.outcomes.values()}
        if "fail" in seen:
            return "fail"
        if "unknown" in seen or not seen & {"pass", "race"}:
            return "unknown"
        return "race" if "race" in seen else "pass"


# ---------------------------------------------------------------- reading one cell


def recovery_numbers(verdicts: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Slowest heal-to-Ready and heal-to-first-handoff over the faults the recovery checker judged."""
    ready: list[float] = []
    handoff: list[float] = []
    for v in verdicts:
        if v.get("name") != "recovery":
            continue
        faults = (v.get("numbers") or {}).get("faults") or {}
        for f in faults.values() if isinstance(faults, dict) else ():
            if not isinstance(f, dict):
                continue
            r, h = number_or_none(f.get("heal_to_ready_s")), number_or_none(f.get("heal_to_handoff_s"))
            if r is not None:
                ready.append(r)
            if h is not None:
                handoff.append(h)
    return {"recovery_s": max(ready) if ready else None,
            "heal_to_handoff_s": max(handoff) if handoff else None}


def history_numbers(records: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(numbers, evidence) from one history: request and error counts, handoff outcomes, router statuses."""
    requests = errors = timeouts = 0
    error_status: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    odd_handoffs: list[dict[str, Any]] = []
    statuses: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    for r in records:
        t = r.get("type")
        if t == "request_completed":
            requests += 1
            if not r.get("ok"):
                errors += 1
                error_status[str(r.get("status"))] += 1
            if r.get("timed_out"):
                timeouts += 1
        elif t == "handoff":
            kind = str(r.get("kind"))
            if kind == "prefill":
                continue
            label = "local" if kind == "local" else str(r.get("outcome"))
            outcomes[label] += 1
            if label != "pulled" or r.get("kv_digest") != r.get("prompt_digest"):
                odd_handoffs.append({k: r.get(k) for k in (
                    "t", "engine", "kind", "outcome", "remote_engine_id", "kv_digest", "prompt_digest",
                    "error", "duration_s") if r.get(k) is not None})
        elif t == "router_status":
            statuses.append({k: r.get(k) for k in ("t", "engine", "worker", "status", "kv_engine_id")})
        elif t == "router_event" and r.get("event") in ("status_change", "engine_id", "mint_skipped"):
            events.append({k: v for k, v in r.items() if k not in ("type", "ts")})
        elif t == "fault_applied":
            faults.append({k: r.get(k) for k in ("t", "fault", "kind", "target")})
    numbers = {
        "requests": requests,
        "errors": errors,
        "timeouts": timeouts,
        "error_status": dict(sorted(error_status.items())),
        "handoffs": dict(sorted(outcomes.items())),
    }
    evidence = {
        "faults": faults,
        "odd_handoffs": odd_handoffs[:EVIDENCE_ITEMS],
        "odd_handoffs_total": len(odd_handoffs),
        "router_statuses": statuses[: EVIDENCE_ITEMS * 2],
        "router_events": events[: EVIDENCE_ITEMS * 2],
    }
    return numbers, evidence


def router_log_lines(path: Path, limit: int = EVIDENCE_ITEMS * 2) -> tuple[list[str], int]:
    """(notable non-debug lines of a router log: worker status and engine id lines first, then other
    failures once each whatever their request id; how many notable lines there were in all)."""
    key: list[str] = []
    other: dict[str, str] = {}
    total = 0
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for raw in f:
                line = strip_ansi(raw).strip()
                if not line or " DEBUG " in line or " TRACE " in line or not _LOG_LINE.search(line):
                    continue
                total += 1
                if _KEY_LINE.search(line):
                    if len(key) < limit:
                        key.append(line[:300])
                    continue
                shape = _IDS.sub("<id>", line.split(" ", 2)[-1])
                if shape not in other and len(other) < limit:
                    other[shape] = line[:300]
    except OSError:
        return [], 0
    return key + list(other.values())[: max(0, limit - len(key))], total


def outcome_from_result(res: Mapping[str, Any], run_dir: Path) -> Outcome:
    verdicts = [v for v in res.get("verdicts") or [] if isinstance(v, dict)]
    checks = {str(v.get("name")): str(v.get("status")) for v in verdicts}
    numbers: dict[str, Any] = {**recovery_numbers(verdicts), "duration_s": res.get("duration_s")}
    evidence: dict[str, Any] = {
        "verdicts": [
            {"name": v.get("name"), "status": v.get("status"), "reason": v.get("reason"),
             "evidence": list(v.get("evidence") or [])[:EVIDENCE_ITEMS]}
            for v in verdicts if v.get("status") != "pass"
        ]
    }
    hist = res.get("history")
    if isinstance(hist, str) and hist:
        path = run_dir / hist
        if path.is_file():
            try:
                n, ev = history_numbers(read_jsonl(path))
            except (OSError, ValueError) as e:
                n, ev = {}, {"history_error": str(e)}
            numbers.update(n)
            evidence.update(ev)
    cell_dir = res.get("cell_dir")
    if isinstance(cell_dir, str) and cell_dir:
        lines, total = router_log_lines(run_dir / cell_dir / ROUTER_LOG)
        if total:
            evidence["router_log"] = lines
            evidence["router_log_total"] = total
    return Outcome(
        status=str(res.get("status") or "unknown"),
        reason=str(res.get("reason") or ""),
        checks=checks,
        numbers=numbers,
        evidence=evidence,
        cell_dir=str(run_dir / cell_dir) if isinstance(cell_dir, str) else None,
    )


def cell_label(res: Mapping[str, Any]) -> str:
    return "-".join(str(res.get(k)) for k in ("topology", "connector", "transport"))


# ---------------------------------------------------------------- building


def _routers_from_dir(root: Path) -> list[RouterInfo]:
    matrix = root / MATRIX_JSON
    if matrix.is_file():
        doc = json.loads(matrix.read_text(encoding="utf-8"))
        return [RouterInfo(
            label=str(r.get("label")), spec=str(r.get("spec") or ""), version=r.get("version"),
            dir=str(r.get("dir") or r.get("label")), executable=r.get("executable"),
            skipped=list(r.get("skipped") or []), adjustments=list(r.get("adjustments") or []),
        ) for r in doc.get("routers") or []]
    found = sorted(p.parent for p in root.glob("*/report.json"))
    if not found:
        raise ValueError(f"{root}: no {MATRIX_JSON} and no */report.json")
    return [RouterInfo(label=p.name, spec=p.name, dir=p.name) for p in found]


def differs(outcomes: Mapping[str, Outcome]) -> bool:
    """Routers that ran the cell disagree on the verdict or on any checker they both ran."""
    ran = [o for o in outcomes.values() if o.status in STATUSES]
    if len({o.status for o in ran}) > 1:
        return True
    for i, a in enumerate(ran):
        for b in ran[i + 1:]:
            for name in a.checks.keys() & b.checks.keys():
                if a.checks[name] != b.checks[name]:
                    return True
    return False


def build_comparison(routers: Sequence[RouterInfo], results: Mapping[str, Sequence[Mapping[str, Any]]],
                     run_dirs: Mapping[str, Path]) -> RouterComparison:
    """Rows in first-seen order (scenario, cell) over every router's results and skips."""
    rows: dict[tuple[str, str], dict[str, Outcome]] = {}
    for r in routers:
        for res in results.get(r.label, ()):
            key = (str(res.get("scenario")), cell_label(res))
            rows.setdefault(key, {})[r.label] = outcome_from_result(res, run_dirs[r.label])
        for sk in r.skipped:
            key = (str(sk.get("scenario")), str(sk.get("cell")))
            rows.setdefault(key, {})[r.label] = Outcome(status="skipped", reason=str(sk.get("reason") or ""))
    out = []
    for (scen, cell), outcomes in rows.items():
        for r in routers:
            outcomes.setdefault(r.label, Outcome(status="missing", reason="no result (run not finished?)"))
        ordered = {r.label: outcomes[r.label] for r in routers}
        out.append(CellOutcomes(scen, cell, ordered, differs(ordered)))
    return RouterComparison(list(routers), out)


def load_comparison(root: str | os.PathLike[str]) -> RouterComparison:
    base = Path(root)
    routers = _routers_from_dir(base)
    results: dict[str, list[dict[str, Any]]] = {}
    dirs: dict[str, Path] = {}
    found: dict[str, list[Finding]] = {}
    for r in routers:
        d = base / r.dir
        dirs[r.label] = d
        rep = d / "report.json"
        if rep.is_file():
            doc = json.loads(rep.read_text(encoding="utf-8"))
            results[r.label] = [x for x in doc.get("results") or [] if isinstance(x, dict)]
            found[r.label] = findings_of(doc, [ScenarioResult.from_dict(x, d) for x in results[r.label]])
        elif d.is_dir():  # an interrupted router's folder: its cells as they stand (cut short: unknown)
            cells = collect_results(d)
            results[r.label] = [x.to_dict(base=d) for x in cells]
            found[r.label] = compute_findings(cells)
    comp = build_comparison(routers, results, dirs)
    previous: list[Finding] = []
    for r in routers:
        comp.findings[r.label] = findings_delta(previous, found.get(r.label, []))
        previous = found.get(r.label, [])
    return comp


# ---------------------------------------------------------------- writers


def short_cell(o: Outcome) -> str:
    """One table cell: `PASS rec 0.83s`, `FAIL reported_engine_id; err 29`, `skip`."""
    if o.status == "skipped":
        return "skip"
    if o.status == "missing":
        return "-"
    parts = [o.status.upper()]
    bad = [k for k, v in o.checks.items() if v != "pass" and k not in ("run_complete",)]
    if bad:
        parts.append(",".join(bad[:3]) + ("..." if len(bad) > 3 else ""))
    rec = o.numbers.get("recovery_s")
    if rec is not None:
        parts.append(f"rec {fmt_s(rec)}")
    errs = o.numbers.get("errors")
    if errs:
        parts.append(f"err {errs}/{o.numbers.get('requests')}")
    return " ".join(parts)


def markdown_table(comp: RouterComparison) -> str:
    labels = [r.label for r in comp.routers]
    lines = ["| scenario | cell | " + " | ".join(labels) + " |",
             "|---|---|" + "---|" * len(labels)]
    for row in comp.rows:
        mark = " (*)" if row.differs else ""
        cells = [short_cell(row.outcomes[lab]).replace("|", "/") for lab in labels]
        lines.append(f"| {row.scenario}{mark} | {row.cell} | " + " | ".join(cells) + " |")
    summ = comp.summary()
    lines.append("| **total** | | " + " | ".join(
        f"{summ[lab]['pass']} pass, {summ[lab]['fail']} fail, {summ[lab]['unknown']} unknown, "
        f"{summ[lab]['skipped']} skipped" for lab in labels) + " |")
    lines.append("")
    lines.append("(*) routers disagree; `rec` = slowest fault heal to worker Ready; `err` = failed "
                 "requests / requests; `skip` = the router cannot run that cell (reason in compare.html / "
                 "compare.json).")
    return "\n".join(lines)


def findings_lines(comp: RouterComparison) -> list[str]:
    """The terminal's last lines of a matrix: each router's findings against the router before it."""
    lines: list[str] = []
    before = ""
    for label, changes in comp.findings.items():
        lines += delta_lines(changes, before or "no router", whose=label)
        before = label
    return lines


def _transport(cell: str) -> str:
    return cell.rsplit("-", 1)[-1]


def scenario_table(comp: RouterComparison) -> str:
    """Cells per scenario, router and transport, as `pass/fail/unknown` (` sN`: N skipped; `-`: no cell):
    the view of a whole-set matrix that fits on a page. A transport column appears for a router only where
    it ran a cell on it."""
    counts: dict[tuple[str, str, str], Counter[str]] = {}
    for row in comp.rows:
        for label, o in row.outcomes.items():
            if o.status != "missing":
                counts.setdefault((row.scenario, label, _transport(row.cell)), Counter())[o.status] += 1
    ran = {(label, t) for (_, label, t), c in counts.items() if c.keys() & set(STATUSES)}
    columns = [(r.label, t) for r in comp.routers for t in ("grpc", "http") if (r.label, t) in ran]
    totals = {col: Counter[str]() for col in columns}
    lines = ["| scenario | " + " | ".join(f"{label} {t}" for label, t in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for scenario in dict.fromkeys(row.scenario for row in comp.rows):
        cells = []
        for col in columns:
            c = counts.get((scenario, *col))
            if c is None:
                cells.append("-")
                continue
            totals[col].update(c)
            cells.append(_counted(c))
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(_counted(totals[col]) for col in columns) + " |")
    return "\n".join(lines)


def _counted(c: Counter[str]) -> str:
    skipped = f" s{c['skipped']}" if c["skipped"] else ""
    return f"{c['pass']}/{c['fail']}/{c['unknown']}{skipped}"


def comparison_json(comp: RouterComparison) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "generated_at": comp.generated_at,
        "status": comp.status,
        "routers": [asdict(r) for r in comp.routers],
        "summary": comp.summary(),
        "findings": {label: [c.to_dict() for c in changes] for label, changes in comp.findings.items()},
        "rows": [
            {"scenario": r.scenario, "cell": r.cell, "differs": r.differs,
             "outcomes": {k: asdict(o) for k, o in r.outcomes.items()}}
            for r in comp.rows
        ],
    }


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f0f0f0}
.pass{background:#dff0d8}.fail{background:#f2dede}.unknown{background:#fcf8e3}
.skipped,.missing{background:#eee;color:#777}
.differs{font-weight:bold}
section{border-top:2px solid #ddd;margin-top:1.5em;padding-top:.5em}
pre{background:#f7f7f7;padding:6px;overflow-x:auto;font-size:12px;max-height:30em}
"""


def _anchor(row: CellOutcomes) -> str:
    return "d-" + "".join(c if c.isalnum() else "_" for c in row.key)


def _rel(path: str | None, base: Path) -> str | None:
    if not path:
        return None
    try:
        return os.path.relpath(path, base)
    except ValueError:
        return path


def _findings_by_router(comp: RouterComparison) -> str:
    """Each router's findings against the router before it: what a release brought and what it fixed."""
    h = ["<h2>Findings by router</h2><p>Each router against the one before it (the first against none): "
         "new findings, gone ones, and those it kept.</p><table><tr><th>router</th><th>change</th>"
         "<th>finding</th><th>cells</th></tr>"]
    for label, changes in comp.findings.items():
        if not changes:
            h.append(f"<tr><td>{esc(label)}</td><td colspan='3'>no finding</td></tr>")
        for c in changes:
            cells = c.current_cells if c.kind != "gone" else c.baseline_cells
            row = "fail" if c.kind == "new" else ""
            h.append(f"<tr class='{row}'><td>{esc(label)}</td><td>{esc(c.kind)}</td>"
                     f"<td>{esc(c.finding.title)}<br><code>{esc(c.finding.signature)}</code></td>"
                     f"<td>{cells}</td></tr>")
    h.append("</table>")
    return "".join(h)


def comparison_html(comp: RouterComparison, base: Path) -> str:
    labels = [r.label for r in comp.routers]
    summ = comp.summary()
    h: list[str] = [
        "<!doctype html><html><head><meta charset='utf-8'><title>pdchaos router comparison</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>pdchaos: routers compared</h1>",
        f"<p>Generated {esc(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(comp.generated_at)))}; "
        f"overall <b>{esc(comp.status.upper())}</b>. Bold rows: the routers disagree (details below).</p>",
        "<h2>Routers</h2><table><tr><th>router</th><th>spec</th><th>binary</th><th>pass</th><th>fail</th>"
        "<th>unknown</th><th>skipped</th><th>settings taken approximately</th></tr>",
    ]
    for r in comp.routers:
        s = summ[r.label]
        rep = _rel(str(base / r.dir / "report.html"), base)
        h.append(
            f"<tr><td><a href='{esc(rep)}'>{esc(r.label)}</a></td><td><code>{esc(r.spec)}</code></td>"
            f"<td><code>{esc(r.executable)}</code></td><td>{s['pass']}</td><td>{s['fail']}</td>"
            f"<td>{s['unknown']}</td><td>{s['skipped']}</td>"
            f"<td>{'<br>'.join(esc(a) for a in r.adjustments) or '-'}</td></tr>"
        )
    h.append("</table><h2>Verdicts</h2><table><tr><th>scenario</th><th>cell</th>"
             + "".join(f"<th>{esc(lab)}</th>" for lab in labels) + "</tr>")
    for row in comp.rows:
        name = (f"<a href='#{_anchor(row)}'>{esc(row.scenario)}</a>" if row.differs else esc(row.scenario))
        h.append(f"<tr class='{'differs' if row.differs else ''}'><td>{name}</td><td>{esc(row.cell)}</td>")
        for lab in labels:
            o = row.outcomes[lab]
            title = o.reason
            link = _rel(o.cell_dir, base)
            text = esc(short_cell(o))
            if link:
                text = f"<a href='{esc(link)}/'>{text}</a>"
            h.append(f"<td class='{esc(o.status)}' title='{esc(title)}'>{text}</td>")
        h.append("</tr>")
    h.append("</table>")
    h.append(_findings_by_router(comp))
    h.append("<h2>Key numbers</h2><table><tr><th>scenario</th><th>cell</th><th>router</th><th>verdict</th>"
             "<th>recovery (heal to Ready)</th><th>heal to first handoff</th><th>requests</th><th>errors</th>"
             "<th>error statuses</th><th>client timeouts</th><th>decode handoff outcomes</th></tr>")
    for row in comp.rows:
        for lab in labels:
            o = row.outcomes[lab]
            if o.status not in STATUSES:
                continue
            n = o.numbers
            h.append(
                f"<tr><td>{esc(row.scenario)}</td><td>{esc(row.cell)}</td><td>{esc(lab)}</td>"
                f"<td class='{esc(o.status)}'>{esc(o.status)}</td><td>{fmt_s(n.get('recovery_s'))}</td>"
                f"<td>{fmt_s(n.get('heal_to_handoff_s'))}</td><td>{esc(n.get('requests', '-'))}</td>"
                f"<td>{esc(n.get('errors', '-'))}</td><td>{esc(json.dumps(n.get('error_status', {})))}</td>"
                f"<td>{esc(n.get('timeouts', '-'))}</td>"
                f"<td>{esc(json.dumps(n.get('handoffs', {})))}</td></tr>"
            )
    h.append("</table>")
    diffs = [r for r in comp.rows if r.differs]
    h.append(f"<section><h2>Differences ({len(diffs)})</h2>")
    for row in diffs:
        h.append(f"<h3 id='{_anchor(row)}'>{esc(row.scenario)} <small>{esc(row.cell)}</small></h3>")
        h.append("<table><tr><th>router</th><th>verdict</th><th>evidence</th></tr>")
        for lab in labels:
            o = row.outcomes[lab]
            body = {"reason": o.reason, "checks": o.checks, "numbers": o.numbers, **o.evidence}
            h.append(f"<tr><td>{esc(lab)}</td><td class='{esc(o.status)}'>{esc(o.status)}</td>"
                     f"<td><pre>{esc(json.dumps(body, indent=1, default=str))}</pre></td></tr>")
        h.append("</table>")
    h.append("</section>")
    skipped = [(r.label, sk) for r in comp.routers for sk in r.skipped]
    if skipped:
        h.append("<section><h2>Skipped (not run: not a pass)</h2><table><tr><th>router</th><th>scenario</th>"
                 "<th>cell</th><th>why</th></tr>")
        for lab, sk in skipped:
            h.append(f"<tr><td>{esc(lab)}</td><td>{esc(sk.get('scenario'))}</td><td>{esc(sk.get('cell'))}</td>"
                     f"<td>{esc(sk.get('reason'))}</td></tr>")
        h.append("</table></section>")
    h.append("<section><h2>Markdown</h2><pre>" + esc(markdown_table(comp)) + "</pre></section>")
    h.append("</body></html>")
    return "\n".join(h)


def write_comparison(root: str | os.PathLike[str]) -> RouterComparison:
    """Read a matrix folder and write compare.json, compare.html and compare.md into it."""
    base = Path(root)
    comp = load_comparison(base)
    (base / COMPARE_JSON).write_text(json.dumps(comparison_json(comp), indent=2, default=str) + "\n",
                                     encoding="utf-8")
    (base / COMPARE_HTML).write_text(comparison_html(comp, base), encoding="utf-8")
    by_scenario = ("\n\n## By scenario (cells pass/fail/unknown; sN: N skipped; -: no cell)\n\n"
                   + scenario_table(comp))
    (base / COMPARE_MD).write_text(markdown_table(comp) + by_scenario + "\n", encoding="utf-8")
    return comp
