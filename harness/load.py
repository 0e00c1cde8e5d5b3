"""Client load through the router: open-loop (Poisson arrivals) or closed-loop (N clients back to back).

Each request's prompt starts with the tag `[pdchaos:<run>:<seq>]` so the engines' handoff records can be
joined to it. `plan_request` (pure) decides what to send; `LoadGenerator` sends it with a per-request client
deadline and records `request_invoked` / `request_completed`, comparing the answer with the text a correct
handoff produces.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.history import HistoryRecorder
from harness.scenario import Workload

# Plain words only: the fake engines' tokenizer round-trips them and the tag stays intact.
_WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
    "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
    "whiskey", "xray", "yankee", "zulu", "river", "stone", "cloud", "maple", "cedar", "ember",
)

ExpectFn = Callable[["RequestPlan"], str | None]


@dataclass(frozen=True)
class RequestPlan:
    seq: int
    tag: str
    endpoint: str  # "/v1/completions" | "/v1/chat/completions"
    stream: bool
    prompt: str
    max_tokens: int
    deadline_s: float
    body: dict[str, Any]


def make_tag(run_id: str, seq: int) -> str:
    return f"[pdchaos:{run_id}:{seq}]"


def plan_request(seq: int, run_id: str, rng: random.Random, w: Workload, model: str) -> RequestPlan:
    """The seq-th request of a run: endpoint and streaming by the workload's fractions, a tagged prompt."""
    tag = make_tag(run_id, seq)
    n = rng.randint(w.prompt_words[0], w.prompt_words[1])
    prompt = tag + " " + " ".join(rng.choice(_WORDS) for _ in range(n))
    chat = rng.random() < w.chat_fraction
    stream = rng.random() < w.stream_fraction
    body: dict[str, Any] = {"model": model, "max_tokens": w.max_tokens, "stream": stream}
    if chat:
        endpoint = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        endpoint = "/v1/completions"
        body["prompt"] = prompt
    return RequestPlan(seq, tag, endpoint, stream, prompt, w.max_tokens, w.deadline_s, body)


def expected_text(plan: RequestPlan) -> str | None:
    """What a correct handoff returns (None when the fake engines' generator is not importable)."""
    try:
        from fake_engines.core.generator import expected_chat_completion, expected_completion
    except ImportError:
        return None
    if plan.endpoint.endswith("chat/completions"):
        return expected_chat_completion(plan.body["messages"], plan.max_tokens, None)
    return expected_completion(plan.prompt, plan.max_tokens, None)


@dataclass
class Outcome:
    status: int = 0
    ok: bool = False
    text: str | None = None
    error: str | None = None
    ttft_s: float | None = None
    timed_out: bool = False


def _choice_text(obj: Any, chat: bool, streaming: bool) -> str | None:
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    if not chat:
        t = c.get("text")
        return t if isinstance(t, str) else None
    part = c.get("delta" if streaming else "message")
    if isinstance(part, dict):
        t = part.get("content")
        return t if isinstance(t, str) else None
    return None


def parse_sse(lines: list[str], chat: bool) -> tuple[str, str | None, bool]:
    """(text, error, saw_done) from the `data:` lines of an SSE body (pure: used for the streaming path)."""
    text: list[str] = []
    error: str | None = None
    done = False
    for line in lines:
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            error = error or f"bad SSE chunk: {payload[:80]}"
            continue
        if isinstance(obj, dict) and obj.get("error") is not None:
            err = obj["error"]
            error = error or (str(err.get("message", err)) if isinstance(err, dict) else str(err))
            continue
        piece = _choice_text(obj, chat, streaming=True)
        if piece:
            text.append(piece)
    return "".join(text), error, done


@dataclass
class LoadStats:
    invoked: int = 0
    completed: int = 0
    ok: int = 0
    by_status: dict[int, int] = field(default_factory=dict)


