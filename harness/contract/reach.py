"""When a router's probes of an engine could not be seen, or seen as the router saw them, from the engine.

Outside these windows every probe the router sends reaches the engine and is in its records, answered as
the router sees it answered. Inside them:
- DOWN: the engine is unreachable (its process down or cut off): every probe the router sends then fails
  without reaching it. The router probes on a schedule, so a long stretch holds at least a known number of
  such failures (the contract's detection bound) and at most another.
- MURKY: probes may reach it late, be cut on the way back or be answered after the router gave up (a slow
  or broken link, a process just resumed): what the engine saw of a probe says nothing sure of what the
  router saw, and any number of failures may be hidden.
- LOSSY: every probe reaches the engine and its record says how long it took (a wedged or slowed health
  surface: the engine answers late, or is cut), so a probe it recorded is judged as it is; but one still
  hanging when the run ends leaves no record, so failures may be hidden.

Windows are built from the faults the harness carried out (the ledger's own records), never from the
engine's word about itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.contract.settings import RouterContract
from harness.history import FaultView, History

DOWN = "down"
MURKY = "murky"
LOSSY = "lossy"

# Slack after a window for a probe answered just as it closed (the two clocks of a real run, a hop).
EDGE_S = 0.1

_SERVING_LINKS = (None, "serve")
_HEALTH_SURFACES = (None, "all", "health")
# Faults that take the process away (or its listeners) until they are healed: probes are refused.
_PROCESS_DOWN = ("crash", "restart", "slow_start", "start_engine")
# Faults that never touch what a probe sees.
_NEUTRAL = (
    "patch_worker", "add_worker", "remove_worker", "heal", "respawn", "no_engine_id", "fail_server_info",
    "fail_requests", "heal_link",
)


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    kind: str  # DOWN | MURKY
    why: str

    def hidden(self, contract: RouterContract) -> tuple[int, int]:
        """How many failed probes the router may have sent in it that the engine never saw (at least, at
        most). At least counts only for DOWN windows: probes go out at least every interval plus a probe
        timeout (a probe that hangs holds the next one back), the first and last may fall outside."""
        length = max(0.0, self.end - self.start)
        most = math.ceil(length / contract.interval_s) + 3
        if self.kind != DOWN:
            return 0, most
        least = max(0, math.floor(length / (contract.interval_s + contract.probe_timeout_s)) - 1)
        return min(least, most), most


def exited_after(history: History, fault: FaultView) -> float | None:
    """How long after a graceful stop its process ended, as the harness saw it end (None: not seen)."""
    for r in history.records:
        if r.get("type") == "note" and r.get("fault") == fault.fault and "exited_after_s" in r:
            value = r.get("exited_after_s")
            return float(value) if isinstance(value, int | float) else None
    return None


def fault_windows(fault: FaultView, history: History, contract: RouterContract) -> list[Window]:
    """The windows one fault opens on its target's probes (none for a fault that cannot touch them)."""
    if fault.applied_t is None:
        return []
    kind = (fault.kind or "").split(":")[-1]
    start, end = fault.window(history.end_t)
    params = fault.params
    why = f"{fault.fault} ({kind})"
    edge = Window(end, end + contract.probe_timeout_s + EDGE_S, MURKY, f"{why}: just healed")
    if kind in _NEUTRAL:
        return []
    if kind in _PROCESS_DOWN:
        return [Window(start, end, DOWN, why), edge]
    if kind == "graceful_stop" or kind == "die":
        # It answers its probes itself (unhealthy) until the process ends, or refuses them, then it is gone.
        if kind == "die":
            after = float(params.get("exit_after_s") or 0.0)
        else:
            # It ends when its drain does, at most at the SIGKILL after its grace.
            after = exited_after(history, fault)
            after = float(params.get("grace_s") or 0.0) if after is None else after
        exit_at = min(start + after, end)
        out = [Window(exit_at, end, DOWN, why), edge] if exit_at < end else [edge]
        if kind == "graceful_stop" and exit_at > start:
            # Draining, its server stops taking connections as it likes: a probe may be refused unseen, or
            # an answer written as the listener closed may never reach the router.
            out.append(Window(start, exit_at, MURKY, f"{why}: draining"))
        return out
    if kind.startswith("link_"):
        if params.get("link") not in _SERVING_LINKS:
            return []
        hard = kind in ("link_down", "link_timeout")
        return [Window(start, end, DOWN if hard else MURKY, why), edge]
    if kind == "wedge":
        if params.get("mode") == "sigstop":
            # Frozen: probes hang, then the ones still queued are answered once it resumes.
            return [Window(start, end, DOWN, why), edge]
        if params.get("surface", "all") in _HEALTH_SURFACES:
            return [Window(start, end, LOSSY, why)]
        return []
    if kind == "latency":
        if params.get("surface", "all") in _HEALTH_SURFACES:
            return [Window(start, end, LOSSY, why)]
        return []
    # A fault this model does not know: nothing sure of the probes in its time.
    return [Window(start, end, MURKY, why), edge]


