"""The I/O of the health loop: one probe, one metadata read. Decisions stay in `core`.

Probe: HTTP `GET /health` (any 2xx) or gRPC `HealthCheck.healthy`. Metadata: gRPC `GetServerInfo`
(kv_engine_id, kv_connector, kv_role, data_parallel_size, uptime_seconds), or for HTTP Mooncake prefills the
bootstrap server's `GET /query`. A read with `timeout_s=None` has no deadline: only bug `metadata_no_deadline`
asks for that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import aiohttp
import grpc

from .core import MetadataRead, ReadOutcome, Transport, Worker, parse_bootstrap_query
from .errors import UpstreamError
from .transports import Transports
from .upstream_grpc import we_are_cancelled
from .upstream_http import get_json, get_status

log = logging.getLogger(__name__)


class Prober:
    def __init__(self, transports: Transports) -> None:
        self._t = transports

    async def probe(self, worker: Worker, timeout_s: float) -> bool:
        """True when the worker answers healthy within timeout_s; every failure mode is just False."""
        try:
            async with asyncio.timeout(timeout_s):
                if worker.spec.transport is Transport.GRPC:
                    return await self._t.grpc(worker).health(timeout_s)
                url = f"http://{worker.spec.host}:{worker.spec.port}/health"
                status = await get_status(self._t.probe_session, url, timeout_s)
                return 200 <= status < 300
        except (TimeoutError, aiohttp.ClientError, grpc.aio.AioRpcError, OSError):
            return False
        except Exception:  # whatever else breaks, a probe is a yes/no answer and the loop goes on
            log.warning("probe of %s raised", worker.id, exc_info=True)
            return False
        except asyncio.CancelledError:
            if we_are_cancelled():
                raise
            return False  # the call, not this probe, was cancelled (its channel closed)

    async def read_metadata(self, worker: Worker, timeout_s: float | None) -> MetadataRead:
        """One bounded metadata read, as the core's MetadataRead (never raises for worker trouble)."""
        t0 = time.monotonic()
        try:
            if timeout_s is None:
                read = await self._read(worker, None)
            else:
                async with asyncio.timeout(timeout_s):
                    read = await self._read(worker, timeout_s)
        except TimeoutError:
            read = MetadataRead(ReadOutcome.TIMEOUT)
        except (aiohttp.ClientError, OSError, ValueError, grpc.aio.AioRpcError):
            read = MetadataRead(ReadOutcome.ERROR)
        except Exception:  # an unexpected failure is still just a failed read, retried next probe
            log.warning("metadata read of %s raised", worker.id, exc_info=True)
            read = MetadataRead(ReadOutcome.ERROR)
        except asyncio.CancelledError:
            if we_are_cancelled():
                raise
            read = MetadataRead(ReadOutcome.ERROR)
        return dataclasses.replace(read, duration_s=time.monotonic() - t0)

    async def _read(self, worker: Worker, timeout_s: float | None) -> MetadataRead:
        if worker.spec.transport is Transport.GRPC:
            return await self._read_grpc(worker, timeout_s)
        return await self._read_bootstrap(worker, timeout_s)

    async def _read_grpc(self, worker: Worker, timeout_s: float | None) -> MetadataRead:
        client = self._t.grpc(worker)
        try:
            info = await client.server_info(timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return MetadataRead(ReadOutcome.TIMEOUT)
            # Server info failed: whether the engine still answers other metadata tells a partial read
            # (the case bug #3 mishandles) from a plain error.
            try:
                await client.stub.GetModelInfo(_model_info_request(), timeout=timeout_s)
            except grpc.aio.AioRpcError:
                return MetadataRead(ReadOutcome.ERROR)
            return MetadataRead(ReadOutcome.PARTIAL)
        return MetadataRead(
            ReadOutcome.COMPLETE,
            engine_id=info.kv_engine_id or None,
            connector=info.kv_connector,
            kv_role=info.kv_role or None,
            dp_size=info.data_parallel_size or None,
            uptime_s=info.uptime_seconds if info.uptime_seconds > 0 else None,
        )

    async def _read_bootstrap(self, worker: Worker, timeout_s: float | None) -> MetadataRead:
        port = worker.spec.bootstrap_port
        if port is None:
            # No bootstrap server (an HTTP decode): no id to read, so a complete read without one.
            return MetadataRead(ReadOutcome.COMPLETE)
        url = f"http://{worker.spec.host}:{port}/query"
        try:
            payload = await get_json(self._t.probe_session, url, timeout_s)
        except (aiohttp.ClientError, UpstreamError, ValueError, OSError):
            return MetadataRead(ReadOutcome.ERROR)
        return parse_bootstrap_query(payload)


def _model_info_request() -> Any:
    from pdchaos.proto import vllm_engine_pb2

    return vllm_engine_pb2.GetModelInfoRequest()
