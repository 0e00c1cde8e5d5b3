"""Facts from a gateway's log: smg and vllm-router, which both write Rust `tracing` lines, as text
(`2026-12-06 09:30:46 INFO span{k=v}: target: file.rs:12: message k=v`) or as JSON (`--log-json`).

What is read: the gateway and its release, the workers it was started with (URLs, Mooncake bootstrap
ports), health settings it logs, each finished client request (status, latency), failed health probes,
worker status transitions, failed legs, and engine ids it read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, timezone
from typing import Any

from harness.incident.facts import Fact, midpoint_epoch
from harness.text import strip_ansi

_LEVELS = "TRACE|DEBUG|INFO|WARN|WARNING|ERROR"
_TEXT = re.compile(
    r"^\s*(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+"
    rf"(?P<level>{_LEVELS})\s+(?P<rest>.*)$"
)
_TARGET = re.compile(
    r"(?:^|\s|:)(?P<target>[a-z_][a-z0-9_]*(?:::[a-z0-9_]+)+|[a-z_][a-z0-9_]+): "
    r"(?:(?P<file>[\w./-]+\.rs):(?P<line>\d+): )?(?P<msg>.*)$"
)
_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s,}]+)')
_BANNER_VERSION = re.compile(r"\bversion\s+(\d+\.\d+\.\d+\S*)")
GATEWAY_TARGETS = {"smg": "smg", "vllm_router_rs": "vllm-router"}
# The keys of a JSON line that are the line's own, not the event's fields.
_LINE_KEYS = ("timestamp", "level", "target", "span", "spans", "filename", "line_number", "threadId",
              "threadName")


def _fields(text: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in _KV.findall(text)}


def parse_line(raw: str) -> tuple[str, str, str, str, dict[str, str]] | None:
    """(time text, level, target, message, fields from spans and message) of one log line, text or JSON."""
    line = strip_ansi(raw).strip()
    if line.startswith("{"):
        return _parse_json(line)
    m = _TEXT.match(line)
    if not m:
        return None
    rest = m.group("rest")
    t = _TARGET.search(rest)
    if not t:
        return None
    spans = rest[: t.start("target")]
    msg = t.group("msg")
    return m.group("ts"), m.group("level"), t.group("target"), msg, {**_fields(spans), **_fields(msg)}


def _parse_json(line: str) -> tuple[str, str, str, str, dict[str, str]] | None:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or "level" not in obj or "timestamp" not in obj:
        return None
    fields: dict[str, str] = {}
    for span in [*(obj.get("spans") or []), obj.get("span") or {}]:
        if isinstance(span, dict):
            fields.update({k: str(v) for k, v in span.items() if k != "name"})
    # tracing-subscriber's JSON puts the event's fields under "fields"; smg flattens them to the top level.
    nested = obj.get("fields")
    raw_fields = nested if isinstance(nested, dict) else {k: v for k, v in obj.items() if k not in _LINE_KEYS}
    event = {k: str(v) for k, v in raw_fields.items() if k != "message"}
    # As the text form writes them: the event's fields after its message.
    msg = " ".join([str(raw_fields.get("message", "")), *(f"{k}={v}" for k, v in event.items())])
    fields.update(event)
    return str(obj["timestamp"]), str(obj["level"]), str(obj.get("target", "")), msg, fields


_START = re.compile(r"Starting router on (?P<addr>\S+) \| mode: (?P<mode>\w+) \{(?P<body>.*)")
_PREFILL = re.compile(r'\("(?P<url>[^"]+)", (?:Some\((?P<boot>\d+)\)|None)\)')
_DECODES = re.compile(r"decode_urls: \[(?P<list>[^\]]*)\]")
# smg names each worker group's transport when it starts watching its load (workers registered by API).
_GROUP_TRANSPORT = re.compile(r"load monitor for group \S+:(?:prefill|decode):(?P<transport>http|grpc)\b")
_HEALTH_EVERY = re.compile(r"health checker for workers with (\d+(?:\.\d+)?)s interval")
_PROBE_FAILED = (
    re.compile(r"Health probe failed worker_url=(?P<url>\S+)"),
    re.compile(r"health check failed for (?P<url>\w+://[^/\s:]+:\d+)"),
    re.compile(r"health RPC error for (?P<url>\w+://[^/\s:]+:\d+)"),
    re.compile(r"Health check failed for worker (?P<url>\w+://[^/\s:]+:\d+)"),
)
_TRANSITION = re.compile(r"status transition worker_url=(?P<url>\S+) old=(?P<old>\w+) new=(?P<new>\w+)")
_LEG_ERRORS = (
    (re.compile(r"PD prefill transport error"), "prefill"),
    (re.compile(r"Decode server returned error status decode_url=(?P<url>\S+)"), "decode"),
    (
        re.compile(
            r"Transparent proxy request failed: prefill=(?P<prefill>[^,]+), decode=(?P<decode>[^,]+), "
            r"error=(?P<error>.*)"
        ),
        "",
    ),
)
_ENGINE_IDS = re.compile(r"Got Mooncake engine_ids for (?P<url>\S+): \{(?P<ids>[^}]*)\}")
_NO_WORKER = re.compile(r"No available (?:prefill |decode )?workers|Failed to select PD pair")
_END = ("finished processing request", "request failed")


def gateway_of(target: str) -> str | None:
    return GATEWAY_TARGETS.get(target.split("::", 1)[0])


def _request(msg: str, fields: dict[str, str]) -> dict[str, Any] | None:
    if not any(msg.startswith(e) for e in _END) or "status_code" not in fields:
        return None
    path = fields.get("path") or fields.get("uri") or ""
    if not path.startswith("/v1/"):
        return None
    try:
        status = int(fields["status_code"])
        latency = float(fields["latency"]) / 1e6 if "latency" in fields else None
    except ValueError:
        return None
    return {"status": status, "latency_s": latency, "path": path, "id": fields.get("request_id", "")}


def _leg_error(msg: str, fields: dict[str, str]) -> dict[str, Any] | None:
    for pattern, role in _LEG_ERRORS:
        m = pattern.search(msg)
        if not m:
            continue
        d = m.groupdict()
        if not role:  # vllm-router names both legs: the failed one is in the error text
            error = d.get("error", "")
            role = "decode" if error.lstrip().startswith(("Network error: Decode", "Decode")) else "prefill"
            url = d.get(role, "")
        else:
            url = d.get("url") or ""
        return {"role": role, "url": url.strip(), "id": fields.get("request_id", ""), "message": msg[:200]}
    return None


def facts_from_message(
    msg: str, fields: dict[str, str], t: float | None, cite: str, gateway: str | None
) -> Iterator[Fact]:
    if gateway:
        yield Fact("gateway", t, cite, {"gateway": gateway})
    if m := _START.search(msg):
        body = m.group("body")
        prefills = [
            (p.group("url"), int(p.group("boot")) if p.group("boot") else None)
            for p in _PREFILL.finditer(body.split("decode_urls")[0])
        ]
        d = _DECODES.search(body)
        decodes = re.findall(r'"([^"]+)"', d.group("list")) if d else []
        yield Fact(
            "workers_at_start", t, cite, {"prefills": prefills, "decodes": decodes, "listen": m.group("addr")}
        )
    if m := _HEALTH_EVERY.search(msg):
        yield Fact("setting", t, cite, {"health_interval_s": float(m.group(1))})
    if m := _GROUP_TRANSPORT.search(msg):
        yield Fact("transport", t, cite, {"transport": m.group("transport")})
    if "Mooncake connector enabled" in msg:
        yield Fact("connector", t, cite, {"connector": "mooncake"})
    if req := _request(msg, fields):
        yield Fact("request", t, cite, req)
        return
    for p in _PROBE_FAILED:
        if m := p.search(msg):
            yield Fact("probe_failed", t, cite, {"url": m.group("url").rstrip("/")})
            return
    if m := _TRANSITION.search(msg):
        yield Fact(
            "worker_status", t, cite, {"url": m.group("url"), "old": m.group("old"), "new": m.group("new")}
        )
        return
    if leg := _leg_error(msg, fields):
        yield Fact("leg_error", t, cite, leg)
        return
    if m := _ENGINE_IDS.search(msg):
        ids = re.findall(r'"([^"]+)"', m.group("ids"))
        yield Fact("engine_id_read", t, cite, {"url": m.group("url"), "engine_ids": ids})
        return
    if _NO_WORKER.search(msg):
        yield Fact("no_worker", t, cite, {"id": fields.get("request_id", ""), "message": msg[:200]})


def read_gateway_log(
    lines: list[str], name: str, zone: timezone = UTC
) -> tuple[list[Fact], list[tuple[int, str]]]:
    """Facts of a gateway log, and the (line number, line) of each line that is not the gateway's: in a log
    interleaved from several processes, the caller reads those as engine lines."""
    facts: list[Fact] = []
    others: list[tuple[int, str]] = []
    seen_gateway: set[str] = set()
    for i, raw in enumerate(lines, 1):
        cite = f"{name}:{i}"
        parsed = parse_line(raw)
        if parsed is None:
            if m := _BANNER_VERSION.search(strip_ansi(raw)):
                facts.append(Fact("version", None, cite, {"version": m.group(1)}))
            else:
                others.append((i, raw))
            continue
        ts, _level, target, msg, fields = parsed
        gw = gateway_of(target)
        first = gw if gw and gw not in seen_gateway else None
        if gw:
            seen_gateway.add(gw)
        facts.extend(facts_from_message(msg, fields, midpoint_epoch(ts, zone), cite, first))
    return facts, others


def looks_like_gateway_log(lines: list[str]) -> bool:
    """Some line is a tracing line whose target is smg's or vllm-router's."""
    for raw in lines[:4000]:
        parsed = parse_line(raw)
        if parsed and gateway_of(parsed[2]):
            return True
    return False
