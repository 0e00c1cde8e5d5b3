"""Which worker URLs the router accepts (worker API and command line): the worker API must not be a way to
turn the router against itself or against the network.

- No credentials in a URL (`http://user:pw@host:port`): they would show in `GET /workers` and make a second
  spelling of a registered engine.
- Loopback hosts only (pdchaos is loopback-only by design), unless `--allow-worker-host HOST` names the
  host: a registered URL is probed and sent traffic at once, so any host is a port scanner's target list.
- Not the router itself: a request would recurse through it without end.
- One engine, one worker: `localhost` and `127.0.0.1` on the same port are the same engine.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import urlsplit

_LOCALHOST_NAMES = frozenset({"localhost", "localhost.localdomain"})


class Endpoint(NamedTuple):
    """Where a worker URL points, spelled one way: (scheme, host, port)."""

    scheme: str
    host: str
    port: int


def is_loopback(host: str) -> bool:
    if host.lower() in _LOCALHOST_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint(url: str) -> Endpoint | None:
    """The URL's endpoint with loopback names folded to 127.0.0.1; None when it cannot be parsed."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if not host:
        return None
    if host in _LOCALHOST_NAMES:
        host = "127.0.0.1"
    scheme = parts.scheme.lower()
    return Endpoint(scheme, host, port if port is not None else (80 if scheme == "http" else 0))


def url_problem(url: object, router_port: int | None, allowed_hosts: Iterable[str] = ()) -> str | None:
    """Why this worker URL is refused (a 400 message), or None. `router_port`: the port this router serves
    on (None: not bound yet)."""
    if not isinstance(url, str) or not url:
        return None  # the spec parser says what is wrong with it
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.username is not None or parts.password is not None:
        return "worker URLs must not carry credentials (user:password@)"
    host = parts.hostname or ""
    allowed = {h.lower() for h in allowed_hosts}
    if host and not is_loopback(host) and host.lower() not in allowed:
        return (f"worker host {host!r} is not a loopback address; pdchaos-router sends traffic to loopback "
                f"only unless --allow-worker-host names the host")
    ep = endpoint(url)
    if ep is not None and router_port and is_loopback(ep.host) and ep.port == router_port:
        return f"{url!r} is this router itself: requests would loop through it"
    return None


def same_engine(url: str, other: str) -> bool:
    """Two URLs of one engine (`localhost` vs `127.0.0.1`, letter case, a trailing slash)."""
    a, b = endpoint(url), endpoint(other)
    return a is not None and a == b
