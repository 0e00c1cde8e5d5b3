"""Facts from what a person adds to a bundle: the gateway's command line, Kubernetes events
(`kubectl get events -o json`) and the incident timeline (`incident.toml`, format in `TIMELINE_HELP`)."""

from __future__ import annotations

import json
import shlex
import tomllib
from typing import Any

from harness.incident.facts import Fact, IncidentError, epoch

TIMELINE_HELP = """\
incident.toml (every part optional; what the logs show needs no entry):

  utc_offset = "+00:00"      zone of log times written without one (default UTC)
  year = 2026                year of vLLM's log times, which have none (default: from other logs)

  [gateway]
  release = "smg==1.10.1"    the gateway release that ran (default: from its log)
  command = "smg launch ..." its command line, when no *.cmdline file holds it

  [engines]
  connector = "mooncake"     mooncake or nixl
  transport = "grpc"         how the gateway talks to the engines: http or grpc
  transfer_timeout_s = 480   the decode's KV transfer timeout (vLLM's default: 480)

  [[engine]]                 one per engine the logs do not name
  name = "prefill-0"
  role = "prefill"           prefill or decode
  url = "grpc://10.0.0.5:8000"
  pod = "vllm-prefill-7d9f-x2"  the Kubernetes pod that runs it, if its name does not say
  logs = ["prefill-0.log"]  its log files, when the gateway reaches it by another address (a proxy)

  [[event]]                  what happened, when the logs do not say it
  at = "2026-12-06 09:30:48" a time (the zone above), or seconds after the load began (12.5)
  engine = "prefill-0"
  what = "restart"           restart, process_restart, crash, respawn, die, stop (graceful), freeze,
                             wedge (with surface = "generate", "health", ...), heal
  down_s = 0.6               restart: how long it was down

  [symptom]
  clients_saw = ["hang"]     any of: hang (waited a KV transfer timeout), errors, 503, 404, slow,
                             never_back (a worker never served again)
"""

EVENT_KINDS = ("restart", "process_restart", "crash", "respawn", "die", "stop", "freeze", "wedge", "heal")
SYMPTOMS = ("hang", "errors", "503", "404", "slow", "never_back")
GATEWAY_EXECUTABLES = ("smg", "vllm-router", "sglang-router", "sglang_router")

# Gateway flags that set what the replay needs, to the plan's field names.
_FLAG_SETTINGS = {
    "--health-check-interval-secs": "health_interval_s",
    "--health-check-timeout-secs": "health_timeout_s",
    "--health-failure-threshold": "failure_threshold",
    "--health-success-threshold": "success_threshold",
    "--request-timeout-secs": "request_timeout_s",
    "--cb-failure-threshold": "circuit_breaker_failures",
    "--cb-timeout-duration-secs": "circuit_breaker_open_s",
}


def looks_like_command(text: str) -> bool:
    words = text.split()
    return bool(words) and (
        "--pd-disaggregation" in words
        or "--vllm-pd-disaggregation" in words
        or words[0].rsplit("/", 1)[-1] in GATEWAY_EXECUTABLES
    )


