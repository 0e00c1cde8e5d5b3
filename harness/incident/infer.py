"""From a bundle's facts to a replay plan. Pure: facts in, plan out.

The rules, in the order they apply:
- Gateway and release: its log (target, banner version) or `[gateway] release`.
- Workers: the gateway's start line or command line (prefill URLs with their Mooncake bootstrap ports,
  decode URLs), else the engines' own start lines, else `[[engine]]`. Names: an engine's own name (the
  fakes log it), else `prefill-N` / `decode-N` in the gateway's order.
- Transport: the workers' URL scheme. Connector: the engines' start lines, the gateway's (a bootstrap port
  means Mooncake, `None` NIXL), else Mooncake (named default).
- Settings: the gateway's flags (command line or `incident.toml`), else the gateway's own defaults; the KV
  transfer timeout from the engines' start lines or `[engines]`, else vLLM's 480 s.
- Faults, each at its own time: the engines' fault lines; a second start of an engine (a restart: a new pid is
  a process restart); Kubernetes Killing/Started/OOMKilled; `[[event]]` entries (they win over an inferred
  fault of the same engine within 2 s); failed probes of a worker with no engine evidence (a crash, respawned
  when the gateway sees it Ready again).
- Load: it begins at the first client request (its end minus its latency) and lasts to the last; the number
  of clients from the request rate and latency before the first fault; the chat share from the paths.
- Symptom, each with its checker: requests that waited out the transfer timeout (`transfer_timeout`, and
  `handoff` after a Mooncake prefill restart; `handoff` alone after one no probe saw, as a correct router
  also mints the old id until its identity check); a leg outage answered 404 or 500 (`prompt_503`);
  failures to the end of the log after the last fault (`recovery`); failures after a fault that stopped
  (`availability`); slow successes during a fault (`latency`). `[symptom] clients_saw` adds its own.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from typing import Any
from urllib.parse import urlparse

from harness.incident.bundle import Bundle
from harness.incident.facts import Fact, IncidentError, epoch, parse_offset
from harness.incident.plan import Plan, PlanFault, PlanSymptom

# The gateways' own defaults for what their flags set (smg's; vllm-router shares its lineage).
GATEWAY_DEFAULTS: dict[str, float | int | None] = {
    "health_interval_s": 60.0,
    "health_timeout_s": 5.0,
    "failure_threshold": 3,
    "success_threshold": 2,
    "request_timeout_s": 1800.0,
    "circuit_breaker_failures": 10,
    "circuit_breaker_open_s": 60.0,
}
VLLM_TRANSFER_TIMEOUT_S = 480.0
# A timeline event replaces an inferred fault of the same engine this close to it.
SAME_FAULT_S = 2.0
# A request "waited out" the transfer timeout at this share of it (log times are whole seconds).
WAIT_SHARE = 0.9
SCALED_PROBE_S = 1.0  # the probe interval a real-time replay runs at (smg takes whole seconds)
THINK_S = 0.02
# Where another worker of the role could serve: 9 in 10 requests during a fault must succeed.
DURING_SHARE = 0.9
INT_SETTINGS = ("failure_threshold", "success_threshold", "circuit_breaker_failures")


def _address(url: str) -> tuple[str | None, int]:
    try:
        u = urlparse(url if "://" in url else f"http://{url}")
        return u.hostname, u.port or 0
    except ValueError:
        return None, 0


_Address = tuple[str | None, int]


class _Engines:
    """Names, roles and the addresses each engine is known by: (host, port) from a URL, (None, port) from a
    fake engine's own ports (its host is the bundle's loopback)."""

    def __init__(self) -> None:
        self.role: dict[str, str] = {}
        self.addresses: dict[str, set[_Address]] = defaultdict(set)
        self.order: list[str] = []

    def add(self, name: str, role: str, addresses: list[_Address]) -> None:
        if name not in self.role:
            self.order.append(name)
            self.role[name] = role
        self.addresses[name].update(a for a in addresses if a[1])

    def by_port(self, port: int | None, host: str | None = None) -> str | None:
        exact = next((n for n, a in self.addresses.items() if (host, port) in a), None)
        return exact or next((n for n, a in self.addresses.items() if (None, port) in a), None)

    def by_url(self, url: str) -> str | None:
        host, port = _address(url)
        return self.by_port(port, host)

    def of_role(self, role: str) -> list[str]:
        return [n for n in self.order if self.role[n] == role]


def _first(facts: list[Fact], kind: str) -> Fact | None:
    return next((f for f in facts if f.kind == kind), None)


def _gateway(b: Bundle, plan: Plan) -> None:
    if f := _first(b.facts, "release"):
        plan.release = f.data["release"]
        plan.gateway = plan.release.split("==")[0]
        plan.cite("release", f.cite)
        return
    gws = [f for f in b.of("gateway") if f.t is not None] or b.of("gateway")
    if gws:
        plan.gateway = gws[0].data["gateway"]
        plan.cite("gateway", gws[0].cite)
    if (v := _first(b.facts, "version")) and plan.gateway:
        plan.release = f"{plan.gateway}=={v.data['version']}"
        plan.cite("release", v.cite)


def _workers(b: Bundle, plan: Plan) -> _Engines:
    eng = _Engines()
    starts = sorted(b.of("engine_start"), key=lambda f: (f.data.get("name") is None, f.t or 0))
    for f in starts:
        if f.data.get("name") and f.data.get("role") in ("prefill", "decode"):
            ports = [*f.data.get("ports", []), f.data.get("bootstrap_port") or 0]
            eng.add(f.data["name"], f.data["role"], [(None, p) for p in ports])
    for f in b.of("engine_named"):
        eng.add(str(f.data["name"]), str(f.data["role"]), [_address(str(f.data.get("url", "")))])
    # The gateway's log gives the URLs it used; its command line is next best.
    ws = [f for f in b.of("workers_at_start") if f.data["prefills"] or f.data["decodes"]]
    ws.sort(key=lambda f: f.t is None)
    urls: list[tuple[str, str]] = []
    if ws:
        w = ws[0]
        urls = [("prefill", u) for u, _ in w.data["prefills"]] + [("decode", u) for u in w.data["decodes"]]
        plan.cite("topology", w.cite)
        boots = [bp for _, bp in w.data["prefills"]]
        if boots and all(bp is not None for bp in boots):
            plan.cite("connector", w.cite)
            plan.connector = "mooncake"
        elif boots and all(bp is None for bp in boots):
            plan.cite("connector", w.cite)
            plan.connector = "nixl"
    counters = {"prefill": 0, "decode": 0}
    for role, url in urls:
        name = eng.by_url(url)
        if name is None:
            name = f"{role}-{counters[role]}"
            while name in eng.role:
                counters[role] += 1
                name = f"{role}-{counters[role]}"
            eng.add(name, role, [_address(url)])
        counters[role] += 1
    _unnamed_engines(b, eng, starts)
    if urls:
        scheme = urlparse(urls[0][1]).scheme
        plan.transport = "grpc" if scheme == "grpc" else "http"
        plan.cite("transport", plan.sources["topology"])
    elif t := _first(b.facts, "transport"):
        plan.transport = t.data["transport"]
        plan.cite("transport", t.cite)
    else:
        plan.default("transport", "http (no worker URL in the bundle)")
    if not urls and eng.order:
        plan.cite("topology", next(f.cite for f in starts + b.of("engine_named")))
    plan.prefills, plan.decodes = eng.of_role("prefill"), eng.of_role("decode")
    if not plan.prefills or not plan.decodes:
        raise IncidentError(
            "the bundle names no prefill and decode workers: add the gateway's log or command line, the "
            "engines' logs, or [[engine]] entries in incident.toml"
        )
    connectors = [
        f
        for f in b.facts
        if f.kind in ("engine_start", "engine_kv", "connector")
        and f.data.get("connector") in ("mooncake", "nixl")
    ]
    if connectors and "connector" not in plan.sources:
        plan.connector = connectors[0].data["connector"]
        plan.cite("connector", connectors[0].cite)
    elif "connector" not in plan.sources:
        plan.default("connector", "mooncake (no connector named in the bundle)")
    return eng


def _unnamed_engines(b: Bundle, eng: _Engines, starts: list[Fact]) -> None:
    """vLLM's logs name no engine: one per serving port, its role from its log's kv_role, named
    `prefill-N` / `decode-N` after the engines already known."""
    roles = {f.data["log"]: f.data["role"] for f in b.of("engine_kv") if f.data.get("role")}
    # `[[engine]] logs = [...]`: the logs of an engine the gateway knows by another address (a proxy).
    claimed = {
        str(log): str(f.data["name"]) for f in b.of("engine_named") for log in f.data.get("logs") or []
    }
    for f in starts:
        ports = f.data.get("ports") or []
        if f.data.get("name") or not ports or eng.by_port(ports[0]) is not None:
            continue
        if owner := claimed.get(str(f.data.get("log"))):
            eng.add(owner, eng.role[owner], [(None, p) for p in ports])
            continue
        role = roles.get(f.data.get("log"))
        if role not in ("prefill", "decode"):
            continue
        n = len(eng.of_role(role))
        while f"{role}-{n}" in eng.role:
            n += 1
        eng.add(f"{role}-{n}", role, [(None, p) for p in ports])


def _settings(b: Bundle, plan: Plan) -> None:
    found: dict[str, tuple[float, str]] = {}
    for f in b.of("setting"):
        for k, v in f.data.items():
            found.setdefault(k, (v, f.cite))
    for k, dv in GATEWAY_DEFAULTS.items():
        if k in found:
            v = found[k][0]
            plan.router[k] = int(v) if k in INT_SETTINGS else float(v)
            plan.cite(f"router.{k}", found[k][1])
        elif k.startswith("circuit_breaker"):
            # Unset, a gateway keeps its own breaker (the replay passes no flag for it).
            plan.router[k] = None
            plan.default(f"router.{k}", f"the gateway's own ({dv})")
        else:
            plan.router[k] = dv
            plan.default(f"router.{k}", f"{dv} ({plan.gateway or 'the gateway'}'s default)")
    if "circuit_breaker_disabled" in found:
        plan.router["circuit_breaker_failures"] = None
    tts = [
        (f.data["transfer_timeout_s"], f.cite)
        for f in b.of("engine_start")
        if f.data.get("transfer_timeout_s")
    ]
    if "transfer_timeout_s" in found:
        plan.transfer_timeout_s, src = found["transfer_timeout_s"]
        plan.cite("transfer_timeout_s", src)
    elif tts:
        plan.transfer_timeout_s = float(tts[0][0])
        plan.cite("transfer_timeout_s", tts[0][1])
    else:
        plan.default("transfer_timeout_s", f"{VLLM_TRANSFER_TIMEOUT_S:g} s (vLLM's default)")


def _fault_lines(b: Bundle, eng: _Engines) -> list[PlanFault]:
    out: list[PlanFault] = []
    for f in b.of("engine_fault"):
        name, ch, t = f.data["name"], f.data["changed"], f.t or 0.0
        if name not in eng.role:
            continue
        action = f.data["action"]
        if action in ("restart", "slow_start"):
            down = float(ch.get("down_s", ch.get("refuse_s", 0.0)) or 0.0)
            up = float((ch.get("started_at") or {}).get("new", t))
            kind, key = ("Restart", "down_s") if action == "restart" else ("SlowStart", "refuse_s")
            out.append(PlanFault(up - down, kind, name, {key: round(down, 3)}, f.cite))
        elif action == "crash":
            out.append(PlanFault(t, "Crash", name, {}, f.cite))
        elif action == "die":
            out.append(
                PlanFault(t, "Die", name, {"exit_after_s": float(ch.get("exit_after_s", 5.0))}, f.cite)
            )
        elif action == "fault":
            for kind, change in ch.items():
                new = change.get("new") if isinstance(change, dict) else change
                if new is None:
                    continue
                if kind == "wedge" and isinstance(new, list) and len(new) == 1:
                    out.append(PlanFault(t, "Wedge", name, {"surface": new[0]}, f.cite, f"wedge_{name}"))
                else:
                    params = new if isinstance(new, dict) else {}
                    out.append(PlanFault(t, "EngineFault", name, {"kind": kind, "params": params}, f.cite))
        elif action in ("clear_fault", "clear"):
            kinds = [k for k, c in ch.items() if isinstance(c, dict) and c.get("new") is None]
            for kind in kinds or [None]:
                out.append(PlanFault(t, "Heal", name, {"kind": kind}, f.cite))
    return out


def _down(f: PlanFault) -> float:
    return float(f.params.get("down_s", 0.0))


def _fault_windows(plan: Plan) -> list[tuple[str, float, float]]:
    """(engine, start, end) of each fault: a restart's down time, a wedge or crash to its heal or respawn
    (else the end of the load)."""
    end = plan.load_start + plan.duration_s
    out = []
    for f in plan.faults:
        if f.action in ("Heal", "Respawn"):
            continue
        if f.action == "Restart":
            out.append((f.target, f.at_s, f.at_s + _down(f)))
            continue
        close = next(
            (
                g.at_s
                for g in plan.faults
                if g.target == f.target and g.at_s > f.at_s and g.action in ("Heal", "Respawn")
            ),
            end,
        )
        out.append((f.target, f.at_s, close))
    return out


def allowance_s(plan: Plan) -> float:
    """How long after a fault ends the replay waits before judging what follows it: a transfer timeout,
    and the probes to take a worker out and back in, plus one."""
    r = plan.router
    interval = float(r["health_interval_s"] or 1.0)
    probes = int(r["failure_threshold"] or 1) + int(r["success_threshold"] or 1) + 1
    return round(_wait_s(plan) + interval * probes, 3)


def _wait_s(plan: Plan) -> float:
    """The longest a handoff can hold a request up: the transfer timeout. One nobody stated shapes nothing
    the logs show past their slowest request."""
    if plan.sources.get("transfer_timeout_s", "").startswith("default"):
        interval = float(plan.router["health_interval_s"] or 1.0)
        return min(plan.transfer_timeout_s, max(plan.longest_s, interval))
    return plan.transfer_timeout_s


def _restarts_from_starts(b: Bundle, eng: _Engines, covered: list[PlanFault]) -> list[PlanFault]:
    """An engine that started again with no fault line for it: a restart (a new pid: of the process)."""
    out: list[PlanFault] = []
    by_name: dict[str, list[Fact]] = defaultdict(list)
    for f in b.of("engine_start"):
        name = f.data.get("name") or eng.by_port((f.data.get("ports") or [None])[0])
        if name and f.t is not None:
            by_name[name].append(f)
    stops = b.of("engine_stop")
    for name, starts in by_name.items():
        starts.sort(key=lambda f: f.t or 0)
        for prev, cur in itertools.pairwise(starts):
            assert cur.t is not None and prev.t is not None
            # A fault line already says it: the start is the end of that restart's down time.
            if any(
                c.target == name and c.at_s - SAME_FAULT_S <= cur.t <= c.at_s + _down(c) + SAME_FAULT_S
                for c in covered
            ):
                continue
            stop = next(
                (
                    s
                    for s in stops
                    if s.t is not None and prev.t < s.t <= cur.t and s.data.get("log") == cur.data.get("log")
                ),
                None,
            )
            # A SIGKILL logs nothing: the gateway's first failure against it says when it went down.
            seen_down = _first_failure(b, eng, name, prev.t, cur.t)
            down_at = stop or seen_down
            down_from = down_at.t if down_at and down_at.t is not None else cur.t
            # vLLM cannot restart in its process: a second start of it is a new process.
            process = prev.data.get("pid") != cur.data.get("pid") or cur.data.get("source") == "vllm"
            params: dict[str, Any] = {"down_s": round(cur.t - down_from, 3)}
            if process:
                params["mode"] = "process"
            cite = f"{down_at.cite} (down), {cur.cite} (up)" if down_at else cur.cite
            out.append(PlanFault(down_from, "Restart", name, params, cite))
    return out


def _first_failure(b: Bundle, eng: _Engines, name: str, after: float, before: float) -> Fact | None:
    """The gateway's first failed probe, failed leg or NotReady of engine `name` in (after, before]."""
    fails = [
        f
        for f in b.facts
        if f.t is not None
        and after < f.t <= before
        and (
            (f.kind in ("probe_failed", "leg_error") and eng.by_url(str(f.data.get("url", ""))) == name)
            or (
                f.kind == "worker_status"
                and f.data["new"].lower() not in ("ready", "healthy")
                and eng.by_url(f.data["url"]) == name
            )
        )
    ]
    return min(fails, key=lambda f: f.t or 0.0, default=None)


