"""Engine call records: every call an engine answers, from its own side (CONTRACTS.md §1).

A router's contract is judged from what the engines saw of it: each health probe, each metadata read and
each generation leg. An engine writes one `engine_call` record per call into its records stream, beside its
handoff provenance records. A leg the engine served leaves a handoff record instead, which carries the same
`leg` shape; a leg it refused or that was cut leaves a `generate` call.

Who called is told by the caller (header `X-Pdchaos-Caller`, gRPC metadata `x-pdchaos-caller`): the harness
marks its own probes (`harness`), a decode marks its bootstrap lookups (`engine:<name>`); anything unmarked
is the router under test (`router`), as a real gateway marks nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fake_engines.core.records import find_tag
from fake_engines.core.request_fields import ignored_fields

# The discriminator of a call record in an engine's records stream (handoff records have none).
RECORD_KEY = "record"
ENGINE_CALL = "engine_call"

CALLER_HEADER = "X-Pdchaos-Caller"
CALLER_METADATA = "x-pdchaos-caller"
ROUTER = "router"
HARNESS = "harness"


def engine_caller(name: str) -> str:
    """How an engine names itself when it calls another (a decode's bootstrap lookup)."""
    return f"engine:{name}"


def caller_of(value: str | None) -> str:
    """The caller a request named (None or blank: the router under test)."""
    value = (value or "").strip()
    return value or ROUTER


# Call names: the surface and the method, one word each.
HEALTH = "health"  # HTTP GET /health
GRPC_HEALTH = "grpc_health"  # VllmEngine.HealthCheck
GRPC_HEALTH_V1 = "grpc_health_v1"  # grpc.health.v1.Health Check (a Watch: once, at its start)
SERVER_INFO = "server_info"  # GetServerInfo
MODEL_INFO = "model_info"  # GetModelInfo
LOADS = "loads"  # GetLoads
TOKENIZER = "tokenizer"  # GetTokenizer
MODELS = "models"  # HTTP GET /v1/models
VERSION = "version"  # HTTP GET /version
METRICS = "metrics"  # HTTP GET /metrics
BOOTSTRAP_QUERY = "bootstrap_query"  # Mooncake bootstrap GET /query
GENERATE = "generate"  # a generation leg the engine refused or that was cut (served ones: handoff records)
ABORT = "abort"  # VllmEngine.Abort

CALLS = (
    HEALTH, GRPC_HEALTH, GRPC_HEALTH_V1, SERVER_INFO, MODEL_INFO, LOADS, TOKENIZER, MODELS, VERSION,
    METRICS, BOOTSTRAP_QUERY, GENERATE, ABORT,
)
PROBE_CALLS = (HEALTH, GRPC_HEALTH, GRPC_HEALTH_V1)

# The status a call that its caller gave up on (or that was cut) is recorded with, as nginx logs it.
CLIENT_GONE = 499

# The KV transfer parameters a leg record keeps: what the handoff contract judges (block ids and the like
# are left out: long, and the same for every correct router).
LEG_KV_KEYS = (
    "do_remote_decode", "do_remote_prefill", "transfer_id", "remote_engine_id", "remote_bootstrap_addr",
    "remote_request_id", "remote_host", "remote_port",
)
# Every kv_transfer_params key a vLLM connector (Mooncake, NIXL) reads. vLLM passes any other key by without
# a word, so a misspelt one is lost silently: a leg's shape lists such keys under `ignored`.
KV_KEYS_READ = frozenset((*LEG_KV_KEYS, "remote_block_ids", "tp_size"))


def make_call(
    *,
    ts: float,
    engine: str,
    engine_id: str,
    generation: int,
    role: str,
    call: str,
    status: int,
    duration_s: float,
    caller: str,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One engine call record: `ts` when the call arrived (wall), `status` the engine's answer as an HTTP
    status (a gRPC status as its HTTP twin; CLIENT_GONE when it was cut), `detail` what the call told."""
    if call not in CALLS:
        raise ValueError(f"call must be one of {CALLS}, got {call!r}")
    return {
        RECORD_KEY: ENGINE_CALL,
        "ts": ts,
        "engine": engine,
        "engine_id": engine_id,
        "generation": generation,
        "role": role,
        "call": call,
        "status": status,
        "duration_s": duration_s,
        "caller": caller,
        "detail": dict(detail or {}),
    }


def is_call_record(record: Mapping[str, Any]) -> bool:
    return record.get(RECORD_KEY) == ENGINE_CALL


def leg_shape(
    *,
    stream: Any = None,
    max_tokens: Any = None,
    min_tokens: Any = None,
    n: Any = None,
    ignore_eos: Any = None,
    stream_options: Any = None,
    kv_transfer_params: Any = None,
    stop: Any = None,
    ignored: Iterable[str] = (),
) -> dict[str, Any]:
    """The parameters of a leg that the PD contract judges, the same from either surface: a value a
    surface cannot tell from its default is left out (n 1, min_tokens 0, ignore_eos false, no stop
    strings), so an HTTP body and the gRPC request a router made of it give one shape. `ignored`: the
    body's fields the engine does not know; with the kv_transfer_params keys no connector reads, they are
    kept under `ignored` (absent when there are none)."""
    out: dict[str, Any] = {"stream": bool(stream)}
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if min_tokens not in (None, 0):
        out["min_tokens"] = min_tokens
    if n not in (None, 0, 1):
        out["n"] = n
    if ignore_eos:
        out["ignore_eos"] = True
    if stream_options is not None:
        out["stream_options"] = stream_options
    stops = [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, list | tuple) else []
    if stops:
        out["stop"] = stops
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = (
            {k: kv_transfer_params[k] for k in LEG_KV_KEYS if k in kv_transfer_params}
            if isinstance(kv_transfer_params, Mapping) else kv_transfer_params
        )
    unread = [*ignored]
    if isinstance(kv_transfer_params, Mapping):
        unread += [f"kv_transfer_params.{k}" for k in kv_transfer_params if k not in KV_KEYS_READ]
    if unread:
        out["ignored"] = sorted(unread)
    return out


def leg_of_openai(body: Mapping[str, Any], chat: bool, *, grpc: bool = False) -> dict[str, Any]:
    """The shape of an OpenAI body as an engine gets it: over HTTP as is; `grpc`: as a router's Generate
    request carries it (no `stream_options`: the request has no such field). Read before any check, so a
    leg refused as malformed still has one."""
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    return leg_shape(
        stream=body.get("stream"),
        max_tokens=max_tokens,
        min_tokens=body.get("min_tokens"),
        n=body.get("n"),
        ignore_eos=body.get("ignore_eos"),
        stream_options=None if grpc else body.get("stream_options"),
        kv_transfer_params=body.get("kv_transfer_params"),
        stop=body.get("stop"),
        # A router's Generate request has no room for a field the proto lacks.
        ignored=() if grpc else ignored_fields(body, chat),
    )


def tag_of_openai(body: Mapping[str, Any]) -> str | None:
    """The `[pdchaos:...]` tag of an OpenAI body's prompt or messages, read before any check."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return find_tag(prompt)
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(content, str) and (tag := find_tag(content)) is not None:
                return tag
    return None
