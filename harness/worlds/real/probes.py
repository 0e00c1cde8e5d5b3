"""What the real world looks at to verify a fault: an HTTP answer, a port, a TCP conversation, a process
state. Every probe is bounded by its own deadline."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from fake_engines.core.calls import CALLER_HEADER, CALLER_METADATA, HARNESS
from pdchaos.ports import LOOPBACK, port_is_open
from pdchaos.waiting import poll_until

PROBE_TIMEOUT_S = 1.0
# A wedged link answers nothing for at least this long before the probe calls it silent.
SILENT_WINDOW_S = 0.3
# Every probe of an engine says it is the harness's, so the engine's call records do not take it for the
# router's (CONTRACTS.md §1, engine call record).
HARNESS_HEADERS = {CALLER_HEADER: HARNESS}
HARNESS_METADATA = ((CALLER_METADATA, HARNESS),)
# Bytes a TCP probe sends: an HTTP request most servers answer at once (an HTTP/2 or KV server closes on it).
PROBE_BYTES = f"GET /health HTTP/1.0\r\nHost: pdchaos\r\n{CALLER_HEADER}: {HARNESS}\r\n\r\n".encode()


async def http_probe(url: str, timeout_s: float) -> str:
    """'ok:<status>', 'refused', 'timeout' or 'error:<what>' for one GET, marked as the harness's."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession() as s, s.get(url, timeout=timeout, headers=HARNESS_HEADERS) as r:
            await r.read()
            return f"ok:{r.status}"
    except aiohttp.ClientConnectorError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except aiohttp.ClientError as e:
        return f"error:{type(e).__name__}"


async def grpc_health_probe(target: str, timeout_s: float) -> str:
    """The VllmEngine `HealthCheck` of `host:port` as `http_probe` words: 'ok:200' (healthy), 'ok:503'
    (answered unhealthy), 'refused', 'timeout' or 'error:<code>'."""
    import grpc

    from pdchaos.proto import vllm_engine_pb2 as pb
    from pdchaos.proto import vllm_engine_pb2_grpc as pbg

    try:
        async with grpc.aio.insecure_channel(target) as channel:
            reply = await pbg.VllmEngineStub(channel).HealthCheck(
                pb.HealthCheckRequest(), timeout=timeout_s, metadata=HARNESS_METADATA
            )
            return "ok:200" if reply.healthy else "ok:503"
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "timeout"
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            return "refused"
        return f"error:{e.code().name}"


async def port_open(port: int, host: str = LOOPBACK) -> bool:
    return await asyncio.to_thread(port_is_open, port, host)


async def port_closed(port: int, host: str = LOOPBACK) -> bool:
    return not await port_open(port, host)


async def sees_refused(port: int, window_s: float, host: str = LOOPBACK) -> bool:
    """True if a connection to `host:port` is refused at some point within `window_s` (the engine was
    down)."""
    return bool(await poll_until(lambda: port_closed(port, host), max(window_s, 0.2), interval_s=0.03))


async def tcp_probe(port: int, window_s: float = SILENT_WINDOW_S, host: str = LOOPBACK) -> str:
    """What one connection to `host:port` sees: `refused`, `silent` (accepted, nothing back within
    window_s), `reset`, `closed` (ended with no data) or `answered`."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_S)
    except ConnectionRefusedError:
        return "refused"
    except (TimeoutError, OSError) as e:
        return f"error:{type(e).__name__}"
    try:
        writer.write(PROBE_BYTES)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(1), window_s)
        return "answered" if data else "closed"
    except TimeoutError:
        return "silent"
    except ConnectionResetError:
        return "reset"
    except OSError as e:
        return f"error:{type(e).__name__}"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 0.5)


def process_state(pid: int) -> str | None:
    """Linux process state letter (R, S, T for stopped, Z...) or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the state follows the last ')'.
    rest = data.rsplit(")", 1)[-1].split()
    return rest[0] if rest else None