def pod_engine(pod: str, eng: _Engines, named: dict[str, str]) -> str | None:
    """The engine a pod runs: `[[engine]] pod = ...`, else an engine whose name is in the pod's (a
    StatefulSet's `...-prefill-0`), else the only engine of the role the pod's name says."""
    if pod in named:
        return named[pod]
    flat = pod.replace("-", "").replace("_", "")
    hit = next((n for n in eng.order if n.replace("-", "") in flat), None)
    if hit:
        return hit
    roles = [r for r in ("prefill", "decode") if r in pod]
    if len(roles) == 1 and len(eng.of_role(roles[0])) == 1:
        return eng.of_role(roles[0])[0]
    return None


def _kube(b: Bundle, eng: _Engines, plan: Plan) -> list[PlanFault]:
    out: list[PlanFault] = []
    killed: dict[str, Fact] = {}
    named = {str(f.data["pod"]): str(f.data["name"]) for f in b.of("engine_named") if f.data.get("pod")}
    unmatched: set[str] = set()
    for f in sorted(b.of("k8s"), key=lambda f: f.t or 0):
        pod = f.data["pod"]
        name = pod_engine(pod, eng, named)
        if name is None:
            unmatched.add(pod)
            continue
        reason, t = f.data["reason"], f.t or 0.0
        if reason in ("Killing", "OOMKilled"):
            killed[name] = f
        elif reason == "Started" and name in killed:
            k = killed.pop(name)
            assert k.t is not None
            out.append(
                PlanFault(
                    k.t,
                    "Restart",
                    name,
                    {"down_s": round(t - k.t, 3), "mode": "process"},
                    f"{k.cite}, {f.cite}",
                )
            )
    for name, k in killed.items():
        assert k.t is not None
        out.append(PlanFault(k.t, "Crash", name, {}, k.cite))
    plan.skipped += [
        f"events of pod {p}: no engine matches it (name it: [[engine]] pod = ...)" for p in sorted(unmatched)
    ]
    return out


