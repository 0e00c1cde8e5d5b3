"""What a fidelity probe saw, reduced to facts two engines can be compared on (pure: no I/O here).

A probe's answer is not compared byte for byte: ids, timestamps, token text and a random model's words
differ between any two engines. Each answer is reduced to facts a router could act on (status codes, which
keys a body has and their JSON types, how a stream ends, whether a failure came fast, after a bounded
wait, or not at all) and facts only a person reads (a version string). Two engines agree on a probe when
every fact agrees; a difference in a router-actionable fact is what `pdchaos fidelity` fails on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The probe name of facts the real side states (e.g. from source) and no probe measures: shown, not compared.
SOURCE_ONLY = "source_only"

# How long a probe waits for an answer: past this the engine "did not answer" (a hang, for a router).
ANSWER_BUDGET_S = 15.0
# Answers within this are "fast"; later ones (up to the budget) waited on something: a timeout.
FAST_S = 1.5


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        inner = sorted({json_type(v) for v in value})
        return f"list[{'|'.join(inner)}]" if inner else "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def key_types(obj: Mapping[str, Any] | None, only: Iterable[str] | None = None) -> str:
    """`key:type` pairs, sorted; `only` keeps the keys a router reads (absent ones show as `key:absent`)."""
    if obj is None:
        return "none"
    keys = sorted(only) if only is not None else sorted(obj)
    return ",".join(f"{k}:{json_type(obj[k]) if k in obj else 'absent'}" for k in keys)


def timing_class(elapsed_s: float | None) -> str:
    if elapsed_s is None:
        return f"no answer in {ANSWER_BUDGET_S:g} s"
    if elapsed_s < FAST_S:
        return "fast"
    return "after a wait"


@dataclass(frozen=True)
class HttpAnswer:
    """One HTTP exchange as a probe saw it: status (None: no answer), body bytes, time to the answer's
    end, and the error that ended it early (a reset, a timeout)."""

    status: int | None
    body: bytes = b""
    elapsed_s: float | None = None
    error: str | None = None
    content_type: str = ""

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            return None

    def sse_events(self) -> list[Any]:
        """The `data:` payloads of a server-sent-event body, JSON-decoded where they are JSON."""
        out: list[Any] = []
        for line in self.body.decode("utf-8", "replace").splitlines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            try:
                out.append(json.loads(data))
            except ValueError:
                out.append(data)
        return out


def outcome(a: HttpAnswer) -> str:
    """How an exchange ended, as a router sees it: `200`, `HTTP 503`, `reset`, `no answer`... with the
    timing class."""
    if a.status is None:
        if a.elapsed_s is None:
            return timing_class(None)
        return f"connection error ({a.error or 'closed'}), {timing_class(a.elapsed_s)}"
    body = a.json()
    if a.status == 200 and isinstance(body, dict) and "error" in body:
        return f"200 with an error body, {timing_class(a.elapsed_s)}"
    if a.status == 200 and a.content_type.startswith("text/event-stream"):
        errs = [e for e in a.sse_events() if isinstance(e, dict) and "error" in e]
        if errs:
            return f"200 stream with an error chunk, {timing_class(a.elapsed_s)}"
    if 200 <= a.status < 300:
        # How long a success took is the machine's speed (a CPU vLLM takes seconds), not a behaviour.
        return f"HTTP {a.status}"
    return f"HTTP {a.status}, {timing_class(a.elapsed_s)}"


@dataclass(frozen=True)
class GrpcAnswer:
    """One gRPC call as a probe saw it: its status code name ("OK" when it ended well), the messages that
    came, time to its end (None: no end within the probe's budget) and the status details."""

    code: str
    messages: list[Any] = field(default_factory=list)
    elapsed_s: float | None = None
    details: str = ""


def grpc_outcome(a: GrpcAnswer) -> str:
    """How a call ended, as a gRPC gateway sees it: `OK`, or the status code with the timing class."""
    if a.elapsed_s is None:
        return timing_class(None)
    if a.code == "OK":
        return "OK"  # how long a success took is the machine's speed, as for HTTP
    return f"{a.code}, {timing_class(a.elapsed_s)}"


def error_shape(a: HttpAnswer) -> str:
    """The error body's shape (`error.message/type/code` in vLLM's OpenAI server) or what came instead."""
    body = a.json()
    if not isinstance(body, dict):
        return "not JSON" if a.body else "empty"
    err = body.get("error")
    if isinstance(err, dict):
        return "error{" + key_types(err, ("message", "type", "code")) + "}"
    return "keys " + ",".join(sorted(body))


def stream_end(a: HttpAnswer) -> str:
    events = a.sse_events()
    if not events:
        return "no events"
    last_json = [e for e in events if isinstance(e, dict)]
    finish = None
    for e in last_json:
        for c in e.get("choices") or []:
            if isinstance(c, dict) and c.get("finish_reason"):
                finish = c["finish_reason"]
    done = "ends [DONE]" if events[-1] == "[DONE]" else "no [DONE]"
    return f"{done}; finish_reason {'set' if finish else 'never set'}"


@dataclass(frozen=True)
class Fact:
    """One compared fact of a probe; `actionable`: a router could see the difference and act on it."""

    name: str
    value: str
    actionable: bool = True
    source: str | None = None  # "from source: <file:lines>" when read from code, not measured


@dataclass
class ProbeResult:
    probe: str
    question: str
    facts: list[Fact] = field(default_factory=list)
    skipped: str | None = None  # why the probe could not run on this engine

    def add(self, name: str, value: str, actionable: bool = True, source: str | None = None) -> None:
        self.facts.append(Fact(name, value, actionable, source))

    def fact(self, name: str) -> Fact | None:
        return next((f for f in self.facts if f.name == name), None)
