"""The fidelity probes: the same questions asked of a fake and of a real engine pair (one prefill, one
decode, NIXL), each reduced to comparable facts (`harness.fidelity.observe`).

Probes run in order on one pair: first those that leave the engines as they were, then those that kill,
restart or freeze the prefill (each brings it back before the next). Every request has a deadline
(`ANSWER_BUDGET_S`); a probe whose engine did not answer says so as a fact, it does not hang the run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from harness.fidelity.observe import (
    ANSWER_BUDGET_S,
    HttpAnswer,
    ProbeResult,
    error_shape,
    json_type,
    key_types,
    outcome,
    stream_end,
)

MODEL = "pdchaos-fake"
PROMPT = "The prefill engine computes the prompt's KV cache and the decode engine pulls it to generate."
# The keys a NIXL prefill's kv_transfer_params carry that a router relays or reads.
NIXL_PARAM_KEYS = ("do_remote_decode", "do_remote_prefill", "remote_block_ids", "remote_engine_id",
                   "remote_host", "remote_port", "remote_request_id", "tp_size")


class PairControl(Protocol):
    """The engine pair a probe runs on: where each engine answers, and the process faults."""

    connector: str

    def url(self, role: str) -> str: ...

    def bootstrap_addr(self) -> str: ...

    def engine_id(self, role: str) -> str | None: ...

    async def kill(self, role: str) -> None: ...

    async def restart(self, role: str) -> None: ...

    async def pause(self, role: str) -> None: ...

    async def resume(self, role: str) -> None: ...


async def exchange(http: aiohttp.ClientSession, method: str, url: str, body: Any = None,
                   raw: bytes | None = None, budget_s: float = ANSWER_BUDGET_S) -> HttpAnswer:
    """One request with a deadline; whatever happens comes back as an HttpAnswer (no exception)."""
    start = time.monotonic()
    kwargs: dict[str, Any] = {"timeout": aiohttp.ClientTimeout(total=budget_s)}
    if raw is not None:
        kwargs["data"] = raw
        kwargs["headers"] = {"Content-Type": "application/json"}
    elif body is not None:
        kwargs["json"] = body
    try:
        async with http.request(method, url, **kwargs) as resp:
            data = await resp.read()
            return HttpAnswer(resp.status, data, time.monotonic() - start,
                              content_type=resp.headers.get("Content-Type", ""))
    except TimeoutError:
        return HttpAnswer(None, b"", None, "timeout")
    except aiohttp.ClientError as exc:
        return HttpAnswer(None, b"", time.monotonic() - start, type(exc).__name__)


def completion(max_tokens: int = 4, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": stream, **extra}


def chat(max_tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": stream}


PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
MOONCAKE_PARAM_KEYS = ("do_remote_decode", "do_remote_prefill", "remote_bootstrap_addr", "remote_engine_id",
                       "transfer_id")


@dataclass
class Probe:
    name: str
    question: str
    run: Callable[[aiohttp.ClientSession, PairControl, ProbeResult], Awaitable[None]]


async def prefill_leg(http: aiohttp.ClientSession,
                      pair: PairControl) -> tuple[HttpAnswer, dict[str, Any] | None, dict[str, Any] | None]:
    """A router's prefill leg: (answer, the kv_transfer_params it returned, the decode leg's params).
    NIXL: the decode gets what the prefill returned. Mooncake: the router mints a transfer id and tells
    the decode the prefill's engine id and bootstrap address itself."""
    if pair.connector == "mooncake":
        tid = f"xfer-{uuid.uuid4().hex}"
        sent: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
    else:
        sent = dict(PREFILL_PARAMS)
    ans = await exchange(http, "POST", pair.url("prefill") + "/v1/completions",
                         completion(max_tokens=1, kv_transfer_params=sent))
    body = ans.json()
    got = body.get("kv_transfer_params") if isinstance(body, dict) else None
    returned = got if isinstance(got, dict) else None
    if ans.status != 200:
        return ans, returned, None
    if pair.connector == "mooncake":
        return ans, returned, {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": tid,
                               "remote_engine_id": pair.engine_id("prefill"),
                               "remote_bootstrap_addr": pair.bootstrap_addr()}
    return ans, returned, returned