def _timeline_events(
    b: Bundle, eng: _Engines, zone_year: tuple[Any, int | None], t0_guess: float
) -> list[PlanFault]:
    zone, year = zone_year
    out: list[PlanFault] = []
    for f in b.of("event"):
        ev = f.data
        name = str(ev["engine"])
        if name not in eng.role:
            raise IncidentError(
                f"{f.cite}: engine {name!r} is not in the bundle (known: {', '.join(eng.order)})"
            )
        at = ev["at"]
        if isinstance(at, int | float):
            t = t0_guess + float(at)
        else:
            parsed = epoch(str(at), zone, year)
            if parsed is None:
                raise IncidentError(
                    f"{f.cite}: at = {at!r} is neither a time nor seconds after the load began"
                )
            t = parsed
        what = ev["what"]
        action, params, label = {
            "restart": ("Restart", {"down_s": float(ev.get("down_s", 0.0))}, ""),
            "process_restart": ("Restart", {"down_s": float(ev.get("down_s", 0.0)), "mode": "process"}, ""),
            "crash": ("Crash", {}, ""),
            "respawn": ("Respawn", {}, ""),
            "die": ("Die", {"exit_after_s": float(ev.get("exit_after_s", 5.0))}, ""),
            "stop": ("GracefulStop", {"grace_s": float(ev.get("grace_s", 5.0))}, ""),
            "freeze": ("Wedge", {"mode": "sigstop"}, f"freeze_{name}"),
            "wedge": ("Wedge", {"surface": str(ev.get("surface", "all"))}, f"wedge_{name}"),
            "heal": ("Heal", {"kind": None}, ""),
        }[what]
        out.append(PlanFault(t, action, name, params, f.cite, label))
    return out


