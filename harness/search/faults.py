"""The faults a search may put in a schedule, as data (`FaultSpec`), and how one becomes timeline steps.

Every kind here exists in both worlds and is driven through the same actions as a hand-written scenario:
process faults (restart with a new id, slow start, crash + respawn, death + respawn, graceful stop +
respawn, SIGSTOP freeze + heal), the engines' control faults (a wedged surface, failed GetServerInfo, no
engine id, failed requests, added latency), link faults (partition, latency, reset, bandwidth, flapping),
worker API calls (an update, a mistake) and a pause of the router's process.
Each fault heals itself (a restart) or gets a heal step at its end, so a schedule never leaves a fault on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.scenario import (
    AddWorker,
    At,
    Crash,
    Die,
    EngineFault,
    GracefulStop,
    Heal,
    HealLink,
    LinkBandwidth,
    LinkFlap,
    LinkLatency,
    LinkReset,
    Partition,
    PatchWorker,
    PauseRouter,
    Respawn,
    Restart,
    SlowStart,
    Step,
    Wedge,
)

# Faults of the engine process or its control API: a process fault excludes every other engine fault at once
# (a control fault cannot be applied to a crashed engine, and a restart would silently end a wedge the
# schedule still plans to heal); control faults of different kinds may overlap (`FaultSpec.conflicts_with`).
PROCESS_KINDS: tuple[str, ...] = (
    "restart", "process_restart", "slow_start", "crash", "die", "graceful_stop", "freeze",
)
CONTROL_KINDS: tuple[str, ...] = (
    "wedge", "fail_server_info", "no_engine_id", "fail_requests", "latency_fault",
)
ENGINE_KINDS: tuple[str, ...] = PROCESS_KINDS + CONTROL_KINDS
# Faults on one link of an engine: at most one at a time per link (a heal ends every fault on the link).
LINK_KINDS: tuple[str, ...] = (
    "partition_down", "partition_timeout", "link_latency", "link_reset", "link_bandwidth", "link_flap",
)
# Calls to the router's worker API (a property update of the engine's worker, or a call a client got wrong):
# instant, nothing to heal, on a lane of their own (the router's record of the worker, not the engine).
API_KINDS: tuple[str, ...] = ("patch_worker", "api_mistake")
# The mistakes an `api_mistake` makes: (the call, the field at fault, the wrong fields). Each is wrong for any
# worker of any role, connector and transport, so every correct router refuses it (CONTRACTS §2).
API_MISTAKES: dict[str, tuple[str, str, Mapping[str, Any]]] = {
    "patch_priority": ("patch", "priority", {"priority": "high"}),
    "patch_labels": ("patch", "labels", {"labels": {"tier": 1}}),
    "patch_connector": ("patch", "connector", {"connector": "nixl"}),
    "add_url": ("add", "url", {"url": "http://127.0.0.1:99999"}),
    "add_url_path": ("add", "url", {"url": "http://127.0.0.1:8000/v1"}),
    "add_bootstrap_port": ("add", "bootstrap_port", {"bootstrap_port": 70000}),
    "add_url_scheme": ("add", "url", {"url": "ftp://127.0.0.1:8000"}),
    "add_url_host": ("add", "url", {"url": "http://:8000"}),
    # A registered engine again, under another spelling of its url: one engine, one worker.
    "add_again": ("add", "url", {"url": "{url}/"}),
}
# The router's process stopped (SIGSTOP) and resumed after the fault's length: on a lane of its own (target
# `ROUTER`); it ends by itself, and the timeline waits for it as for a restart.
ROUTER_KINDS: tuple[str, ...] = ("pause_router",)
KINDS: tuple[str, ...] = ENGINE_KINDS + LINK_KINDS + API_KINDS + ROUTER_KINDS
# Kinds that give the engine a new engine id (a re-read is due; stale ids are excused for a while).
NEW_ID_KINDS: tuple[str, ...] = ("restart", "process_restart", "slow_start", "crash", "die", "graceful_stop")
# Kinds whose end is not a heal step: the action itself brings the engine back (or, for an API call, there is
# nothing to undo).
SELF_HEALING: tuple[str, ...] = ("restart", "process_restart", "slow_start", *API_KINDS, *ROUTER_KINDS)
# Kinds that take the engine's serving path down (refused or gone) while they last.
DOWN_KINDS: tuple[str, ...] = ("crash", "die", "graceful_stop", "partition_down")
# Kinds that may hold a request or a probe without an answer (a wait, not a refusal).
HOLDING_KINDS: tuple[str, ...] = (
    "freeze", "wedge", "latency_fault", "partition_timeout", "link_latency", "link_bandwidth", "pause_router",
)
# Gap kept after a healed fault before the next on its engine (or link): the heal/respawn is done first.
SAME_TARGET_GAP_S = 0.3
# A graceful stop's grace: half its outage (the process is gone before its respawn), or, with `long_grace`,
# longer than any outage drawn (as an orchestrator's termination grace: the engine exits once drained).
LONG_GRACE_S = 3.0


def stop_grace_s(f: FaultSpec) -> float:
    """How long a graceful stop lets its engine drain."""
    return LONG_GRACE_S if f.param.get("long_grace") else round(f.length_s / 2, 3)


@dataclass(frozen=True)
class FaultSpec:
    """One fault: `kind` on `target` (an engine; `link` for link faults) from `start_s` for `length_s`
    (timeline seconds at scaled settings; a settings preset scales them like any scenario's times)."""

    kind: str
    target: str
    start_s: float
    length_s: float
    link: str | None = None
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def end_s(self) -> float:
        return self.start_s + self.length_s

    @property
    def param(self) -> Mapping[str, Any]:
        return dict(self.params)

    @property
    def lane(self) -> tuple[str, str]:
        """What the fault occupies: the engine (engine faults), one of its links, or its router record (API
        calls)."""
        if self.kind in API_KINDS:
            return (self.target, "api")
        if self.kind in CONTROL_KINDS:
            return (self.target, f"control:{self.kind}")
        return (self.target, self.link or "engine")

    def conflicts_with(self, lane: tuple[str, str]) -> bool:
        """Whether the fault may not be on while another one holds `lane`: its own lane; and an engine's
        process and its control faults exclude each other (a crashed engine takes no control fault, and a
        restart would silently end one the schedule still plans to heal). Control faults of different
        kinds may overlap: each has its own heal (`Heal(engine, kind)`), as in the shipped
        engine_without_id (no id while health is slow)."""
        if lane == self.lane:
            return True
        if lane[0] != self.target:
            return False
        mine, theirs = self.lane[1], lane[1]
        return (mine == "engine" and theirs.startswith("control:")) or (
            theirs == "engine" and mine.startswith("control:"))

    def label(self) -> str:
        where = f"{self.target}.{self.link}" if self.link else self.target
        return f"{self.kind}@{where}[{self.start_s:g}+{self.length_s:g}]"


def without_conflicts(faults: Iterable[FaultSpec]) -> tuple[FaultSpec, ...]:
    """The faults in start order, dropping any that would overlap an earlier one it conflicts with
    (`FaultSpec.conflicts_with`: the same lane, or an engine's process and control faults) or start within
    SAME_TARGET_GAP_S of its end. Deterministic, so a shrunk draw maps to the same
    schedule."""
    kept: list[FaultSpec] = []
    # lane -> when the next fault on it may start
    free_at: dict[tuple[str, str], float] = {}
    for f in sorted(faults, key=lambda f: (f.start_s, f.target, f.link or "", f.kind)):
        if any(f.conflicts_with(lane) and f.start_s < free for lane, free in free_at.items()):
            continue
        kept.append(f)
        # A self-healing fault is over when its step is done (the timeline waits for it): the next may start
        # at once, e.g. a failing metadata read right as a restarted engine comes back.
        gap = 0.0 if f.kind in SELF_HEALING else SAME_TARGET_GAP_S
        free_at[f.lane] = max(f.end_s + gap, free_at.get(f.lane, 0.0))
    return tuple(kept)


def _apply_action(f: FaultSpec) -> Any:
    p, t, length = f.param, f.target, f.length_s
    if f.kind == "restart":
        return Restart(t, down_s=length)
    if f.kind == "process_restart":
        return Restart(t, down_s=length, mode="process")
    if f.kind == "slow_start":
        return SlowStart(t, refuse_s=length)
    if f.kind == "crash":
        return Crash(t)
    if f.kind == "die":
        # Exits within the outage, so the respawn finds the process gone.
        return Die(t, exit_after_s=round(length / 2, 3))
    if f.kind == "graceful_stop":
        return GracefulStop(t, grace_s=stop_grace_s(f))
    if f.kind == "freeze":
        return Wedge(t, mode="sigstop")
    if f.kind == "wedge":
        return Wedge(t, str(p.get("surface", "all")))
    if f.kind in ("fail_server_info", "no_engine_id"):
        return EngineFault(t, f.kind)
    if f.kind == "patch_worker":
        # What an operator changes on a live worker (the shipped property_update_keeps_handoff's update):
        # labels and priority, never the KV transfer config, which must survive the update.
        return PatchWorker(t, {"labels": {"tier": str(p.get("tier", "gold"))},
                               "priority": int(p.get("priority", 1))})
    if f.kind == "pause_router":
        return PauseRouter(length)
    if f.kind == "api_mistake":
        call, field, wrong = API_MISTAKES[str(p.get("mistake", "patch_priority"))]
        return (PatchWorker(t, wrong, refused=field) if call == "patch"
                else AddWorker(t, mistake=wrong, refused=field))
    if f.kind == "fail_requests":
        return EngineFault(t, "fail_requests", {"count": int(p.get("count", 1)),
                                                "status": int(p.get("status", 500))})
    if f.kind == "latency_fault":
        return EngineFault(t, "latency", {"surface": str(p.get("surface", "all")),
                                          "ms": int(p.get("ms", 100))})
    link = f.link or "serve"
    if f.kind == "partition_down":
        return Partition(t, link, "down")
    if f.kind == "partition_timeout":
        return Partition(t, link, "timeout")
    if f.kind == "link_latency":
        return LinkLatency(t, link, latency_ms=int(p.get("ms", 100)))
    if f.kind == "link_reset":
        return LinkReset(t, link, timeout_ms=int(p.get("ms", 0)))
    if f.kind == "link_bandwidth":
        return LinkBandwidth(t, link, rate_kb_s=int(p.get("kb_s", 64)))
    if f.kind == "link_flap":
        cycles = int(p.get("cycles", 2))
        half = round(length / (2 * cycles), 3)
        return LinkFlap(t, link, down_s=half, up_s=half, cycles=cycles)
    raise ValueError(f"unknown fault kind {f.kind!r}")


def _heal_action(f: FaultSpec) -> Any | None:
    if f.kind in SELF_HEALING:
        return None
    if f.kind in ("crash", "die", "graceful_stop"):
        return Respawn(f.target)
    if f.kind == "freeze":
        return Heal(f.target)
    if f.kind == "wedge":
        return Heal(f.target, "wedge")
    if f.kind in ("fail_server_info", "no_engine_id", "fail_requests"):
        return Heal(f.target, f.kind)
    if f.kind == "latency_fault":
        return Heal(f.target, "latency")
    return HealLink(f.target, f.link)


# What carrying out a step costs the timeline in simulated time (steps fire one after another, so a restart
# holds back every later step for its down time): a restart or slow start lasts its outage, a process
# restart and a respawn start a process (0.5 s), a wedge is verified for 0.3 s. Real time takes longer to
# spawn a process; the expectations keep a margin (`harness.search.expect.SLACK_S`).
SPAWN_S = 0.5
VERIFY_WEDGE_S = 0.3
ACTION_EPSILON_S = 0.02


def _apply_cost(f: FaultSpec) -> float:
    if f.kind in ("restart", "slow_start", "pause_router"):
        return f.length_s + ACTION_EPSILON_S
    if f.kind == "process_restart":
        return f.length_s + SPAWN_S
    if f.kind in ("freeze", "wedge"):
        return VERIFY_WEDGE_S
    return 0.0


def _heal_cost(f: FaultSpec) -> float:
    return SPAWN_S if f.kind in ("crash", "die", "graceful_stop") else 0.0


def effective_windows(faults: Sequence[FaultSpec]) -> list[tuple[float, float]]:
    """(applied, healed) of each fault as the timeline carries the schedule out in simulated time: a step
    fires at its time or when the step before it is done, whichever is later."""
    events: list[tuple[float, int, int]] = []
    for i, f in enumerate(faults):
        events.append((f.start_s, 1, i))
        if f.kind not in SELF_HEALING:
            events.append((f.end_s, 0, i))
    events.sort()
    free = 0.0
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for at, is_apply, i in events:
        fire = max(at, free)
        f = faults[i]
        if is_apply:
            starts[i] = fire
            free = fire + _apply_cost(f)
            if f.kind in SELF_HEALING:
                ends[i] = free
        else:
            free = fire + _heal_cost(f)
            ends[i] = free
    return [(round(starts[i], 3), round(max(ends[i], starts[i]), 3)) for i in range(len(faults))]


def step_name(index: int, f: FaultSpec) -> str:
    """The fault's step name, which is also its fault id in the history."""
    return f"f{index}_{f.kind}"


def to_steps(faults: Iterable[FaultSpec]) -> tuple[Step, ...]:
    """Timeline steps of a schedule: each fault's action at its start and its heal at its end, in time order
    (a timeline fires its steps in order)."""
    timed: list[tuple[float, int, int, Step]] = []
    for i, f in enumerate(faults):
        name = step_name(i, f)
        timed.append((f.start_s, 1, i, Step(name, _apply_action(f), At(round(f.start_s, 3)))))
        heal = _heal_action(f)
        if heal is not None:
            timed.append((f.end_s, 0, i, Step(f"{name}_heal", heal, At(round(f.end_s, 3)))))
    # At equal times heals go first: an engine is back before the next fault on it begins.
    timed.sort(key=lambda x: (x[0], x[1], x[2]))
    return tuple(s for *_, s in timed)
