"""HTTP legs to OpenAI-compatible engines, each under a deadline."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp

from .core import Delivery
from .errors import UpstreamError


def make_session() -> aiohttp.ClientSession:
    # limit=0: a wedged backend holding many sockets must not starve requests to healthy workers (bug #12).
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=False),
        auto_decompress=True,
    )


@contextmanager
def _upstream_errors(url: str, timeout_s: float) -> Iterator[None]:
    """aiohttp's failures of a leg to `url` as UpstreamError: refused (not sent), overran, or broke (502)."""
    try:
        yield
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise _not_sent(url, exc) from exc
    except TimeoutError as exc:
        raise UpstreamError(f"{url} timed out after {timeout_s:g}s", 504, "upstream_timeout") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamError(f"{url}: {exc.__class__.__name__}: {exc}", status=502) from exc


async def post_json(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """POST and decode a JSON answer; any non-2xx, bad JSON, refusal or overrun -> UpstreamError."""
    with _upstream_errors(url, timeout_s):
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            raw = await resp.read()
            try:
                payload = json.loads(raw) if raw else {}
            except ValueError:  # not JSON, or bytes that are no text at all
                payload = {"raw": raw[:200].decode("utf-8", "replace")}
            if resp.status >= 400:
                raise _answered(url, resp.status, payload)
            if not isinstance(payload, dict):
                raise UpstreamError(f"{url} answered non-object JSON")
            return payload


class HttpStream:
    """An open streaming leg: status known, body relayed chunk by chunk under the same deadline."""

    def __init__(self, resp: aiohttp.ClientResponse, url: str, timeout_s: float) -> None:
        self._resp = resp
        self.url = url
        self.status = resp.status
        self._timeout_s = timeout_s

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._resp.content.iter_any():
                yield data
        except TimeoutError as exc:
            msg = f"{self.url} stream overran {self._timeout_s:g}s"
            raise UpstreamError(msg, 504, "upstream_timeout") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{self.url} stream broke: {exc}") from exc
        finally:
            self._resp.release()

    def close(self) -> None:
        self._resp.close()


async def open_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float
) -> HttpStream:
    with _upstream_errors(url, timeout_s):
        resp = await session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s))
    if resp.status >= 400:
        try:
            raw = await resp.read()
            payload: Any = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, aiohttp.ClientError, TimeoutError):
            payload = None
        finally:
            resp.release()
        raise _answered(url, resp.status, payload)
    return HttpStream(resp, url, timeout_s)


async def get_status(session: aiohttp.ClientSession, url: str, timeout_s: float | None) -> int:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        await resp.read()
        return resp.status


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float | None) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        if resp.status >= 400:
            raise UpstreamError(f"{url} answered {resp.status}", status=resp.status)
        return await resp.json(content_type=None)


def _not_sent(url: str, exc: aiohttp.ClientError) -> UpstreamError:
    """No connection was made (refused, unreachable, connect timeout): the worker never saw the request."""
    return UpstreamError(f"{url}: {exc.__class__.__name__}: {exc}", status=502, delivery=Delivery.NOT_SENT)


def _answered(url: str, status: int, payload: Any) -> UpstreamError:
    """A worker's error answer, for the client: a relayed 400 keeps the engine's own reason."""
    err = payload.get("error") if isinstance(payload, dict) else None
    message = err.get("message") if isinstance(err, dict) else err
    said = f": {message[:500]}" if isinstance(message, str) and message else ""
    # A worker's 4xx is the client's fault (bad params) and is passed on; a worker's 5xx is a gateway failure.
    relayed = status if 400 <= status < 500 else 502
    return UpstreamError(f"{url} answered {status}{said}", status=relayed, body=payload,
                         delivery=Delivery.ANSWERED, worker_status=status)
