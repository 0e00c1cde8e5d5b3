"""Connections to workers: one shared aiohttp session for HTTP, one grpc.aio channel per gRPC address."""

from __future__ import annotations

import aiohttp

from .core import Worker
from .upstream_grpc import GrpcWorker
from .upstream_http import make_session


class Transports:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None
        self._grpc: dict[str, GrpcWorker] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        """Request traffic."""
        if self._session is None:
            self._session = make_session()
        return self._session

    @property
    def probe_session(self) -> aiohttp.ClientSession:
        """Probes get their own pool so request load never queues them (and vice versa)."""
        if self._probe_session is None:
            self._probe_session = make_session()
        return self._probe_session

    def grpc(self, worker: Worker) -> GrpcWorker:
        target = f"{worker.spec.host}:{worker.spec.port}"
        client = self._grpc.get(target)
        if client is None:
            client = GrpcWorker(target)
            self._grpc[target] = client
        return client

    async def forget(self, worker: Worker) -> None:
        """Close a removed worker's channel."""
        target = f"{worker.spec.host}:{worker.spec.port}"
        client = self._grpc.pop(target, None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        for client in list(self._grpc.values()):
            await client.close()
        self._grpc.clear()
        for sess in (self._session, self._probe_session):
            if sess is not None:
                await sess.close()
        self._session = self._probe_session = None
