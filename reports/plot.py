"""Timeline plot of one run: router-observed worker status lanes, fault windows, request latencies."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # never a display, even if pyplot gets imported elsewhere
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from harness.history import History, RequestView

STATUS_COLORS = {
    "ready": "#2ca02c",
    "pending": "#bcbd22",
    "not_ready": "#ff7f0e",
    "failed": "#d62728",
    "draining": "#9467bd",
    "absent": "#7f7f7f",
}
OUTCOME_COLORS = {
    "ok": "#2ca02c",
    "wrong output": "#9467bd",
    "503": "#ff7f0e",
    "error": "#d62728",
    "timed out / no response": "#000000",
    "pending": "#7f7f7f",
}


def request_outcome(r: RequestView) -> str:
    if not r.completed:
        return "pending"
    if r.timed_out or r.status == 0:
        return "timed out / no response"
    if r.ok:
        return "wrong output" if r.text_ok is False else "ok"
    if r.status == 503:
        return "503"
    return "error"


def timeline_png(history: History, title: str = "", dpi: int = 80) -> bytes:
    """PNG bytes of the run's timeline (empty lanes/points where the history has none)."""
    end = max(history.end_t, 1e-3)
    # The object API (no pyplot): no global figure registry, nothing to leak between reports.
    fig = Figure(figsize=(10, 4.8))
    lanes, lat = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1.4]})
    workers = sorted(history.status)
    seen_statuses = {p.status for w in workers for p in history.status_timeline(w)}
    for i, worker in enumerate(workers):
        points = history.status_timeline(worker)
        for j, p in enumerate(points):
            stop = points[j + 1].t if j + 1 < len(points) else end
            color = STATUS_COLORS.get(p.status, "#17becf")
            lanes.broken_barh([(p.t, max(stop - p.t, 1e-3))], (i - 0.35, 0.7), facecolors=color)
    labels = []
    for w in workers:
        pts = history.status_timeline(w)
        name = next((p.engine for p in pts if p.engine), None) or w
        labels.append(str(name)[:24])
    lanes.set_yticks(range(len(workers)), labels=labels, fontsize=8)
    # Headroom above the lanes for the legend and fault labels.
    lanes.set_ylim(-0.6, max(len(workers), 1) + 0.5)
    lanes.set_title(title or "router-observed worker status", fontsize=10)
    if not workers:
        lanes.text(0.5, 0.5, "no router status observed", ha="center", va="center", transform=lanes.transAxes)
    lanes.legend(
        handles=[Patch(color=c, label=s) for s, c in STATUS_COLORS.items() if s in seen_statuses],
        fontsize=7,
        loc="upper right",
        ncol=6,
    )

    for f, start, stop in history.fault_windows():
        for ax in (lanes, lat):
            ax.axvspan(start, stop, color="#d62728", alpha=0.12, lw=0)
        lanes.text(start, lanes.get_ylim()[1], f" {f.kind or f.fault}:{f.target}", fontsize=7, va="top")

    groups: dict[str, tuple[list[float], list[float]]] = {}
    for r in history.request_list():
        start = r.start_t
        if start is None:
            continue
        latency = r.latency_s if r.latency_s is not None else max(end - start, 0.0)
        xs, ys = groups.setdefault(request_outcome(r), ([], []))
        xs.append(start)
        ys.append(latency)
    for outcome, (xs, ys) in groups.items():
        lat.scatter(xs, ys, s=9, color=OUTCOME_COLORS[outcome], label=f"{outcome} ({len(xs)})")
    if groups:
        lat.legend(fontsize=7, loc="upper left")
    else:
        lat.text(0.5, 0.5, "no requests", ha="center", va="center", transform=lat.transAxes)
    lat.set_ylabel("latency (s)", fontsize=8)
    lat.set_xlabel("time since start (s)", fontsize=8)
    lat.set_xlim(0, end)
    # Fixed margins: tight_layout costs about as much as drawing the figure.
    fig.subplots_adjust(left=0.1, right=0.98, top=0.93, bottom=0.1, hspace=0.12)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
