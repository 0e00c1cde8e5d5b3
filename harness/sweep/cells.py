"""A finished run folder read back as keyed cells: what a comparison lines up.

Reads what `pdchaos run`, `pdchaos sweep` (and the groups of either) leave behind: `report.json`
(schema `pdchaos.report/2`: statuses, verdicts with their numbers and evidence), `sweep.json` when the
folder is a sweep (each cell's key: router label, world, settings, engine backend) and each cell's
`history.jsonl` (times to first token, the probe interval the run used).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.run_folder import READABLE_SCHEMAS, REPORT_JSON, SCHEMA
from harness.sweep.keys import CellKey
from harness.value_checks import number_or_none
from pdchaos.jsonl import read_jsonl

SWEEP_JSON = "sweep.json"
SWEEP_SCHEMA = "pdchaos.sweep/1"
EVIDENCE_ITEMS = 8


class BaselineError(ValueError):
    """A folder that holds no run to compare with."""


@dataclass
class CellRecord:
    key: CellKey
    status: str
    reason: str = ""
    checks: dict[str, str] = field(default_factory=dict)
    # The verdicts that did not pass, each with its own reason and evidence.
    failing: list[dict[str, Any]] = field(default_factory=list)
    replay: str = ""
    cell_dir: str | None = None
    time_unit: str = "seconds"
    probe_interval_s: float | None = None
    recovery_s: float | None = None
    heal_to_handoff_s: float | None = None
    ttft_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-able, without the samples."""
        return {"status": self.status, "reason": self.reason, "checks": self.checks, "failing": self.failing,
                "replay": self.replay, "cell_dir": self.cell_dir, "time_unit": self.time_unit,
                "probe_interval_s": self.probe_interval_s, "recovery_s": self.recovery_s,
                "heal_to_handoff_s": self.heal_to_handoff_s, "ttft_samples": len(self.ttft_s)}


def load_cells(folder: str | Path) -> dict[CellKey, CellRecord]:
    """Every cell of a run or sweep folder, by key. BaselineError when there is no report to read."""
    root = Path(folder)
    report = root / REPORT_JSON
    if not report.is_file():
        raise BaselineError(f"{root}: no {REPORT_JSON} (folders written by `pdchaos run` or `pdchaos sweep` "
                            "have one)")
    try:
        doc = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text
        raise BaselineError(f"{report}: unreadable ({e})") from None
    if not isinstance(doc, Mapping) or doc.get("schema") not in READABLE_SCHEMAS:
        raise BaselineError(f"{report}: not a {SCHEMA} document")
    keys = _sweep_keys(root)
    out: dict[CellKey, CellRecord] = {}
    for res in doc.get("results") or []:
        if not isinstance(res, Mapping):
            continue
        cell_dir = str(res.get("cell_dir") or "")
        key = keys.get(cell_dir) or _plain_key(res)
        out[key] = record_from_result(key, res, root)
    return out


def _sweep_keys(root: Path) -> dict[str, CellKey]:
    """cell folder -> key, from sweep.json (a plain run folder has none)."""
    path = root / SWEEP_JSON
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text
        raise BaselineError(f"{path}: unreadable ({e})") from None
    out = {}
    for c in doc.get("cells") or []:
        if isinstance(c, Mapping) and c.get("dir"):
            out[str(c["dir"])] = CellKey.from_dict(c)
    return out


def _plain_key(res: Mapping[str, Any]) -> CellKey:
    return CellKey(str(res.get("scenario")), str(res.get("topology")), str(res.get("connector")),
                   str(res.get("transport")), router=str(res.get("router") or "reference"),
                   world=str(res.get("world") or "real"), settings=str(res.get("settings") or "scaled"))


def record_from_result(key: CellKey, res: Mapping[str, Any], root: Path) -> CellRecord:
    verdicts = [v for v in res.get("verdicts") or [] if isinstance(v, Mapping)]
    rec = CellRecord(
        key=key,
        status=str(res.get("status") or "unknown"),
        reason=str(res.get("reason") or ""),
        checks={str(v.get("name")): str(v.get("status")) for v in verdicts},
        failing=[{"name": v.get("name"), "status": v.get("status"), "reason": v.get("reason"),
                  "evidence": list(v.get("evidence") or [])[:EVIDENCE_ITEMS]}
                 for v in verdicts if v.get("status") != "pass"],
        replay=str(res.get("replay") or ""),
        cell_dir=str(root / str(res["cell_dir"])) if res.get("cell_dir") else None,
    )
    rec.recovery_s, rec.heal_to_handoff_s = recovery_times(verdicts)
    hist = res.get("history")
    if isinstance(hist, str) and hist and (root / hist).is_file():
        read_history(rec, read_jsonl(root / hist))
    return rec


def recovery_times(verdicts: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """The slowest heal -> Ready and heal -> first correct handoff over the faults the recovery checker
    judged (the slowest: one slow recovery is what a regression looks like)."""
    from reports.compare import recovery_numbers

    got = recovery_numbers(verdicts)
    return got["recovery_s"], got["heal_to_handoff_s"]


def read_history(rec: CellRecord, records: Iterable[Mapping[str, Any]]) -> None:
    """Times to first token of the requests that succeeded, and the run's probe interval and time unit."""
    for r in records:
        kind = r.get("type")
        if kind == "request_completed":
            t = number_or_none(r.get("ttft_s"))
            if r.get("ok") and t is not None:
                rec.ttft_s.append(t)
        elif kind == "run_started":
            rec.time_unit = str(r.get("time_unit") or "seconds")
            settings = r.get("settings")
            interval = settings.get("health_interval_s") if isinstance(settings, Mapping) else None
            rec.probe_interval_s = number_or_none(interval)
