"""Lining a run up with a baseline run: what changed, cell by cell, and whether a change is more than noise.

Each cell (same key: scenario, topology/connector/transport, router label, world, settings, engines) gets
one row, of one kind:

- `regression`: its verdict got worse (pass -> fail, pass -> unknown or race, unknown or race -> fail), a
  number got worse beyond its noise threshold, or the cell is new and does not pass;
- `improvement`: its verdict got better (-> pass) or a number got better beyond noise, and nothing worse;
- `new` / `gone`: in one run only (a new cell that passes; a cell the sweep no longer runs);
- `changed`: a difference that is neither (fail -> unknown: judged no longer; a different checker failing);
- `same`.

Numbers and their noise thresholds (`harness.sweep.spec.Thresholds`, the `[compare]` table):

- recovery (fault healed -> worker Ready; and -> first correct handoff): one measurement per run, so no
  spread to estimate noise from. A router only notices a recovery at a probe, so a change must exceed
  `recovery_probe_intervals` probe intervals, `recovery_rel` of the baseline and `recovery_abs_s`,
  whichever is largest.
- time to first token (the median and the 95th percentile over the successful requests): the change
  must exceed `ttft_rel` of the baseline's value and `ttft_abs_s`, and the bootstrap confidence interval
  of the difference (`confidence`, `resamples` resamples of both runs' requests, seeded: the same inputs
  give the same interval) must exclude zero.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.findings import FindingChange
from harness.sweep.cells import CellRecord
from harness.sweep.keys import CellKey
from harness.sweep.spec import Thresholds

SCHEMA = "pdchaos.sweep-compare/1"
KINDS = ("regression", "new", "gone", "improvement", "changed", "same")
MIN_SAMPLES = 5
_CHUNK = 250


@dataclass(frozen=True)
class MetricChange:
    name: str
    baseline: float
    current: float
    threshold: float
    rule: str
    significant: bool
    ci: tuple[float, float] | None = None
    samples: tuple[int, int] | None = None

    @property
    def delta(self) -> float:
        return self.current - self.baseline

    @property
    def worse(self) -> bool:
        return self.significant and self.delta > 0

    @property
    def better(self) -> bool:
        return self.significant and self.delta < 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "baseline": self.baseline, "current": self.current,
                "delta": round(self.delta, 6), "threshold": round(self.threshold, 6), "rule": self.rule,
                "significant": self.significant, "worse": self.worse, "better": self.better,
                "ci": None if self.ci is None else [round(x, 6) for x in self.ci],
                "samples": None if self.samples is None else list(self.samples)}


@dataclass
class CellChange:
    key: CellKey
    kind: str
    baseline: CellRecord | None = None
    current: CellRecord | None = None
    verdict_change: str | None = None
    check_changes: list[str] = field(default_factory=list)
    metrics: list[MetricChange] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.key.to_dict(), "label": self.key.label, "kind": self.kind,
                "verdict_change": self.verdict_change, "check_changes": self.check_changes,
                "why": self.why, "metrics": [m.to_dict() for m in self.metrics],
                "baseline": None if self.baseline is None else self.baseline.summary(),
                "current": None if self.current is None else self.current.summary()}


@dataclass
class SweepComparison:
    baseline_dir: str
    current_dir: str
    thresholds: Thresholds
    rows: list[CellChange]
    # The findings of both runs lined up (`harness.findings.findings_delta`): new, gone, unchanged.
    findings: list[FindingChange] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[CellChange]:
        return [r for r in self.rows if r.kind == kind]

    @property
    def regressions(self) -> list[CellChange]:
        return self.of_kind("regression")

    def counts(self) -> dict[str, int]:
        c = Counter(r.kind for r in self.rows)
        return {k: c.get(k, 0) for k in KINDS}

    def differences(self) -> list[CellChange]:
        """Every row that is not `same`, the worst kinds first."""
        return [r for k in KINDS if k != "same" for r in self.of_kind(k)]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "baseline": self.baseline_dir, "current": self.current_dir,
                "thresholds": asdict(self.thresholds), "summary": self.counts(),
                "findings": [c.to_dict() for c in self.findings],
                "rows": [r.to_dict() for r in self.differences() + self.of_kind("same")]}


def compare(baseline: Mapping[CellKey, CellRecord], current: Mapping[CellKey, CellRecord],
            thresholds: Thresholds | None = None, baseline_dir: str | Path = "",
            current_dir: str | Path = "") -> SweepComparison:
    th = thresholds or Thresholds()
    rows = [compare_cell(key, baseline.get(key), current.get(key), th)
            for key in sorted(set(baseline) | set(current))]
    return SweepComparison(str(baseline_dir), str(current_dir), th, rows)


def compare_cell(key: CellKey, b: CellRecord | None, c: CellRecord | None, th: Thresholds) -> CellChange:
    if b is None:
        assert c is not None
        if c.status != "pass":
            return CellChange(key, "regression", None, c, why=[f"new cell, {c.status}: {c.reason}"])
        return CellChange(key, "new", None, c, why=["in this run only"])
    if c is None:
        return CellChange(key, "gone", b, None, why=["in the baseline only"])
    row = CellChange(key, "same", b, c)
    worse = better = False
    if b.status != c.status:
        row.verdict_change = f"{b.status} -> {c.status}"
        # fail -> unknown is neither: the cell can no longer be judged, which is not a pass.
        # A race (split over repeated runs) stays a race: a regression only once it fails every run.
        worse = ((b.status == "pass" and c.status != "pass")
                 or (b.status in ("unknown", "race") and c.status == "fail"))
        better = c.status == "pass"
        row.why.append(f"verdict {row.verdict_change}" + (f": {c.reason}" if c.status != "pass" else ""))
    for name in sorted(set(b.checks) | set(c.checks)):
        x, y = b.checks.get(name), c.checks.get(name)
        if x != y:
            row.check_changes.append(f"{name}: {x or '-'} -> {y or '-'}")
    row.metrics = metric_changes(b, c, th)
    for m in row.metrics:
        if m.significant:
            row.why.append(f"{m.name} {m.baseline:.3f} -> {m.current:.3f} ({m.delta:+.3f}; threshold "
                           f"{m.threshold:.3f})")
    worse = worse or any(m.worse for m in row.metrics)
    better = better or any(m.better for m in row.metrics)
    if worse:
        row.kind = "regression"
    elif better:
        row.kind = "improvement"
    elif row.verdict_change or row.check_changes:
        row.kind = "changed"
        if not row.why:
            row.why.append("a different set of checkers " + c.status)
    return row


# ---------------------------------------------------------------- numbers


def metric_changes(b: CellRecord, c: CellRecord, th: Thresholds) -> list[MetricChange]:
    out = []
    probe = max(x for x in (b.probe_interval_s, c.probe_interval_s, 0.0) if x is not None)
    for name, x, y in (("recovery_s", b.recovery_s, c.recovery_s),
                       ("heal_to_handoff_s", b.heal_to_handoff_s, c.heal_to_handoff_s)):
        if x is not None and y is not None:
            out.append(recovery_change(name, x, y, probe, th))
    if len(b.ttft_s) >= MIN_SAMPLES and len(c.ttft_s) >= MIN_SAMPLES:
        xs, ys = np.asarray(b.ttft_s, dtype=float), np.asarray(c.ttft_s, dtype=float)
        for q, name in ((0.5, "ttft_p50_s"), (0.95, "ttft_p95_s")):
            out.append(ttft_change(name, xs, ys, q, th))
    return out


def recovery_change(name: str, base: float, cur: float, probe_s: float, th: Thresholds) -> MetricChange:
    parts = {"abs": th.recovery_abs_s, "rel": th.recovery_rel * base,
             "probes": th.recovery_probe_intervals * probe_s}
    threshold = max(parts.values())
    rule = (f"max({th.recovery_abs_s:g} s, {th.recovery_rel:.0%} of {base:.3f} s, "
            f"{th.recovery_probe_intervals:g} probe intervals x {probe_s:g} s)")
    return MetricChange(name, base, cur, threshold, rule, abs(cur - base) > threshold)


def ttft_change(name: str, xs: np.ndarray, ys: np.ndarray, q: float, th: Thresholds) -> MetricChange:
    base, cur = float(np.quantile(xs, q)), float(np.quantile(ys, q))
    threshold = max(th.ttft_abs_s, th.ttft_rel * base)
    lo, hi = bootstrap_ci(xs, ys, q, th.confidence, th.resamples)
    outside = lo > 0 or hi < 0
    rule = (f"max({th.ttft_abs_s:g} s, {th.ttft_rel:.0%} of {base:.4f} s), and the {th.confidence:.0%} "
            f"bootstrap interval of the change excludes 0")
    return MetricChange(name, base, cur, threshold, rule, abs(cur - base) > threshold and outside,
                        ci=(lo, hi), samples=(len(xs), len(ys)))


def bootstrap_ci(xs: np.ndarray, ys: np.ndarray, q: float, confidence: float, resamples: int
                 ) -> tuple[float, float]:
    """Percentile bootstrap of quantile(ys) - quantile(xs), both runs resampled independently."""
    rng = np.random.default_rng(0)
    diffs = []
    left = max(1, resamples)
    while left:
        n = min(_CHUNK, left)
        bx = np.quantile(xs[rng.integers(0, len(xs), size=(n, len(xs)))], q, axis=1)
        by = np.quantile(ys[rng.integers(0, len(ys), size=(n, len(ys)))], q, axis=1)
        diffs.append(by - bx)
        left -= n
    d = np.concatenate(diffs)
    tail = (1 - confidence) / 2
    return float(np.quantile(d, tail)), float(np.quantile(d, 1 - tail))
