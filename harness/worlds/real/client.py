"""The client side of a real-time cell: sends one planned request through the router over HTTP, under the
request's deadline, and reports what came back (`RequestDone`)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from harness.session.events import RequestDone
from harness.session.requests import RequestPlan
from harness.value_checks import error_body_problem
from pdchaos.sse import choice_text, error_text, stream_text


class RouterClient:
    def __init__(self, session: aiohttp.ClientSession, router_url: str) -> None:
        self.session = session
        self.router_url = router_url.rstrip("/")
        self._tasks: set[asyncio.Task[Any]] = set()

    async def send(self, plan: RequestPlan) -> RequestDone:
        """One request, never raising for a network or server problem; always ends by its deadline."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        t0 = time.monotonic()
        out: dict[str, Any] = {"status": 0, "ok": False, "text": None, "error": None, "ttft_s": None}
        timed_out = False
        try:
            await asyncio.wait_for(self._send(plan, out, t0), timeout=plan.deadline_s)
        except TimeoutError:
            timed_out = True
            out["ok"] = False
            out["error"] = out["error"] or f"no complete answer within the {plan.deadline_s:g} s deadline"
        except aiohttp.ClientError as e:
            out["ok"] = False
            out["error"] = f"{type(e).__name__}: {e}"
        finally:
            if task is not None:
                self._tasks.discard(task)
        return RequestDone(plan.seq, status=out["status"], ok=out["ok"], text=out["text"], error=out["error"],
                           latency_s=time.monotonic() - t0, ttft_s=out["ttft_s"], timed_out=timed_out,
                           body_problem=out.get("body_problem"))

    def cancel_all(self) -> None:
        for t in list(self._tasks):
            t.cancel()

    async def _send(self, plan: RequestPlan, out: dict[str, Any], t0: float) -> None:
        timeout = aiohttp.ClientTimeout(total=plan.deadline_s + 1.0)
        url = self.router_url + plan.endpoint
        async with self.session.post(url, json=plan.body, timeout=timeout) as resp:
            out["status"] = resp.status
            if not plan.stream or resp.status != 200 or "text/event-stream" not in resp.content_type:
                raw = await resp.read()
                out["ttft_s"] = time.monotonic() - t0
                if resp.status == 200 and plan.stream and raw.lstrip().startswith(b"data:"):
                    _finish_stream(out, *stream_text(raw, plan.chat))
                    return
                try:
                    body = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    body = None
                if resp.status != 200:
                    out["error"] = error_text(body, raw)
                    out["body_problem"] = error_body_problem(body)
                    return
                text = choice_text(body, plan.chat, streaming=False)
                out["text"] = text
                out["ok"] = text is not None
                if text is None:
                    out["error"] = f"200 without choices text: {raw[:120]!r}"
                return
            lines: list[str] = []
            async for raw_line in resp.content:
                line = raw_line.decode("utf-8", "replace")
                if out["ttft_s"] is None and line.startswith("data:") and "[DONE]" not in line:
                    out["ttft_s"] = time.monotonic() - t0
                lines.append(line)
            _finish_stream(out, *stream_text(lines, plan.chat))


def _finish_stream(out: dict[str, Any], text: str, err: str | None, done: bool) -> None:
    out["text"] = text
    if err is not None:
        out["ok"], out["error"] = False, err
    elif not done:
        out["ok"], out["error"] = False, "stream ended without [DONE]"
    else:
        out["ok"] = True