def read_command(text: str, cite: str) -> list[Fact]:
    """The gateway's flags: workers (with Mooncake bootstrap ports), health and timeout settings."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise IncidentError(f"{cite}: the gateway command line does not parse ({exc})") from None
    facts: list[Fact] = []
    exe = words[0].rsplit("/", 1)[-1] if words else ""
    gateway = "vllm-router" if "vllm-router" in exe or "--vllm-pd-disaggregation" in words else "smg"
    facts.append(Fact("gateway", None, cite, {"gateway": gateway}))
    prefills: list[tuple[str, int | None]] = []
    decodes: list[str] = []
    settings: dict[str, float] = {}
    i = 0
    while i < len(words):
        w, nxt = words[i], words[i + 1] if i + 1 < len(words) else None
        if w == "--prefill" and nxt:
            boot = words[i + 2] if i + 2 < len(words) and not words[i + 2].startswith("--") else None
            prefills.append((nxt, int(boot) if boot and boot.isdigit() else None))
            i += 3 if boot else 2
            continue
        if w == "--decode" and nxt:
            decodes.append(nxt)
            i += 2
            continue
        if w in _FLAG_SETTINGS and nxt is not None:
            try:
                settings[_FLAG_SETTINGS[w]] = float(nxt)
            except ValueError:
                raise IncidentError(f"{cite}: {w} {nxt!r} is not a number") from None
        if w == "--kv-connector" and nxt:
            facts.append(Fact("connector", None, cite, {"connector": nxt.lower()}))
        if w == "--disable-circuit-breaker":
            settings["circuit_breaker_disabled"] = 1.0
        i += 1
    if prefills or decodes:
        facts.append(Fact("workers_at_start", None, cite, {"prefills": prefills, "decodes": decodes}))
    if settings:
        facts.append(Fact("setting", None, cite, settings))
    return facts


def _event_time(obj: dict[str, Any]) -> str | None:
    for key in ("eventTime", "lastTimestamp", "firstTimestamp"):
        v = obj.get(key) or (obj.get("metadata") or {}).get("creationTimestamp" if key == "eventTime" else "")
        if isinstance(v, str) and v:
            return v
    return None


def looks_like_kube_events(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("items"), list)
        and any(isinstance(e, dict) and e.get("kind") == "Event" for e in obj["items"])
    ) or (isinstance(obj, dict) and obj.get("kind") == "EventList")


def read_kube_events(obj: dict[str, Any], name: str) -> tuple[list[Fact], int]:
    """Killing, Started, BackOff, Unhealthy, OOMKilled events of pods (others are counted as unread)."""
    facts: list[Fact] = []
    unread = 0
    for i, e in enumerate(obj.get("items") or [], 1):
        cite = f"{name}:items[{i - 1}]"
        if not isinstance(e, dict):
            unread += 1
            continue
        reason = e.get("reason")
        pod = (e.get("involvedObject") or {}).get("name")
        stamp = _event_time(e)
        t = epoch(stamp) if stamp else None
        message = str(e.get("message") or "")
        if "OOMKilled" in message and reason != "OOMKilled":
            reason = "OOMKilled"
        if reason in ("Killing", "Started", "BackOff", "Unhealthy", "OOMKilled") and pod and t is not None:
            facts.append(Fact("k8s", t, cite, {"reason": reason, "pod": pod, "message": message[:200]}))
        else:
            unread += 1
    return facts, unread


def read_timeline(text: str, name: str) -> tuple[list[Fact], dict[str, Any]]:
    """Facts of incident.toml, and its reading options (utc_offset, year)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise IncidentError(f"{name}: not valid TOML ({exc})") from None
    facts: list[Fact] = []
    options = {k: doc[k] for k in ("utc_offset", "year") if k in doc}
    gw = doc.get("gateway") or {}
    if "release" in gw:
        facts.append(Fact("release", None, f"{name}:[gateway]", {"release": str(gw["release"])}))
    if "command" in gw:
        facts.extend(read_command(str(gw["command"]), f"{name}:[gateway].command"))
    eng = doc.get("engines") or {}
    for key in ("connector", "transport"):
        if key in eng:
            facts.append(Fact(key, None, f"{name}:[engines]", {key: str(eng[key])}))
    if "transfer_timeout_s" in eng:
        facts.append(
            Fact(
                "setting", None, f"{name}:[engines]", {"transfer_timeout_s": float(eng["transfer_timeout_s"])}
            )
        )
    for i, e in enumerate(doc.get("engine") or []):
        if not isinstance(e, dict) or "name" not in e or e.get("role") not in ("prefill", "decode"):
            raise IncidentError(f"{name}: [[engine]] #{i + 1} needs a name and a role (prefill or decode)")
        facts.append(Fact("engine_named", None, f"{name}:[[engine]]#{i + 1}", dict(e)))
    for i, ev in enumerate(doc.get("event") or []):
        cite = f"{name}:[[event]]#{i + 1}"
        if (
            not isinstance(ev, dict)
            or ev.get("what") not in EVENT_KINDS
            or "engine" not in ev
            or "at" not in ev
        ):
            raise IncidentError(
                f"{cite}: an event needs at, engine and what (one of {', '.join(EVENT_KINDS)})"
            )
        facts.append(Fact("event", None, cite, dict(ev)))
    saw = (doc.get("symptom") or {}).get("clients_saw", [])
    saw = [saw] if isinstance(saw, str) else list(saw)
    bad = [s for s in saw if s not in SYMPTOMS]
    if bad:
        raise IncidentError(f"{name}: [symptom] clients_saw {bad} (known: {', '.join(SYMPTOMS)})")
    if saw:
        facts.append(Fact("symptom", None, f"{name}:[symptom]", {"clients_saw": saw}))
    return facts, options


def parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None
