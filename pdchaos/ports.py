"""Loopback-only port helpers. Every server in pdchaos binds 127.0.0.1."""

from __future__ import annotations

import os
import random
import socket
import threading
from collections.abc import Iterator

from pdchaos import port_claims

LOOPBACK = "127.0.0.1"

# Ports handed to servers that bind them later are drawn below the kernel's ephemeral range: a port taken
# from that range (bind to port 0) can be grabbed by any outgoing connection before the server binds it.
_POOL_LOW, _POOL_HIGH = 15000, 32000
_rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
# Ports this process handed out already. Cells running side by side (`--jobs`) would otherwise be able to get
# a port another cell holds only between its processes' lives (an engine restarting on its own ports, a
# router not bound yet); the pool is large, so the memory is only forgotten once half the pool was handed out.
# Other pdchaos processes on the host are kept off these ports by claims (`pdchaos.port_claims`).
_handed: set[int] = set()
_handed_lock = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


# A slice of the pool for this process (e.g. PDCHAOS_PORT_POOL=15000-19999): runs side by side need none
# (their claims keep them apart), but a slice keeps a run off ports that programs other than pdchaos use.
POOL_ENV = "PDCHAOS_PORT_POOL"


def pool_from_env(value: str | None) -> tuple[int, int] | None:
    """The `LOW-HIGH` port pool PDCHAOS_PORT_POOL names (None: unset); ValueError when it is not a range of
    at least 16 unprivileged ports."""
    if value is None or not value.strip():
        return None
    try:
        lo, hi = (int(x) for x in value.strip().split("-"))
    except ValueError:
        raise ValueError(f"{POOL_ENV}={value!r}: expected LOW-HIGH, e.g. 15000-19999") from None
    if not (lo >= 1024 and hi <= 65535 and hi - lo + 1 >= 16):
        raise ValueError(f"{POOL_ENV}={value!r}: need 1024 <= LOW, HIGH <= 65535 and at least 16 ports")
    return lo, hi


def _pool() -> tuple[int, int]:
    chosen = pool_from_env(os.environ.get(POOL_ENV))
    if chosen is not None:
        return chosen
    lo, hi = _POOL_LOW, _POOL_HIGH
    eph_lo, eph_hi = _ephemeral_range()
    if lo <= eph_hi and eph_lo <= hi:  # overlapping ephemeral range: stay under it
        hi = min(hi, eph_lo - 1)
    return lo, hi


def _try_bind(port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((LOOPBACK, port))
    except OSError:
        s.close()
        return None
    return s


def _reserve(n: int) -> list[socket.socket]:
    lo, hi = _pool()
    size = hi - lo + 1
    socks: list[socket.socket] = []
    with _handed_lock:
        if len(_handed) + n > size // 2:
            port_claims.release(_handed)
            _handed.clear()
        tried: set[int] = set(_handed)

        def candidates() -> Iterator[int]:
            while len(tried) < size:
                port = _rng.randint(lo, hi)
                if port not in tried:
                    tried.add(port)
                    yield port

        def bindable(port: int) -> bool:
            s = _try_bind(port)
            if s is not None:
                socks.append(s)
            return s is not None

        if port_claims.claim(candidates(), n, bindable) is None:  # no claims folder: this process's memory
            for port in candidates():
                if len(socks) >= n:
                    break
                bindable(port)
        _handed.update(int(s.getsockname()[1]) for s in socks)
    while len(socks) < n:  # pool exhausted: fall back to the kernel's choice
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((LOOPBACK, 0))
        socks.append(s)
    return socks


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the caller binds it soon after)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free ports, all held open until all are chosen so none repeats."""
    socks = _reserve(n)
    try:
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def port_is_open(port: int, host: str = LOOPBACK, timeout_s: float = 0.2) -> bool:
    """True when something accepts a TCP connection on host:port within timeout_s."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
