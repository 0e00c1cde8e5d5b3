"""Addresses: pod IPs on the loopback network, fake ClusterIPs, node ports.

Linux routes all of 127.0.0.0/8 to `lo`, so every pod can have its own address and bind the ports its
containers declare (two pods both serving on 8000, as on a cluster) without network namespaces or root.
A pod IP is never handed out twice while the fake runs: a pod created again under the same name gets a
new address, as on a real cluster, and a stale connection cannot reach the new pod by accident.

ClusterIPs (10.96.0.0/12, as kubeadm's default) are written into Services for realism only: nothing
routes them. Reach a Service through its node port or the API server's service proxy.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import struct
from pathlib import Path

# Random per fake, so that two fakes on one host (parallel test runs) rarely start on the same addresses;
# an address that some socket already uses (`/proc/net/tcp`) is skipped as well.
_FIRST_OCTET3 = range(100, 250)


def loopback_addresses_in_use() -> set[str]:
    """Local addresses of every TCP socket on the host (listening or connected); empty if unreadable."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return set()
    used: set[str] = set()
    for line in lines:
        fields = line.split()
        if len(fields) > 1:
            # The kernel prints the big-endian address as a host-order integer.
            raw = int(fields[1].split(":")[0], 16)
            used.add(socket.inet_ntoa(struct.pack("=I", raw)))
    return used


class PodIpPool:
    def __init__(self, start: str | None = None) -> None:
        first = start or f"127.0.{random.choice(_FIRST_OCTET3)}.1"
        self._next = int(ipaddress.IPv4Address(first))
        self._last = int(ipaddress.IPv4Address("127.255.255.254"))

    def _take(self) -> str:
        while True:
            if self._next > self._last:
                raise RuntimeError("the fake cluster ran out of loopback pod addresses")
            ip = ipaddress.IPv4Address(self._next)
            self._next += 1
            # .0 and .255 look like network and broadcast addresses to people and some tools: skip them.
            if ip.packed[3] not in (0, 255):
                return str(ip)

    async def allocate(self) -> str:
        # Each candidate is taken before the check, so two creates in flight never get the same one.
        while True:
            ip = self._take()
            used = await asyncio.to_thread(loopback_addresses_in_use)
            if ip not in used:
                return ip


class ClusterIpPool:
    def __init__(self) -> None:
        self._next = int(ipaddress.IPv4Address("10.96.0.10"))

    def allocate(self) -> str:
        ip = ipaddress.IPv4Address(self._next)
        self._next += 1
        if ip.packed[3] in (0, 255):
            return self.allocate()
        return str(ip)


def reserve_port(host: str, port: int = 0) -> socket.socket:
    """A socket bound to host:port (0: a port the OS picks) with SO_REUSEADDR. Left without listening, it
    holds the port so that nothing else binds it, while a connection to it is refused (the kernel answers
    RST when no socket listens); a listener bound later with SO_REUSEADDR shares the port with it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
