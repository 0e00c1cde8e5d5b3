"""Facts from engine logs: the fake engines' start line (`PDCHAOS_ENGINE_READY {json}`) and fault lines
(`... pdchaos fault restart: {json}`), and vLLM's own lines (its API server address, KV connector and
role, KV transfer failures and timeouts, shutdown)."""

from __future__ import annotations

import json
import re
from datetime import UTC, timezone
from typing import Any

from harness.incident.facts import Fact, epoch, midpoint_epoch
from harness.text import strip_ansi

READY = "PDCHAOS_ENGINE_READY"
_FAKE_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(?P<ms>\d{3}) (?P<name>\S+) (?P<level>[A-Z]+) "
    r"(?P<logger>\S+): (?P<msg>.*)$"
)
_FAKE_FAULT = re.compile(r"^pdchaos fault (?P<action>\w+): (?P<body>\{.*\})\s*$")
# vLLM: `INFO 12-06 09:30:46 [api_server.py:1234] message`, maybe behind a process tag `(APIServer pid=7) `.
_VLLM_LINE = re.compile(
    r"^(?:\((?P<proc>[\w-]+) pid=(?P<pid>\d+)\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<ts>(?:\d{4}-)?\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?)\s+\[(?P<src>[^\]]+)\]\s+(?P<msg>.*)$"
)
# vLLM's wording (0.10-0.19): the API server's and the gRPC server's listen lines.
_VLLM_LISTEN = re.compile(
    r"(?:Starting vLLM (?:API )?server(?: \d+)? on (?:https?://)?|vLLM gRPC server started on )"
    r"(?P<host>\[[^\]]*\]|[^\s:]*):(?P<port>\d+)"
)
_VLLM_CONNECTOR = re.compile(
    r"Creating v1 connector with name: (?P<name>\w+)(?: and engine_id: (?P<id>\S+))?"
)
_VLLM_ROLE = re.compile(r"kv_role['\"]?\s*[:=]\s*['\"]?(?P<role>kv_producer|kv_consumer|kv_both)")
_VLLM_ARGS_CONNECTOR = re.compile(r"kv_connector['\"]?\s*[:=]\s*['\"](?P<name>\w+)['\"]")
# A wait that ran out: Mooncake's P-side timeouts, NIXL's expiry of unread KV.
_VLLM_TIMEOUT = re.compile(
    r"Timeout waiting for P side ready|timed out after \d+ seconds without being sent"
    r"|Releasing expired KV blocks|expired before sending on P side"
)
_VLLM_TRANSFER_FAIL = re.compile(
    r"Error happens during tran\w+ kvcache|pulling kv_caches for \S+ failed"
    r"|NIXL transfer fail|Handshake with \S+ failed|Handshake failed for request"
    r"|transfer failed for|Failed to connect to bootstrap server"
    r"|Error processing Mooncake"
)
_VLLM_ABORT_AFTER = re.compile(r"(?:timed out after|within) (?P<s>\d+) seconds")
_VLLM_STOP = re.compile(
    r"died unexpectedly|Shutting down FastAPI HTTP server|Shutting down vLLM gRPC server"
    r"|EngineCore encountered a fatal error|^Shutting down\.$"
)
# By the name's start: vLLM has several of each (MooncakeConnectorV1, NixlPullConnector, ...).
_CONNECTORS = (("Mooncake", "mooncake"), ("Nixl", "nixl"))
# A line that starts like a log line (a time, a level, a JSON object): unread, it is worth a note.
_LOG_LIKE = re.compile(r"^\s*(?:\d{2,4}-\d{2}|\(\w+ pid=|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|\{)")
_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}


def _fake_ready(body: str, cite: str) -> Fact | None:
    try:
        state: dict[str, Any] = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(state, dict) or "started_at" not in state:
        return None
    return Fact(
        "engine_start",
        float(state["started_at"]),
        cite,
        {
            "name": state.get("name"),
            "role": state.get("role"),
            "connector": state.get("connector"),
            "engine_id": state.get("engine_id"),
            "pid": state.get("pid"),
            "ports": [state.get(k) for k in ("http_port", "grpc_port") if state.get(k)],
            "bootstrap_port": state.get("bootstrap_port"),
            "transfer_timeout_s": state.get("transfer_timeout_s"),
            "source": "fake",
        },
    )


