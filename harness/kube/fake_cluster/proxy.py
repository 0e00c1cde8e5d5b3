"""The API server's service proxy: `/api/v1/namespaces/NS/services/NAME[:PORT]/proxy/PATH`.

A request (any method, its query, body and headers less the hop-by-hop ones, `Authorization` and
`Host`) goes to one ready endpoint of the Service port (round-robin); its status, body and content type
come back. No ready endpoint: 503 `no endpoints available for service "NAME"`; an endpoint that refuses:
503; no answer within the timeout: 504.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from harness.kube.fake_cluster.services import RoundRobin, endpoints, service_port
from harness.kube.fake_cluster.store import ApiError, Store

Obj = dict[str, Any]
UPSTREAM_TIMEOUT_S = 30.0
_DROP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                   "trailers", "transfer-encoding", "upgrade", "authorization", "host", "content-length"})


def _split_name(ref: str) -> tuple[str, str | None]:
    """`NAME`, `NAME:PORT` or `SCHEME:NAME:PORT` -> (NAME, PORT or None)."""
    parts = ref.split(":")
    if len(parts) == 3:
        if parts[0] not in ("", "http"):
            raise ApiError(400, "BadRequest",
                           f"the fake cluster's service proxy speaks only http, not {parts[0]}")
        parts = parts[1:]
    return parts[0], (parts[1] if len(parts) > 1 and parts[1] else None)


class ServiceProxy:
    def __init__(self, store: Store, session: aiohttp.ClientSession) -> None:
        self.store = store
        self.session = session
        self._rr: dict[tuple[str, str, str], RoundRobin] = {}

    async def handle(self, request: web.Request, namespace: str, ref: str, raw_tail: str) -> web.Response:
        name, port_ref = _split_name(ref)
        svc = self.store.get("services", namespace, name)
        port = service_port(svc, port_ref)
        if port is None:
            raise ApiError(404, "NotFound", f'no service port "{port_ref}" found for service "{name}"')
        eps = endpoints(self.store, svc, port)
        rr = self._rr.setdefault((namespace, name, str(port["port"])), RoundRobin())
        ep = rr.pick(eps)
        if ep is None:
            raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
        url = URL(f"http://{ep[0]}:{ep[1]}{raw_tail or '/'}"
                  + (f"?{request.query_string}" if request.query_string else ""), encoded=True)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        body = await request.read()
        try:
            async with self.session.request(
                    request.method, url, headers=headers, data=body or None, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_S)) as resp:
                data = await resp.read()
                out = web.Response(status=resp.status, body=data)
                if resp.headers.get("Content-Type"):
                    out.headers["Content-Type"] = resp.headers["Content-Type"]
                return out
        except TimeoutError as e:
            raise ApiError(504, "Timeout", f'service "{name}": no answer from {ep[0]}:{ep[1]} within '
                           f"{UPSTREAM_TIMEOUT_S:g} s") from e
        except (aiohttp.ClientError, OSError) as e:
            raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: dial tcp "
                           f"{ep[0]}:{ep[1]}: {e}") from e