def _probe_outages(b: Bundle, eng: _Engines, covered: list[PlanFault], end: float) -> list[PlanFault]:
    """Workers the gateway saw fail with no engine-side evidence: down from the first failed probe, back
    when it was seen Ready again (else never)."""
    out: list[PlanFault] = []
    fails: dict[str, list[Fact]] = defaultdict(list)
    for f in b.of("probe_failed"):
        if (name := eng.by_url(f.data["url"])) and f.t is not None:
            fails[name].append(f)
    for name, fs in fails.items():
        first = min(fs, key=lambda f: f.t or 0)
        assert first.t is not None
        if any(c.target == name and c.at_s - SAME_FAULT_S <= first.t for c in covered):
            continue
        back = next(
            (
                f
                for f in sorted(b.of("worker_status"), key=lambda f: f.t or 0)
                if f.t
                and f.t > first.t
                and f.data["new"].lower() in ("ready", "healthy")
                and eng.by_url(f.data["url"]) == name
            ),
            None,
        )
        out.append(PlanFault(first.t, "Crash", name, {}, first.cite))
        if back and back.t is not None:
            out.append(PlanFault(back.t, "Respawn", name, {}, back.cite))
    return out


def _merge(inferred: list[PlanFault], stated: list[PlanFault]) -> list[PlanFault]:
    keep = [
        f
        for f in inferred
        if not any(s.target == f.target and abs(s.at_s - f.at_s) <= SAME_FAULT_S for s in stated)
    ]
    return sorted(keep + stated, key=lambda f: f.at_s)