def _kv_trouble(msg: str, t: float | None, cite: str, base: dict[str, Any]) -> list[Fact]:
    """A KV transfer that timed out or failed, in vLLM's wording (the fakes use it too)."""
    if _VLLM_TIMEOUT.search(msg):
        data = {**base, "message": msg[:200]}
        if am := _VLLM_ABORT_AFTER.search(msg):
            data["abort_timeout_s"] = float(am.group("s"))
        return [Fact("kv_timeout", t, cite, data)]
    if _VLLM_TRANSFER_FAIL.search(msg):
        return [Fact("kv_failure", t, cite, {**base, "message": msg[:200]})]
    return []


def _vllm_facts(m: re.Match[str], t: float | None, cite: str, name: str) -> list[Fact]:
    msg = m.group("msg")
    out: list[Fact] = []
    base = {"log": name, "pid": int(m.group("pid")) if m.group("pid") else None}
    if lm := _VLLM_LISTEN.search(msg):
        out.append(
            Fact("engine_start", t, cite, {**base, "ports": [int(lm.group("port"))], "source": "vllm"})
        )
    kv: dict[str, Any] = {}
    if cm := _VLLM_CONNECTOR.search(msg) or _VLLM_ARGS_CONNECTOR.search(msg):
        named = cm.group("name")
        kv["connector"] = next((c for prefix, c in _CONNECTORS if named.startswith(prefix)), "other")
        if "id" in cm.groupdict() and cm.group("id"):
            kv["engine_id"] = cm.group("id")
    if rm := _VLLM_ROLE.search(msg):
        kv["role"] = _ROLES[rm.group("role")]
    if kv:
        out.append(Fact("engine_kv", t, cite, {**base, **kv}))
    out += _kv_trouble(msg, t, cite, base)
    if _VLLM_STOP.search(msg):
        out.append(Fact("engine_stop", t, cite, {**base, "message": msg[:200]}))
    return out


def read_engine_log(
    lines: list[tuple[int, str]], name: str, zone: timezone = UTC, year: int | None = None
) -> tuple[list[Fact], int]:
    """Facts of one engine's log ((line number, line) pairs), and how many log lines were not read (a
    traceback's or a banner's lines are not log lines)."""
    facts: list[Fact] = []
    unread = 0
    for i, raw in lines:
        line = strip_ansi(raw).rstrip("\n")
        cite = f"{name}:{i}"
        if line.startswith(READY + " "):
            fact = _fake_ready(line[len(READY) + 1 :], cite)
            if fact:
                facts.append(fact)
                continue
        if m := _FAKE_LINE.match(line):
            t = epoch(f"{m.group('ts')}.{m.group('ms')}", zone)
            f = _FAKE_FAULT.match(m.group("msg"))
            if f:
                try:
                    changed = json.loads(f.group("body"))
                except json.JSONDecodeError:
                    changed = {}
                facts.append(
                    Fact(
                        "engine_fault",
                        t,
                        cite,
                        {
                            "name": m.group("name"),
                            "action": f.group("action"),
                            "changed": changed,
                            "log": name,
                        },
                    )
                )
            else:
                base = {"log": name, "pid": None, "name": m.group("name")}
                facts += _kv_trouble(m.group("msg"), t, cite, base)
            continue
        if m := _VLLM_LINE.match(line):
            t = midpoint_epoch(m.group("ts").replace(",", "."), zone, year)
            facts.extend(_vllm_facts(m, t, cite, name))
            continue
        if _LOG_LIKE.match(line):
            unread += 1
    return facts, unread


def looks_like_engine_log(lines: list[str]) -> bool:
    return any(
        ln.startswith(READY) or _FAKE_LINE.match(strip_ansi(ln)) or _VLLM_LINE.match(strip_ansi(ln))
        for ln in lines[:2000]
    )
