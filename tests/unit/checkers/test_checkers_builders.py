"""Builders of synthetic histories for checker and report tests (no tests here; imported by test modules)."""

from __future__ import annotations

import os
from typing import Any

from harness.history import History
from harness.history_writer import HistoryRecorder, ManualClock

WALL0 = 1_000.0


class _At:
    """`hb.at(t).<recorder method>(...)` queues that call to happen at time t."""

    def __init__(self, hb: HB, t: float) -> None:
        self._hb = hb
        self._t = t

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            self._hb.queue.append((self._t, len(self._hb.queue), name, args, kwargs))

        return call


class HB:
    """History builder: records through the real HistoryRecorder on a manual clock.

    Calls are queued with their time and written in time order on `flush()` (done by `history()`), so a
    builder can describe overlapping activities in any order.
    """

    def __init__(
        self,
        settings: dict[str, Any] | None = None,
        path: str | os.PathLike[str] | None = None,
        started: bool = True,
        scenario: str = "restart",
    ) -> None:
        self.clock = ManualClock()
        self.rec = HistoryRecorder(path, self.clock, wall_clock=lambda: WALL0)
        self.seq = 0
        self.queue: list[tuple[float, int, str, tuple[Any, ...], dict[str, Any]]] = []
        if started:
            self.at(0.0).run_started(scenario, "1p1d", "mooncake", "http", "reference", 7, settings or {})

    def at(self, t: float) -> Any:
        return _At(self, t)

    def flush(self) -> HistoryRecorder:
        for t, _n, name, args, kwargs in sorted(self.queue, key=lambda q: (q[0], q[1])):
            self.clock.set(t)
            getattr(self.rec, name)(*args, **kwargs)
        self.queue.clear()
        return self.rec

    def engine(self, t: float, name: str, engine_id: str, role: str, url: str | None = None) -> None:
        self.at(t).engine_state(name, engine_id, 1, 4000, role=role, url=url)

    def status(self, t: float, worker: str, status: str, url: str, role: str = "prefill") -> None:
        self.at(t).router_status(worker, url, role, status, None)

    def fault(self, fid: str, kind: str, target: str, applied: float, healed: float | None = None) -> None:
        self.at(applied).fault_applied(fid, kind, target, {}, {})
        self.at(applied).fault_verified(fid, True, "checked")
        if healed is not None:
            self.at(healed).fault_healed(fid, kind, target)

    def heal(self, fid: str, kind: str, target: str, t: float) -> None:
        self.at(t).fault_healed(fid, kind, target)

    def probe(self, t: float, worker: str, ok: bool = True) -> None:
        self.at(t).router_event(
            {"type": "probe", "worker": worker, "url": f"http://{worker}", "ok": ok, "ts": WALL0 + t}
        )

    def handoff(
        self,
        t: float,
        engine: str,
        kind: str,
        tag: str,
        outcome: str,
        engine_id: str,
        remote_engine_id: str | None = None,
        kv_digest: str | None = "pd",
        prompt_digest: str = "pd",
        duration_s: float = 0.01,
    ) -> None:
        self.at(t).handoff(
            {
                "ts": WALL0 + t,
                "engine": engine,
                "engine_id": engine_id,
                "generation": 1,
                "role": kind,
                "kind": kind,
                "request_id": f"r-{tag}",
                "tag": tag,
                "connector": "mooncake",
                "transfer_id": f"x-{tag}",
                "remote_engine_id": remote_engine_id,
                "remote_request_id": None,
                "prompt_digest": prompt_digest,
                "kv_digest": kv_digest if kind == "decode" else None,
                "outcome": outcome,
                "error": None,
                "duration_s": duration_s,
                "output_digest": "o",
            }
        )

    def request(
        self,
        t: float,
        latency: float,
        status: int = 200,
        text_ok: bool | None = True,
        deadline: float = 5.0,
        timed_out: bool = False,
        complete: bool = True,
        body_problem: str | None = None,
        mistake: str | None = None,
    ) -> str:
        """One request (invoked at t, completed at t + latency); returns its tag. `mistake`: the client's
        mistake it carries (the workload's `mistake_fraction`)."""
        self.seq += 1
        tag = f"[pdchaos:run:{self.seq}]"
        self.at(t).request_invoked(self.seq, tag, deadline_s=deadline, prompt_chars=40,
                                   **({"mistake": mistake} if mistake else {}))
        if complete:
            self.at(t + latency).request_completed(
                self.seq,
                tag,
                status=status,
                ok=200 <= status < 300 and not timed_out,
                latency_s=latency,
                text_ok=text_ok if 200 <= status < 300 else None,
                timed_out=timed_out,
                error=None if status == 200 else f"status {status}",
                **({"body_problem": body_problem} if body_problem else {}),
            )
        return tag

    def pd_request(
        self,
        t: float,
        prefill_id: str,
        told_id: str | None = None,
        outcome: str = "pulled",
        kv_digest: str | None = "pd",
        status: int = 200,
        latency: float = 0.05,
        text_ok: bool | None = True,
        prefill: str = "prefill-0",
    ) -> str:
        """A disaggregated request: prefill computed, decode pulled (or not), client answered."""
        tag = self.request(t, latency, status=status, text_ok=text_ok)
        self.handoff(t + 0.01, prefill, "prefill", tag, "computed", prefill_id)
        told = prefill_id if told_id is None else told_id
        self.handoff(t + 0.02, "decode-0", "decode", tag, outcome, "D", told, kv_digest)
        return tag

    def end(self, t: float, reason: str = "done") -> None:
        self.at(t).run_ended(reason)

    def history(self) -> History:
        return self.flush().history()