def _clients(reqs: list[Fact], start: float, first_fault: float | None) -> int:
    """Closed-loop clients from Little's law: requests per second times the time each client spends per
    request (its latency and a think time). The rate is the median of the whole seconds of the log before
    the first fault in which every request succeeded (log times are whole seconds: a window's edges would
    be off by up to one); with none, the mean over the time before the first fault."""
    before = [f for f in reqs if first_fault is None or (f.t or 0.0) < first_fault]
    if not before:
        return 3
    lat = statistics.mean(f.data["latency_s"] or 0.0 for f in before)
    by_second: dict[int, list[Fact]] = defaultdict(list)
    for f in before:
        by_second[math.floor(f.t or 0.0)].append(f)
    whole = [
        len(fs)
        for sec, fs in by_second.items()
        if sec >= start
        and (first_fault is None or sec + 1 <= first_fault)
        and all(f.data["status"] < 400 for f in fs)
    ]
    rate = statistics.median(whole) if whole else len(before) / max(1e-3, (first_fault or start + 1) - start)
    # Rounded up: a client spends time between requests that the gateway does not log.
    return max(1, min(32, math.ceil(rate * (lat + THINK_S))))


def _load(b: Bundle, plan: Plan, faults: list[PlanFault], anchor: float | None) -> list[Fact]:
    """`anchor`: where incident.toml's times in seconds count from (the load's start), if it uses any."""
    reqs = [f for f in b.of("request") if f.t is not None]
    first_fault = min((f.at_s for f in faults), default=None)
    if reqs:
        starts = [f.t - (f.data["latency_s"] or 0.0) for f in reqs if f.t is not None]
        plan.load_start = min(starts)
        first = min(reqs, key=lambda f: f.t - (f.data["latency_s"] or 0.0) if f.t else 0)
        plan.cite("load", f"{first.cite} (first request) .. {max(reqs, key=lambda f: f.t or 0).cite} (last)")
        end = max(f.t for f in reqs if f.t is not None)
        plan.concurrency = _clients(reqs, plan.load_start, first_fault)
        plan.chat_fraction = round(sum("/chat/" in f.data["path"] for f in reqs) / len(reqs), 2)
        longest = max((f.data["latency_s"] or 0.0) for f in reqs)
    else:
        times = [f.t for f in b.facts if f.t is not None] + [f.at_s for f in faults]
        lead = 2 * float(plan.router["health_interval_s"] or 1.0)
        plan.load_start = (
            anchor if anchor is not None else min((first_fault or min(times)) - lead, min(times))
        )
        end = max(times)
        plan.default(
            "load",
            f"{plan.concurrency} clients from {lead:g} s before the first fault to the last log "
            "line (the logs show no client request)",
        )
        longest = 0.0
    # Long enough to see a transfer-timeout wait, short enough that a client caught in a hang is back
    # sending before the recovery window closes.
    interval = float(plan.router["health_interval_s"] or 1.0)
    plan.longest_s = longest
    plan.deadline_s = round(max(1.5 * longest, 1.5 * plan.transfer_timeout_s, 2 * interval), 3)
    plan.duration_s = end - plan.load_start
    return reqs


