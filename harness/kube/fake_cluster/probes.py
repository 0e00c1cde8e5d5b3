"""Container probes, as the kubelet runs them: `startupProbe` gates `readinessProbe`, which sets `ready`.

Handlers: `httpGet` (a 2xx or 3xx answer from podIP:port, redirects not followed), `tcpSocket` (a
connection accepted) and `exec` (exit code 0). Port names resolve against the container's own
`ports`. Timing fields are the API's (`initialDelaySeconds`, `periodSeconds` 10, `timeoutSeconds` 1,
`successThreshold` 1, `failureThreshold` 3); the first probe runs after the initial delay, then one every
period. `livenessProbe` is not run (restartPolicy is always Never here).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

Obj = dict[str, Any]


@dataclass
class ProbeTarget:
    pod_ip: str
    ports: Mapping[str, int]
    session: aiohttp.ClientSession
    # Runs a command in the container (exec probes): argv, timeout -> exit code.
    run_exec: Callable[[list[str], float], Awaitable[int]]

    def port(self, ref: Any) -> int | None:
        if isinstance(ref, int):
            return ref
        if isinstance(ref, str) and ref.isdigit():
            return int(ref)
        return self.ports.get(str(ref))


def _num(probe: Obj, key: str, default: float) -> float:
    value = probe.get(key)
    return float(value) if isinstance(value, int | float) and value >= 0 else default


async def check(probe: Obj, t: ProbeTarget) -> bool:
    timeout = max(_num(probe, "timeoutSeconds", 1), 0.1)
    try:
        if "httpGet" in probe:
            h = probe["httpGet"]
            port = t.port(h.get("port"))
            if port is None:
                return False
            scheme = str(h.get("scheme", "HTTP")).lower()
            path = str(h.get("path", "/"))
            path = path if path.startswith("/") else "/" + path
            url = f"{scheme}://{h.get('host') or t.pod_ip}:{port}{path}"
            headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or ()}
            async with t.session.get(url, headers=headers, allow_redirects=False, ssl=False,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return 200 <= resp.status < 400
        if "tcpSocket" in probe:
            s = probe["tcpSocket"]
            port = t.port(s.get("port"))
            if port is None:
                return False
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(s.get("host") or t.pod_ip, port)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        if "exec" in probe:
            return await t.run_exec(list(probe["exec"].get("command") or ()), timeout) == 0
    except (aiohttp.ClientError, OSError, TimeoutError):
        return False
    return False  # a handler the fake does not know (grpc) never succeeds


async def _sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))


async def _until_started(probe: Obj, t: ProbeTarget) -> bool:
    await asyncio.sleep(_num(probe, "initialDelaySeconds", 0))
    period = max(_num(probe, "periodSeconds", 10), 0.1)
    failures = 0
    while True:
        started = time.monotonic()
        if await check(probe, t):
            return True
        failures += 1
        if failures >= _num(probe, "failureThreshold", 3):
            return False
        await _sleep_until(started + period)


async def _readiness(probe: Obj, t: ProbeTarget, set_ready: Callable[[bool], None]) -> None:
    await asyncio.sleep(_num(probe, "initialDelaySeconds", 0))
    period = max(_num(probe, "periodSeconds", 10), 0.1)
    need_ok, need_fail = _num(probe, "successThreshold", 1), _num(probe, "failureThreshold", 3)
    ready, oks, fails = False, 0, 0
    while True:
        started = time.monotonic()
        if await check(probe, t):
            oks, fails = oks + 1, 0
            if not ready and oks >= need_ok:
                ready = True
                set_ready(True)
        else:
            oks, fails = 0, fails + 1
            if ready and fails >= need_fail:
                ready = False
                set_ready(False)
        await _sleep_until(started + period)


async def run_probes(container: Obj, t: ProbeTarget, set_started: Callable[[], None],
                     set_ready: Callable[[bool], None], startup_failed: Callable[[], None]) -> None:
    """Runs until cancelled (the container exited or the pod is going away)."""
    startup = container.get("startupProbe")
    if startup and not await _until_started(startup, t):
        startup_failed()
        return
    set_started()
    readiness = container.get("readinessProbe")
    if readiness is None:
        set_ready(True)
        return
    await _readiness(readiness, t, set_ready)