async def decode_params(http: aiohttp.ClientSession, pair: PairControl,
                        r: ProbeResult) -> dict[str, Any] | None:
    """A prefill leg's parameters for the decode; None (and the failed leg as a fact) when it gave none."""
    ans, _, params = await prefill_leg(http, pair)
    if params is None:
        r.add("prefill status", outcome(ans))
    return params


async def decode_leg(http: aiohttp.ClientSession, pair: PairControl, params: dict[str, Any]) -> HttpAnswer:
    return await exchange(http, "POST", pair.url("decode") + "/v1/completions",
                          completion(max_tokens=4, kv_transfer_params=params))


# -- probes that leave the pair as it was -------------------------------------------------------------------


async def _health(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    for role in ("prefill", "decode"):
        a = await exchange(http, "GET", pair.url(role) + "/health")
        r.add(f"{role} status", outcome(a))


async def _models(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    a = await exchange(http, "GET", pair.url("decode") + "/v1/models")
    r.add("status", outcome(a))
    body = a.json()
    data = body.get("data") if isinstance(body, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None
    r.add("object", str(body.get("object")) if isinstance(body, dict) else "not JSON")
    r.add("served model id", str(first.get("id")) if first else "none")
    r.add("model keys", key_types(first, ("id", "object", "owned_by", "max_model_len", "root")), False)


async def _version(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    a = await exchange(http, "GET", pair.url("decode") + "/version")
    r.add("status", outcome(a))
    r.add("body", key_types(a.json() if isinstance(a.json(), dict) else None, ("version",)))


async def _completion(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    a = await exchange(http, "POST", pair.url("decode") + "/v1/completions", completion())
    body = a.json() if isinstance(a.json(), dict) else None
    r.add("status", outcome(a))
    r.add("object", str(body.get("object")) if body else "none")
    r.add("top keys", key_types(body, ("id", "object", "model", "choices", "usage", "kv_transfer_params")))
    choice = (body.get("choices") or [None])[0] if body else None
    r.add("choice keys", key_types(choice if isinstance(choice, dict) else None,
                                   ("index", "text", "finish_reason")))
    r.add("usage keys", key_types(body.get("usage") if body else None,
                                  ("prompt_tokens", "completion_tokens", "total_tokens")))
    r.add("finish_reason", str(choice.get("finish_reason")) if isinstance(choice, dict) else "none")


async def _completion_stream(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    a = await exchange(http, "POST", pair.url("decode") + "/v1/completions", completion(stream=True))
    r.add("status", outcome(a))
    r.add("content type", a.content_type.split(";")[0] or "none")
    r.add("stream end", stream_end(a))
    first = next((e for e in a.sse_events() if isinstance(e, dict)), None)
    r.add("chunk object", str(first.get("object")) if first else "none")


async def _chat(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    a = await exchange(http, "POST", pair.url("decode") + "/v1/chat/completions", chat())
    body = a.json() if isinstance(a.json(), dict) else None
    r.add("status", outcome(a))
    r.add("object", str(body.get("object")) if body else "none")
    choice = (body.get("choices") or [None])[0] if body else None
    msg = choice.get("message") if isinstance(choice, dict) else None
    r.add("message", key_types(msg if isinstance(msg, dict) else None, ("role", "content")))
    s = await exchange(http, "POST", pair.url("decode") + "/v1/chat/completions", chat(stream=True))
    r.add("stream status", outcome(s))
    r.add("stream end", stream_end(s))
    first = next((e for e in s.sse_events() if isinstance(e, dict)), None)
    delta = ((first.get("choices") or [{}])[0] or {}).get("delta") if first else None
    r.add("first delta", key_types(delta if isinstance(delta, dict) else None, ("role", "content")), False)


async def _errors(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    url = pair.url("decode") + "/v1/completions"
    unknown = await exchange(http, "POST", url, {**completion(), "model": "no-such-model"})
    r.add("unknown model", outcome(unknown))
    r.add("unknown model body", error_shape(unknown))
    bad_json = await exchange(http, "POST", url, raw=b"{not json")
    r.add("malformed JSON", outcome(bad_json))
    too_long = await exchange(http, "POST", url, completion(max_tokens=10**6))
    r.add("max_tokens past the context", outcome(too_long))
    r.add("max_tokens body", error_shape(too_long))
    stream_bad = await exchange(http, "POST", url, completion(max_tokens=10**6, stream=True))
    r.add("same, streamed", outcome(stream_bad))


async def _handoff(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    ans, returned, params = await prefill_leg(http, pair)
    r.add("prefill status", outcome(ans))
    r.add("prefill params", key_types(returned, MOONCAKE_PARAM_KEYS if pair.connector == "mooncake"
                                      else NIXL_PARAM_KEYS))
    if params is not None and pair.connector == "nixl":
        r.add("remote_engine_id is the prefill's id",
              str(params.get("remote_engine_id") == pair.engine_id("prefill")).lower()
              if pair.engine_id("prefill") else "unknown")
        r.add("remote_block_ids shape", json_type(params.get("remote_block_ids")), False)
        r.add("do_remote_prefill", str(params.get("do_remote_prefill")).lower())
    if params is not None:
        dec = await decode_leg(http, pair, params)
        r.add("decode status", outcome(dec))
        body = dec.json() if isinstance(dec.json(), dict) else None
        returned = json_type(body.get("kv_transfer_params")) if body else "none"
        r.add("decode answer's kv_transfer_params", returned, False)
    local = await exchange(http, "POST", pair.url("decode") + "/v1/completions",
                           completion(kv_transfer_params={"do_remote_prefill": False,
                                                          "do_remote_decode": False}))
    r.add("decode with both flags false", outcome(local))


async def _never_computed(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    params = await decode_params(http, pair, r)
    if params is None:
        return
    forged = ({**params, "transfer_id": "xfer-never-prefilled"} if pair.connector == "mooncake"
              else {**params, "remote_request_id": "never-prefilled-0000"})
    dec = await decode_leg(http, pair, forged)
    r.add("decode for a request the prefill never computed", outcome(dec))
    other = {**params, "remote_engine_id": "no-such-engine"}
    dec2 = await decode_leg(http, pair, other)
    r.add("decode naming an engine id the peer does not have", outcome(dec2))


async def _abort_mid_stream(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    url = pair.url("decode") + "/v1/completions"
    got_first = False
    try:
        async with http.post(url, json=completion(max_tokens=200, stream=True),
                             timeout=aiohttp.ClientTimeout(total=ANSWER_BUDGET_S)) as resp:
            async for _ in resp.content:
                got_first = True
                break
            resp.close()
    except (aiohttp.ClientError, TimeoutError):
        pass
    r.add("first chunk before the abort", str(got_first).lower(), False)
    after = await exchange(http, "POST", url, completion())
    r.add("next request", outcome(after))
    h = await exchange(http, "GET", pair.url("decode") + "/health")
    r.add("health after", outcome(h))


# -- probes that kill, restart or freeze the prefill ---------------------------------------------------------


async def _prefill_died(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    params = await decode_params(http, pair, r)
    if params is None:
        return
    await pair.kill("prefill")
    try:
        dec = await decode_leg(http, pair, params)
        r.add("decode leg", outcome(dec))
        after = await exchange(http, "POST", pair.url("decode") + "/v1/completions", completion())
        r.add("decode's next plain request", outcome(after))
    finally:
        await pair.restart("prefill")


async def _prefill_restarted(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    # One handoff first, so the decode knows the old id (its handshake or bootstrap answer cached): the
    # stale-peer case of bug #2491, not the cold one a bootstrap query or handshake refuses at once.
    ans, _, first = await prefill_leg(http, pair)
    if first is None:
        r.add("prefill status", outcome(ans))
        return
    r.add("decode leg before the restart", outcome(await decode_leg(http, pair, first)))
    ans, _, params = await prefill_leg(http, pair)
    if params is None:
        r.add("second prefill leg", outcome(ans))
        return
    old_id = pair.engine_id("prefill")
    await pair.kill("prefill")
    await pair.restart("prefill")
    new_id = pair.engine_id("prefill")
    r.add("new engine id after restart", str(bool(old_id and new_id and old_id != new_id)).lower())
    stale = await decode_leg(http, pair, params)
    r.add("decode leg with the old id's params", outcome(stale))
    ans2, _, fresh = await prefill_leg(http, pair)
    if fresh is None:
        r.add("fresh prefill leg", outcome(ans2))
        return
    r.add("fresh params name the new id", str(fresh.get("remote_engine_id") == new_id).lower()
          if new_id else "unknown")
    dec = await decode_leg(http, pair, fresh)
    r.add("decode leg with fresh params", outcome(dec))


async def _prefill_frozen(http: aiohttp.ClientSession, pair: PairControl, r: ProbeResult) -> None:
    params = await decode_params(http, pair, r)
    if params is None:
        return
    await pair.pause("prefill")
    try:
        health = await exchange(http, "GET", pair.url("prefill") + "/health", budget_s=3.0)
        seen = outcome(health) if health.status is not None else "no answer in 3 s"
        r.add("frozen prefill's /health", seen)
        dec = await decode_leg(http, pair, params)
        r.add("decode leg while the prefill is frozen", outcome(dec))
    finally:
        await pair.resume("prefill")
    await asyncio.sleep(0.5)
    after_params = (await prefill_leg(http, pair))[2]
    if after_params is not None:
        r.add("handoff after thaw", outcome(await decode_leg(http, pair, after_params)))


PROBES: tuple[Probe, ...] = (
    Probe("health", "GET /health on each engine", _health),
    Probe("models", "GET /v1/models", _models),
    Probe("version", "GET /version", _version),
    Probe("completion", "POST /v1/completions, not streamed", _completion),
    Probe("completion_stream", "POST /v1/completions, streamed (SSE)", _completion_stream),
    Probe("chat", "POST /v1/chat/completions, plain and streamed", _chat),
    Probe("errors", "error statuses and bodies (unknown model, bad JSON, max_tokens past the context)",
          _errors),
    Probe("handoff", "prefill leg's kv_transfer_params, then the decode leg with them", _handoff),
    Probe("never_computed", "decode legs for a transfer the prefill never computed / an unknown engine id",
          _never_computed),
    Probe("abort_mid_stream", "a client closes a stream after its first chunk; the next request",
          _abort_mid_stream),
    Probe("prefill_died", "the prefill is SIGKILLed between its leg and the decode's pull", _prefill_died),
    Probe("prefill_restarted",
          "the prefill restarts with a new engine id before the decode's pull (the decode knew the old id)",
          _prefill_restarted),
    Probe("prefill_frozen", "the prefill is SIGSTOPped between its leg and the decode's pull",
          _prefill_frozen),
)


async def run_each(probes: Iterable[Any], names: list[str] | None,
                   run: Callable[[Any, ProbeResult], Awaitable[None]],
                   say: Callable[[str], None]) -> list[ProbeResult]:
    """`run(probe, result)` for each probe (those in `names`, or all), in order; a probe that raises
    says so as a fact."""
    out: list[ProbeResult] = []
    for p in [p for p in probes if names is None or p.name in names]:
        r = ProbeResult(p.name, p.question)
        start = time.monotonic()
        try:
            await run(p, r)
        except Exception as exc:
            r.add("probe error", f"{type(exc).__name__}: {exc}")
        say(f"  {p.name}: {len(r.facts)} facts in {time.monotonic() - start:.1f} s")
        out.append(r)
    return out


async def run_probes(pair: PairControl, names: list[str] | None = None,
                     say: Callable[[str], None] = lambda _line: None) -> list[ProbeResult]:
    async with aiohttp.ClientSession() as http:
        return await run_each(PROBES, names, lambda p, r: p.run(http, pair, r), say)