def _symptoms(b: Bundle, plan: Plan, reqs: list[Fact], eng: _Engines) -> None:
    tt, interval = plan.transfer_timeout_s, float(plan.router["health_interval_s"] or 1.0)
    first_fault = min((f.at_s for f in plan.faults), default=plan.load_start)
    last_fault = max((f.at_s + _down(f) for f in plan.faults), default=first_fault)
    after = [f for f in reqs if (f.t or 0) >= first_fault]
    failed = [f for f in after if f.data["status"] >= 400]
    allowance = allowance_s(plan)

    def add(checker: str, params: dict[str, Any], why: str, cite: str) -> None:
        if all(s.checker != checker for s in plan.symptoms):
            plan.symptoms.append(PlanSymptom(checker, params, why, cite))

    waits = [f for f in after if (f.data["latency_s"] or 0.0) >= WAIT_SHARE * tt]
    kv_timeouts = [f for f in b.of("kv_timeout") if (f.t or 0) >= first_fault]
    if waits or kv_timeouts:
        ev = waits[0] if waits else kv_timeouts[0]
        n = len(waits) or len(kv_timeouts)
        restarts = [f for f in plan.faults if f.action == "Restart" and f.target in plan.prefills]
        unseen = [f for f in restarts if _down(f) < interval]
        if plan.connector == "mooncake" and unseen:
            # No probe could see this restart: a correct router learns the new id at its next identity check,
            # and a request minted before then waits too. The handoff checker's grace allows that window;
            # the transfer_timeout checker allows none, so it would blame the correct router as well.
            add(
                "handoff",
                {"grace_s": allowance},
                f"{n} request(s) waited out the {tt:g} s KV transfer timeout "
                "after a Mooncake prefill restarted between probes (a stale engine id in the handoff)",
                ev.cite,
            )
        else:
            add(
                "transfer_timeout", {}, f"{n} request(s) waited out the {tt:g} s KV transfer timeout", ev.cite
            )
            if plan.connector == "mooncake" and restarts:
                add(
                    "handoff",
                    {"grace_s": allowance},
                    "a Mooncake prefill restarted before the waits (a stale engine id in the handoff)",
                    ev.cite,
                )
    sole = {r for r, names in (("prefill", plan.prefills), ("decode", plan.decodes)) if len(names) == 1}
    # Outages long enough for the gateway to see (two probes): a shorter restart's failures are judged by
    # what follows it (recovery, handoff), not as an outage's answers.
    outage = [
        f
        for f in plan.faults
        if eng.role.get(f.target) in sole
        and (
            f.action in ("Crash", "Die")
            or (f.action == "Restart" and float(f.params.get("down_s", 0.0)) >= 2 * interval)
        )
    ]

    def started(f: Fact) -> float:
        return (f.t or 0.0) - (f.data["latency_s"] or 0.0)

    bad_answers = [
        f
        for f in failed
        if f.data["status"] in (404, 500)
        and any(
            o.at_s <= started(f) <= o.at_s + float(o.params.get("down_s", 0.0)) + interval for o in outage
        )
    ]
    if bad_answers:
        add(
            "prompt_503",
            {},
            f"{len(bad_answers)} request(s) answered {bad_answers[0].data['status']} while the "
            "sole worker of a role was down",
            bad_answers[0].cite,
        )
    end = max((f.t or 0 for f in reqs), default=0.0)
    # Refusals are not waits: what readmits a worker is its probes (a transfer timeout plays no part).
    probes_s = allowance - _wait_s(plan)
    tail = [f for f in reqs if (f.t or 0) >= max(last_fault + probes_s, end - max(probes_s, 2.0))]
    # Refused fast, not waits: the gateway had no worker to send to (a wait is the transfer-timeout symptom).
    refused = [f for f in tail if f.data["status"] >= 400 and (f.data["latency_s"] or 0.0) < WAIT_SHARE * tt]
    if tail and len(refused) > len(tail) / 2 and end > last_fault + probes_s:
        add(
            "recovery",
            {"max_recovery_s": allowance},
            f"{len(refused)} of the last {len(tail)} requests were "
            f"refused, {end - last_fault:.0f} s after the last fault: a worker never back",
            refused[0].cite,
        )
    # Failed legs the gateway logged, and failed KV loads the decodes logged (a gateway that logs no request
    # still shows its clients' failures there).
    leg_errors = [f for f in b.of("leg_error") + b.of("kv_failure") if (f.t or 0) >= first_fault]
    if (failed or leg_errors) and not any(s.checker == "recovery" for s in plan.symptoms):
        ev = (failed or leg_errors)[0]
        n = len(failed) or len(leg_errors)
        params: dict[str, Any] = {"before": 0.95, "after": 0.95, "settle_s": allowance}
        # Failures while one of several workers of a role was out: the others could have served them.
        spared = [
            w
            for w in _fault_windows(plan)
            if len(plan.decodes if eng.role.get(w[0]) == "decode" else plan.prefills) > 1
        ]
        inside = [f for f in failed + leg_errors if any(a <= (f.t or 0.0) <= z for _, a, z in spared)]
        if inside:
            params["during"] = DURING_SHARE
            ev, n = inside[0], len(inside)
        add(
            "availability",
            params,
            f"{n} request(s) or leg(s) failed after the first fault"
            + (" while another worker of the role was up" if inside else ""),
            ev.cite,
        )
    saw = _first(b.facts, "symptom")
    if saw:
        for s in saw.data["clients_saw"]:
            checker, params = {
                "hang": ("transfer_timeout", {}),
                "503": ("prompt_503", {}),
                "404": ("prompt_503", {}),
                "errors": ("availability", {"before": 0.95, "after": 0.95, "settle_s": allowance}),
                "slow": ("latency", {"max_latency_s": max(1.0, 3 * interval)}),
                "never_back": ("recovery", {"max_recovery_s": allowance}),
            }[s]
            add(checker, params, f"clients saw {s} (incident.toml)", saw.cite)
    if not plan.symptoms:
        raise IncidentError(
            "the bundle shows no symptom (no failed or slow request, no transfer timeout): say "
            "what clients saw in incident.toml [symptom] clients_saw"
        )


