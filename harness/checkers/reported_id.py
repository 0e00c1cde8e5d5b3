"""The worker API shows the engine id in force (bug #14: it keeps showing the id read at registration).

For every engine id change seen in `engine_state` (restart), the router's `/workers` view of that engine
must show the new id within `max_lag_s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from harness.checkers._common import cap, rounded
from harness.history import History, base_engine_id
from harness.verdict import Verdict

NAME = "reported_engine_id"


@dataclass(frozen=True)
class ReportedEngineIdExpect:
    """`roles`: engines whose ids the router tracks (Mooncake minting needs the prefill's)."""

    max_lag_s: float = 5.0
    roles: tuple[str, ...] = ("prefill",)


def check_reported_engine_id(history: History, exp: ReportedEngineIdExpect | None = None) -> Verdict:
    exp = exp or ReportedEngineIdExpect()
    if not history.status:
        return Verdict.unknown_(NAME, "the router's worker list was not observed")
    if not any(p.kv_engine_id for points in history.status.values() for p in points):
        return Verdict.unknown_(NAME, "the router's worker list shows no engine ids")
    changes: dict[str, Any] = {}
    fails: list[str] = []
    unknowns: list[str] = []
    for engine, states in history.engines.items():
        if history.engine_role(engine) not in exp.roles:
            continue
        workers = history.workers_for(engine)
        for prev, cur in pairwise(states):
            new = base_engine_id(cur.engine_id)
            if not new or new == base_engine_id(prev.engine_id):
                continue
            key = f"{engine}@{cur.t:.2f}"
            seen = [
                p.t
                for w in workers
                for p in history.status_timeline(w)
                if p.t >= cur.t and base_engine_id(p.kv_engine_id) == new
            ]
            # The harness may learn an engine's new id after the router does (a pod's readiness comes
            # later than the router's probe): a router already showing it is not late.
            early = any((shown := history.status_at(w, cur.t)) is not None
                        and base_engine_id(shown.kv_engine_id) == new for w in workers)
            lag = 0.0 if early else min(seen) - cur.t if seen else None
            changes[key] = {"new_id": cur.engine_id, "lag_s": rounded(lag, 3)}
            if not workers:
                unknowns.append(f"{key}: no router worker for {engine}")
            elif lag is not None and lag <= exp.max_lag_s:
                continue
            elif lag is not None or history.end_t - cur.t >= exp.max_lag_s:
                shown = history.status_at(workers[0], cur.t + exp.max_lag_s)
                fails.append(
                    f"{key}: router still showed {shown.kv_engine_id if shown else None!r} "
                    f"{exp.max_lag_s}s after the engine became {cur.engine_id!r}"
                )
            else:
                unknowns.append(f"{key}: run ended {history.end_t - cur.t:.2f}s after the change")
    numbers = {"max_lag_s": exp.max_lag_s, "changes": changes}
    if fails:
        return Verdict.fail(NAME, f"{len(fails)} engine id change(s) not shown in time", numbers, cap(fails))
    if unknowns:
        return Verdict.unknown_(NAME, "; ".join(unknowns), numbers)
    if not changes:
        return Verdict.unknown_(NAME, "no engine id changed during the run", numbers)
    worst = max(c["lag_s"] for c in changes.values())
    return Verdict.ok(NAME, f"{len(changes)} id change(s) shown, slowest after {worst:.2f}s", numbers)
