"""The part of a cell's report.html section that comes from its history: the timeline plot and the tables.

Reading a history back and plotting it costs about 0.2 s a cell, and a suite renders its report after
every cell is done. So a cell that will be reported renders its part where it ran, from the view already in
memory, into `report-part.json` beside its history (`write_cell_part`). The report uses that file while it
still describes the history on disk (same size and modification time, same format) and renders afresh
otherwise (`cell_part`), so a re-render of an edited or rechecked run is never stale.
"""

from __future__ import annotations

import base64
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.checkers import check_recovery
from harness.checkers.stats import latency_summary
from harness.history import History, load_history
from harness.result import ScenarioResult
from harness.verdict import Verdict
from reports.markup import badge, esc, fmt_s

CELL_PART = "report-part.json"
# Bumped whenever what a part holds, or how it is rendered, changes: an older file is then ignored.
PART_FORMAT = 1


@dataclass(frozen=True)
class CellPart:
    """`problem`: what is wrong with the history ("" when complete); `recovery`: the recovery table as the
    history alone gives it (used when the result has no recovery verdict of its own); `wall_start`: the
    wall-clock time of the history's start (None: not recorded)."""

    problem: str
    plot: str
    recovery: str
    handoffs: str
    latency: str
    wall_start: float | None = None


def cell_part(r: ScenarioResult, plots: bool) -> CellPart:
    """The part of `r`'s section that its history gives: the saved one while it is current, else rendered
    from the history on disk."""
    if r.history_path is None:
        return _without_history("no history recorded")
    saved = _read(r.history_path, plots)
    if saved is not None:
        return saved
    try:
        h = load_history(r.history_path)
    except OSError as e:
        return _without_history(f"history unreadable: {e}")
    return render_part(r, h, plots)


def _without_history(problem: str) -> CellPart:
    return CellPart(problem, "", recovery_table(None), _handoff_table(None), _latency_table(None))


def write_cell_part(r: ScenarioResult, h: History, plots: bool = True) -> None:
    """Render `r`'s part from `h` (the view of the history `r` names, complete) and save it beside it."""
    if r.history_path is None or not r.history_path.exists():
        return
    part = render_part(r, h, plots)
    path = r.history_path.parent / CELL_PART
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": PART_FORMAT, "history": _stamp(r.history_path), "plots": plots,
                               **asdict(part)}), encoding="utf-8")
    tmp.replace(path)


def render_part(r: ScenarioResult, h: History, plots: bool) -> CellPart:
    problem = "" if h.complete else f"history truncated: no run_ended (last record at t={h.end_t:.2f}s)"
    return CellPart(problem, _plot(h, r, plots), recovery_table(check_recovery(h) if h.faults else None),
                    _handoff_table(h), _latency_table(h), h.wall_start)


def recovery_table(verdict: Verdict | None) -> str:
    faults = (verdict.numbers.get("faults") if verdict is not None else None) or {}
    if not faults:
        return "<p>No fault recoveries measured.</p>"
    rows = []
    for fid, n in faults.items():
        if not isinstance(n, dict):
            continue
        rows.append(
            f'<tr class="{esc(n.get("status"))}"><td>{esc(fid)}</td><td>{esc(n.get("kind"))}</td>'
            f"<td>{esc(n.get('target'))}</td><td>{fmt_s(n.get('heal_to_ready_s'))}</td>"
            f"<td>{fmt_s(n.get('ready_to_handoff_s'))}</td><td>{fmt_s(n.get('heal_to_handoff_s'))}</td>"
            f"<td>{badge(n.get('status'))}</td></tr>"
        )
    head = (
        "<tr><th>Fault</th><th>Kind</th><th>Target</th><th>Heal &rarr; Ready</th>"
        "<th>Ready &rarr; first correct handoff</th><th>Heal &rarr; handoff</th><th>Status</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _read(history: Path, plots: bool) -> CellPart | None:
    """The saved part of `history`, if it is current and was rendered with the plots asked for."""
    try:
        saved = json.loads((history.parent / CELL_PART).read_text(encoding="utf-8"))
        current = _stamp(history)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("format") != PART_FORMAT or saved.get("history") != current:
        return None
    if saved.get("plots") != plots:
        return None
    try:
        texts = [str(saved[k]) for k in ("problem", "plot", "recovery", "handoffs", "latency")]
        wall_start = saved["wall_start"]
    except KeyError:
        return None
    return CellPart(*texts, float(wall_start) if isinstance(wall_start, int | float) else None)


def _plot(h: History, r: ScenarioResult, plots: bool) -> str:
    if not plots:
        return "<p>(timeline plot not rendered)</p>"
    # Imported here: matplotlib takes half a second to import, and a report whose parts were all rendered
    # where the cells ran draws nothing.
    from reports.plot import timeline_png

    try:
        png = timeline_png(h, title=f"{r.scenario} / {r.cell}")
    except Exception as e:  # a broken plot must not cost the rest of the report
        return f"<p>Timeline plot failed: {esc(type(e).__name__)}: {esc(e)}</p>"
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="timeline {esc(r.key)}" src="data:image/png;base64,{data}">'


def _handoff_table(h: History | None) -> str:
    if h is None or not h.handoffs:
        return "<p>No handoff records.</p>"
    counts = Counter((str(x.engine), str(x.kind), str(x.outcome)) for x in h.handoffs)
    outcomes = sorted({k[2] for k in counts})
    engines = sorted({(k[0], k[1]) for k in counts})
    head = "<tr><th>Engine</th><th>Kind</th>" + "".join(f"<th>{esc(o)}</th>" for o in outcomes) + "</tr>"
    rows = [
        f"<tr><td>{esc(e)}</td><td>{esc(k)}</td>"
        + "".join(f"<td>{counts.get((e, k, o), 0)}</td>" for o in outcomes)
        + "</tr>"
        for e, k in engines
    ]
    return f"<table>{head}{''.join(rows)}</table>"


def _latency_table(h: History | None) -> str:
    if h is None or not h.requests:
        return "<p>No client requests.</p>"
    summary = latency_summary(h)
    head = "<tr><th>Requests</th><th>n</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>"
    rows = []
    for label, key in (("latency, all", "latency_s"), ("latency, correct", "ok_latency_s"),
                       ("time to first token, correct", "ttft_s")):
        st = summary[key]
        rows.append(f"<tr><td>{esc(label)}</td><td>{st['n']}</td><td>{fmt_s(st['p50'])}</td>"
                    f"<td>{fmt_s(st['p90'])}</td><td>{fmt_s(st['p99'])}</td><td>{fmt_s(st['max'])}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"