def infer(b: Bundle) -> Plan:
    plan = Plan(skipped=list(b.notes.skipped))
    plan.defaults.extend(b.notes.assumed)
    _gateway(b, plan)
    eng = _workers(b, plan)
    _settings(b, plan)
    lines = _fault_lines(b, eng)
    inferred = lines + _restarts_from_starts(b, eng, lines)
    inferred += _kube(b, eng, plan)
    times = [f.t for f in b.facts if f.t is not None]
    year = b.options.get("year")
    zone_year = (parse_offset(str(b.options.get("utc_offset", "Z"))), int(year) if year else None)
    t0_guess = min(
        (f.t - (f.data["latency_s"] or 0.0) for f in b.of("request") if f.t), default=min(times or [0.0])
    )
    stated = _timeline_events(b, eng, zone_year, t0_guess)
    end = max(times or [0.0])
    inferred += _probe_outages(b, eng, inferred + stated, end)
    faults = _merge(inferred, stated)
    if not faults:
        raise IncidentError(
            "the bundle shows no fault (no restart, crash, hang or failed probe): add an [[event]] "
            "to incident.toml"
        )
    numeric = any(isinstance(f.data.get("at"), int | float) for f in b.of("event"))
    reqs = _load(b, plan, faults, t0_guess if numeric else None)
    plan.faults = faults
    _symptoms(b, plan, reqs, eng)
    _fit_timeline(plan)
    return plan


