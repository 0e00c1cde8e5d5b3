"""Node ports: kube-proxy's part for Services of type NodePort and LoadBalancer, on the fake's loop.

Each port of such a Service gets a node port on the node's address (the requested `nodePort` if it is
free, else one the OS picks: the 30000-32767 range cannot be promised on a shared host). Connections to
it are piped to a ready endpoint (round-robin), like kube-proxy's DNAT. When the Service has no ready
endpoint the port refuses connections, like kube-proxy's REJECT rule: the listening socket is closed, and
bound again when an endpoint becomes ready (re-evaluated on every pod and Service change). A socket bound
without listening holds the port meanwhile (connections to it are refused by the kernel); if binding
the listener fails anyway, it is retried every 100 ms. Established connections are left alone when
endpoints change: one whose pod dies ends when the pod's sockets close.

kube-proxy's DNAT hands the client's SYN to the pod, so a pod with nothing listening on the target port
answers it with a reset: the client sees "connection refused" (an engine closing its listeners for a
restart, say). A userspace forwarder would accept first and learn only afterwards, so the fake reads the
host's listening sockets (netlink sock_diag, else /proc/net/tcp) every `LISTEN_POLL_S` and counts an
endpoint only while something listens on its address and port: the node port refuses within that delay
too. A connection made in that window is accepted and then closed where a real cluster refuses it (the
one place a client can tell the fake's node ports from kube-proxy's).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import struct
import sys
from pathlib import Path
from typing import Any

from harness.kube.fake_cluster.network import reserve_port
from harness.kube.fake_cluster.services import NODE_PORT_TYPES, RoundRobin, endpoints
from harness.kube.fake_cluster.store import Store, invalid

log = logging.getLogger(__name__)
Obj = dict[str, Any]
CONNECT_TIMEOUT_S = 5.0
REBIND_RETRY_S = 0.1
LISTEN_POLL_S = 0.01
_CHUNK = 64 * 1024
# A row of /proc/net/tcp in state 0A (LISTEN): its local address and port, in hex.
_LISTEN_ROW = re.compile(r"^\s*\d+: ([0-9A-F]{8}):([0-9A-F]{4}) [0-9A-F]{8}:[0-9A-F]{4} 0A ", re.MULTILINE)


def listening_sockets() -> set[tuple[str, int]] | None:
    """Every IPv4 (address, port) in LISTEN state on this host: from the kernel's socket diagnostics
    (netlink, about 40 us), else /proc/net/tcp (milliseconds: the kernel prints every socket); None
    where neither can be read."""
    try:
        return _listening_by_netlink()
    except OSError:
        pass
    try:
        text = Path("/proc/net/tcp").read_text()
    except OSError:
        return None
    out = set()
    for addr, port in _LISTEN_ROW.findall(text):
        raw = bytes.fromhex(addr)
        ip = ".".join(str(b) for b in (reversed(raw) if sys.byteorder == "little" else raw))
        out.add((ip, int(port, 16)))
    return out


# NETLINK_SOCK_DIAG: one dump request for TCP/IPv4 sockets in LISTEN, answered as inet_diag_msg records.
_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN_STATE = 10
_NLMSG_HEADER = struct.Struct("=IHHII")


def _listening_by_netlink() -> set[tuple[str, int]]:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _SOCK_DIAG)
    try:
        sock.settimeout(1.0)
        # inet_diag_req_v2: family, protocol, ext, pad, states; then an all-zero inet_diag_sockid (48 bytes).
        states = 1 << _TCP_LISTEN_STATE
        req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, states) + bytes(48)
        sock.send(_NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(req), _SOCK_DIAG_BY_FAMILY,
                                     _NLM_F_REQUEST_DUMP, 1, 0) + req)
        out: set[tuple[str, int]] = set()
        while True:
            data = sock.recv(1 << 16)
            off = 0
            while off + _NLMSG_HEADER.size <= len(data):
                length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, off)
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR or length < _NLMSG_HEADER.size:
                    raise OSError("sock_diag refused the dump")
                # inet_diag_msg: family, state, timer, retrans, then the sockid (sport, dport big-endian;
                # the source address first in its 16 bytes).
                body = off + _NLMSG_HEADER.size
                (sport,) = struct.unpack_from("!H", data, body + 4)
                out.add((socket.inet_ntoa(data[body + 8:body + 12]), sport))
                off += (length + 3) & ~3
            if not data:
                raise OSError("sock_diag ended without its done message")
    finally:
        sock.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, other: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (OSError, RuntimeError):
        # A reset on one side ends the connection on both, as a dropped NAT flow would.
        dst.transport.abort()
        other.transport.abort()


class _Listener:
    def __init__(self, owner: NodePorts, svc: Obj, port: Obj, placeholder: socket.socket) -> None:
        self.owner = owner
        self.svc = svc
        self.port = port
        self.placeholder = placeholder
        self.server: asyncio.AbstractServer | None = None
        self.rr = RoundRobin()
        self.kick = asyncio.Event()
        self.kick.set()
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"node port {self.node_port}")

    @property
    def node_port(self) -> int:
        return int(self.port["nodePort"])

    def endpoints(self) -> list[tuple[str, int]]:
        eps = endpoints(self.owner.store, self.svc, self.port)
        live = self.owner.listening
        if live is None:
            return eps
        return [(ip, port) for ip, port in eps if (ip, port) in live or ("0.0.0.0", port) in live]

    async def _run(self) -> None:
        failing = False
        while True:
            await self.kick.wait()
            self.kick.clear()
            want = bool(self.endpoints())
            if want and self.server is None:
                try:
                    self.server = await self._listen()
                    failing = False
                except OSError as e:
                    (log.debug if failing else log.warning)(
                        "node port %s:%d of service %s: cannot listen (%s); retrying every %.1f s",
                        self.owner.host, self.node_port, self.svc["metadata"]["name"], e, REBIND_RETRY_S)
                    failing = True
                    await asyncio.sleep(REBIND_RETRY_S)
                    self.kick.set()
            elif not want and self.server is not None:
                self.server.close()
                self.server = None

    async def _listen(self) -> asyncio.AbstractServer:
        sock = reserve_port(self.owner.host, self.node_port)
        try:
            sock.setblocking(False)
            return await asyncio.start_server(self._handle, sock=sock)
        except BaseException:
            sock.close()
            raise

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns = self.owner.connections
        conns.add(writer)
        try:
            ep = self.rr.pick(self.endpoints())
            if ep is None:
                return
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    up_reader, up_writer = await asyncio.open_connection(*ep)
            except (OSError, TimeoutError):
                return
            conns.add(up_writer)
            try:
                await asyncio.gather(_pipe(reader, up_writer, writer), _pipe(up_reader, writer, up_writer))
            finally:
                up_writer.close()
                conns.discard(up_writer)
        finally:
            writer.close()
            conns.discard(writer)

    def stop(self) -> None:
        self.task.cancel()
        if self.server is not None:
            self.server.close()
            self.server = None
        self.placeholder.close()


class NodePorts:
    def __init__(self, store: Store, host: str) -> None:
        self.store = store
        self.host = host
        self.connections: set[asyncio.StreamWriter] = set()
        self._by_service: dict[str, list[_Listener]] = {}
        self.listening: set[tuple[str, int]] | None = listening_sockets()
        self._watcher: asyncio.Task[None] | None = None
        store.listeners.append(self._on_change)

    async def _watch_listening(self) -> None:
        """Kick every listener when what listens on the host changes (see the module's docstring)."""
        while self._by_service:
            now = await asyncio.to_thread(listening_sockets)
            if now != self.listening:
                self.listening = now
                self._kick_all()
            await asyncio.sleep(LISTEN_POLL_S)
        self._watcher = None

    def _kick_all(self) -> None:
        for listeners in self._by_service.values():
            for listener in listeners:
                listener.kick.set()

    def _on_change(self, plural: str, obj: Obj) -> None:
        if plural in ("pods", "services"):
            self._kick_all()

    def _taken(self) -> set[int]:
        return {lst.node_port for listeners in self._by_service.values() for lst in listeners}

    def reserve(self, svc: Obj) -> list[socket.socket]:
        """Give each port of a NodePort/LoadBalancer Service its nodePort, holding the ports; 422 if a
        requested one is taken. The sockets go to `start` once the Service is stored (closed otherwise)."""
        spec = svc["spec"]
        if spec.get("type") not in NODE_PORT_TYPES:
            return []
        held: list[socket.socket] = []
        try:
            for i, p in enumerate(spec["ports"]):
                requested = p.get("nodePort")
                try:
                    if requested in self._taken():
                        raise OSError("taken by another service")
                    sock = reserve_port(self.host, int(requested or 0))
                except OSError as e:
                    raise invalid("Service", svc["metadata"]["name"],
                                  f"spec.ports[{i}].nodePort: Invalid value: {requested}: provided port is "
                                  f"already allocated ({e})") from e
                held.append(sock)
                p["nodePort"] = sock.getsockname()[1]
        except BaseException:
            for sock in held:
                sock.close()
            raise
        return held

    def start(self, svc: Obj, held: list[socket.socket]) -> None:
        if held:
            self._by_service[svc["metadata"]["uid"]] = [
                _Listener(self, svc, p, sock) for p, sock in zip(svc["spec"]["ports"], held, strict=True)]
            if self._watcher is None and self.listening is not None:
                self._watcher = asyncio.get_running_loop().create_task(self._watch_listening())

    def stop(self, svc: Obj) -> None:
        for listener in self._by_service.pop(svc["metadata"]["uid"], []):
            listener.stop()

    async def close(self) -> None:
        listeners = [lst for group in self._by_service.values() for lst in group]
        self._by_service.clear()
        for listener in listeners:
            listener.stop()
        for writer in list(self.connections):
            writer.transport.abort()
        if self._watcher is not None:
            self._watcher.cancel()
        await asyncio.gather(*(lst.task for lst in listeners),
                             *((self._watcher,) if self._watcher is not None else ()), return_exceptions=True)