def restart_run(
    *,
    stale_after: bool = False,
    recompute_after: bool = False,
    never_ready: bool = False,
    unnoticed: bool = False,
    end_t: float = 8.0,
    heal_t: float = 2.5,
    ended: bool = True,
    path: str | os.PathLike[str] | None = None,
    settings: dict[str, Any] | None = None,
    scenario: str = "restart",
) -> HB:
    """A prefill restart on the same address: id A -> B, traffic before, during (503) and after.

    `stale_after`: the router keeps telling the decode id A (bug #1/#13); `recompute_after`: the decode
    recomputes (bug #3); `never_ready`: the router never sees the prefill Ready again (bug #6);
    `unnoticed`: the outage is shorter than the router's probes can see (the worker stays Ready).
    """
    hb = HB(settings=settings or {"engines": {"transfer_timeout_s": 3.0}}, path=path, scenario=scenario)
    hb.engine(0.0, "prefill-0", "A", "prefill", "http://p0")
    hb.engine(0.0, "decode-0", "D", "decode", "http://d0")
    hb.status(0.0, "w-p0", "ready", "http://p0")
    hb.status(0.0, "w-d0", "ready", "http://d0", role="decode")
    t = 0.1
    while t < 2.0:
        hb.pd_request(t, "A")
        t += 0.25
    hb.fault("f1", "restart", "prefill-0", applied=2.0)
    if not unnoticed:
        hb.status(2.2, "w-p0", "not_ready", "http://p0")
    t = 2.25
    while t < 3.0:
        hb.request(t, 0.01, status=503)
        t += 0.2
    hb.heal("f1", "restart", "prefill-0", heal_t)
    hb.engine(heal_t, "prefill-0", "B", "prefill", "http://p0")
    if not never_ready and not unnoticed:
        hb.status(3.0, "w-p0", "ready", "http://p0")
    t = 3.1
    while t < end_t - 0.5:
        if never_ready:
            hb.request(t, 0.01, status=503)
        elif stale_after:
            hb.pd_request(t, "B", told_id="A", outcome="timed_out", status=500, latency=0.3, text_ok=None)
        elif recompute_after:
            hb.pd_request(t, "B", told_id="", outcome="recomputed", kv_digest=None)
        else:
            hb.pd_request(t, "B")
        t += 0.25
    if ended:
        hb.end(end_t)
    return hb