def _fit_timeline(plan: Plan) -> None:
    """Faults before the load are moved to one probe interval into it; the load lasts past the last fault
    by a recovery allowance; the time scale puts the probe interval at one second."""
    interval = float(plan.router["health_interval_s"] or 1.0)
    fixed: list[PlanFault] = []
    for f in plan.faults:
        if f.at_s - plan.load_start < interval:
            plan.defaults.append(
                f"{f.action} {f.target} at {f.at_s - plan.load_start:+.1f} s: moved to "
                f"{interval:g} s, after the first probe"
            )
            f = PlanFault(plan.load_start + interval, f.action, f.target, f.params, f.cite, f.label)
        fixed.append(f)
    plan.faults = fixed
    last = max(f.at_s - plan.load_start + _down(f) for f in fixed)
    # The checkers judge what follows the last fault after the allowance: give them requests to judge.
    need = last + allowance_s(plan) + max(3 * interval, 2.0)
    if plan.duration_s < need:
        plan.defaults.append(
            f"load: {plan.duration_s:.1f} s long in the logs; run {need:.1f} s so the last fault "
            "can be judged"
        )
        plan.duration_s = need
    plan.time_scale = max(1.0, interval / SCALED_PROBE_S)
    if plan.time_scale > 1.0:
        plan.time_scale = math.floor(plan.time_scale * 1000) / 1000