class LoadGenerator:
    """Sends a workload to `router_url`, recording into `history`. `completed` feeds timeline conditions."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        router_url: str,
        workload: Workload,
        history: HistoryRecorder,
        run_id: str,
        seed: int = 0,
        model: str = "pdchaos-fake",
        expect: ExpectFn = expected_text,
    ) -> None:
        self.session = session
        self.router_url = router_url.rstrip("/")
        self.w = workload
        self.history = history
        self.run_id = run_id
        self.rng = random.Random(seed)
        self.model = model
        self.expect = expect
        self.stats = LoadStats()
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def completed(self) -> int:
        return self.stats.completed

    def _next_plan(self) -> RequestPlan:
        self._seq += 1
        return plan_request(self._seq, self.run_id, self.rng, self.w, self.model)

    async def run(self, duration_s: float | None = None) -> LoadStats:
        """Generate load for the workload's duration, then wait for every request to finish (each has a
        deadline, so this ends)."""
        dur = self.w.duration_s if duration_s is None else duration_s
        loop = asyncio.get_running_loop()
        end = loop.time() + dur
        if self.w.mode == "closed":
            await asyncio.gather(*(self._client(end) for _ in range(self.w.concurrency)))
        else:
            while True:
                gap = self.rng.expovariate(self.w.rate_rps)
                if loop.time() + gap >= end:
                    break
                await asyncio.sleep(gap)
                task = asyncio.create_task(self.one(self._next_plan()))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
        return self.stats

    async def _client(self, end: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < end:
            await self.one(self._next_plan())
            if self.w.think_time_s > 0:
                await asyncio.sleep(self.w.think_time_s)

    async def cancel(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def one(self, plan: RequestPlan) -> Outcome:
        """Send one request and record it; never raises for a network or server problem."""
        self.stats.invoked += 1
        self.history.request_invoked(
            plan.seq, plan.tag, stream=plan.stream, endpoint=plan.endpoint, deadline_s=plan.deadline_s,
            prompt_chars=len(plan.prompt),
        )
        t0 = time.monotonic()
        out = Outcome()
        try:
            await asyncio.wait_for(self._send(plan, out, t0), timeout=plan.deadline_s)
        except TimeoutError:
            out.timed_out = True
            out.ok = False
            out.error = out.error or f"no complete answer within the {plan.deadline_s:g} s deadline"
        except aiohttp.ClientError as e:
            out.ok = False
            out.error = f"{type(e).__name__}: {e}"
        latency = time.monotonic() - t0
        text_ok: bool | None = None
        if out.ok and out.text is not None:
            want = self.expect(plan)
            text_ok = None if want is None else out.text == want
        self.stats.completed += 1
        self.stats.ok += int(out.ok)
        self.stats.by_status[out.status] = self.stats.by_status.get(out.status, 0) + 1
        self.history.request_completed(
            plan.seq, plan.tag, status=out.status, ok=out.ok, latency_s=round(latency, 6),
            ttft_s=None if out.ttft_s is None else round(out.ttft_s, 6), error=out.error, text_ok=text_ok,
            timed_out=out.timed_out,
        )
        return out

    async def _send(self, plan: RequestPlan, out: Outcome, t0: float) -> None:
        chat = plan.endpoint.endswith("chat/completions")
        timeout = aiohttp.ClientTimeout(total=plan.deadline_s + 1.0)
        url = self.router_url + plan.endpoint
        async with self.session.post(url, json=plan.body, timeout=timeout) as resp:
            out.status = resp.status
            if not plan.stream or resp.status != 200 or "text/event-stream" not in resp.content_type:
                raw = await resp.read()
                out.ttft_s = time.monotonic() - t0
                try:
                    body = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    body = None
                if resp.status == 200 and plan.stream and raw.lstrip().startswith(b"data:"):
                    text, err, done = parse_sse(raw.decode("utf-8", "replace").splitlines(), chat)
                    self._finish_stream(out, text, err, done)
                    return
                if resp.status != 200:
                    out.ok = False
                    out.error = _error_text(body, raw)
                    return
                text = _choice_text(body, chat, streaming=False)
                out.text = text
                out.ok = text is not None
                if text is None:
                    out.error = f"200 without choices text: {raw[:120]!r}"
                return
            lines: list[str] = []
            async for raw_line in resp.content:
                line = raw_line.decode("utf-8", "replace")
                if out.ttft_s is None and line.startswith("data:") and "[DONE]" not in line:
                    out.ttft_s = time.monotonic() - t0
                lines.append(line)
            text, err, done = parse_sse(lines, chat)
            self._finish_stream(out, text, err, done)

    @staticmethod
    def _finish_stream(out: Outcome, text: str, err: str | None, done: bool) -> None:
        out.text = text
        if err is not None:
            out.ok, out.error = False, err
        elif not done:
            out.ok, out.error = False, "stream ended without [DONE]"
        else:
            out.ok = True


def _error_text(body: Any, raw: bytes) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        e = body["error"]
        code = e.get("code")
        msg = e.get("message")
        return f"{code}: {msg}" if code else str(msg)
    return raw[:200].decode("utf-8", "replace") or "empty body"