def router_pauses(history: History) -> list[tuple[float, float]]:
    """When the harness had the router's process stopped (`PauseRouter`): [stopped, resumed]."""
    return [f.window(history.end_t) for f in history.fault_list()
            if f.kind == "pause_router" and f.applied_t is not None]


def paused_within(history: History, start: float, end: float) -> float:
    """How long the router's process was stopped within [start, end]: time a request could not use."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in router_pauses(history))


def pause_windows(history: History, contract: RouterContract, after_s: float) -> list[Window]:
    """A paused router's view of every engine: whatever it had on the way when it stopped (a probe begun up
    to a probe timeout before) and whatever it takes up as it resumes may be judged late or failed by it
    however the engine answered, until `after_s` past the resume."""
    return [Window(start - contract.probe_timeout_s, end + after_s, MURKY, "router paused")
            for start, end in router_pauses(history)]


def probe_windows(history: History, engine: str, contract: RouterContract,
                  before_start: bool = True) -> list[Window]:
    """Every window on `engine`'s probes, merged where they overlap (DOWN only where all merged are).
    `before_start`: with the window before it first served."""
    out: list[Window] = pause_windows(history, contract, contract.probe_timeout_s + EDGE_S)
    states = history.engines.get(engine, [])
    first = next((s.t for s in states if s.serving is not False), None)
    if before_start:
        # Before it first served (loading, started late) a probe of it failed unseen.
        until = (first if first is not None else history.end_t) + EDGE_S
        out.append(Window(0.0, until, MURKY, "not started"))
    for f in history.fault_list():
        if f.target == engine:
            out.extend(fault_windows(f, history, contract))
    return merge(out)


_GENERATE_SURFACES = (None, "all", "generate")
_HOLDING_LINKS = ("link_timeout", "link_latency", "link_bandwidth", "link_flap")


def leg_windows(history: History, engine: str, contract: RouterContract) -> list[Window]:
    """When what the engine recorded of a leg may not be what the router saw of it: the probe windows (the
    engine or its link down or bent), and a stalled generate surface (a leg the router gave up on may still
    end well on the engine's side). An engine's added latency is no such window: the router sees each slow
    answer, or gives up at its request timeout (`breaker_contract.router_end`)."""
    # No leg goes to an engine before it first served: the router sends one only to a worker whose probe it
    # answered (a leg sent to a worker not yet Ready is the status contract's to judge).
    out = [*probe_windows(history, engine, contract, before_start=False),
           *pause_windows(history, contract, contract.request_timeout_s)]
    for f in history.fault_list():
        kind = (f.kind or "").split(":")[-1]
        if f.target != engine or f.applied_t is None:
            continue
        surface = f.params.get("surface", "all")
        stalls_generate = kind == "wedge" and surface in _GENERATE_SURFACES
        # A leg sent into a link that holds it (no answer, a slow one) fails when its request timeout runs
        # out, after the link healed: the router counts that failure then.
        holds_legs = kind in _HOLDING_LINKS and f.params.get("link") in _SERVING_LINKS
        if stalls_generate or holds_legs:
            start, end = f.window(history.end_t)
            out.append(Window(start, end + contract.request_timeout_s, MURKY, f"{f.fault} ({kind})"))
    return merge(out)


def merge(windows: list[Window]) -> list[Window]:
    """Overlapping windows as one: of their kind when they all are, else MURKY (a DOWN window's lower bound
    would not hold across a stretch where probes may have got through)."""
    out: list[Window] = []
    for w in sorted(windows, key=lambda w: (w.start, w.end)):
        if w.end <= w.start:
            continue
        if out and w.start < out[-1].end:
            last = out.pop()
            kind = last.kind if last.kind == w.kind else MURKY
            out.append(Window(last.start, max(last.end, w.end), kind, f"{last.why}; {w.why}"))
            continue
        out.append(w)
    return out
