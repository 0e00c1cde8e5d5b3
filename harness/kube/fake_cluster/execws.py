"""`pods/NAME/exec` over a websocket, in the channel protocol the official client speaks.

Subprotocols `v4.channel.k8s.io` (preferred), `v5.channel.k8s.io` (kubectl offers it alone; v5 adds only
a way to close stdin, which this exec has none of), `v3.channel.k8s.io`, `v2.channel.k8s.io` and
`channel.k8s.io`. Each message is binary, its first byte the channel: 1 stdout, 2 stderr, 3 the final
status. In v4 and v5 the status is JSON (`Success`, or `Failure` with reason `NonZeroExitCode` and the
code as the message of the first cause: the client's `returncode` reads it from there); earlier
versions carry only an error text. Then the server closes.

The command runs as a local process (argv path-translated like the container's, with its environment
and working directory) in its own process group, under a deadline. No stdin and no TTY: such requests
are refused with 400, as are requests for a container that is not running (before the upgrade, so the
client's handshake fails with that status).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal

from aiohttp import WSMsgType, web

from harness.kube.fake_cluster.kubelet import Kubelet
from harness.kube.fake_cluster.pods import ContainerRun, PodRuntime
from harness.kube.fake_cluster.procs import exit_code, killpg, spawn
from harness.kube.fake_cluster.store import bad_request

PROTOCOLS = ("v4.channel.k8s.io", "v5.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io",
             "channel.k8s.io")
_JSON_STATUS = PROTOCOLS[:2]
EXEC_TIMEOUT_S = 60.0
# After the command exits, how long its output may keep coming (a background child holding the pipes).
DRAIN_S = 1.0
STDOUT, STDERR, ERROR = 1, 2, 3
_CHUNK = 32 * 1024
_EXIT_POLL_S = 0.02


def _flag(request: web.Request, key: str) -> bool:
    return request.query.get(key, "").lower() in ("true", "1", "yes")


def choose_protocol(request: web.Request) -> str | None:
    offered = {p.strip() for h in request.headers.getall("Sec-WebSocket-Protocol", ()) for p in h.split(",")}
    return next((p for p in PROTOCOLS if p in offered), None)


def status_message(protocol: str | None, code: int, argv: list[str], note: str = "") -> bytes | None:
    """The channel-3 payload for the end of the command (None: nothing to send)."""
    if protocol in _JSON_STATUS:
        if code == 0:
            return json.dumps({"metadata": {}, "status": "Success"}).encode()
        message = (f"command terminated with non-zero exit code: error executing command {argv}, "
                   f"exit code {code}" + (f" ({note})" if note else ""))
        return json.dumps({
            "metadata": {}, "status": "Failure", "message": message, "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }).encode()
    if code == 0:
        return None
    return (f"command terminated with non-zero exit code: exit code {code}"
            + (f" ({note})" if note else "")).encode()


class ExecSession:
    def __init__(self, ws: web.WebSocketResponse, protocol: str | None) -> None:
        self.ws = ws
        self.protocol = protocol
        self._lock = asyncio.Lock()

    async def send(self, channel: int, data: bytes) -> None:
        async with self._lock:
            await self.ws.send_bytes(bytes([channel]) + data)

    async def pump(self, stream: asyncio.StreamReader | None, channel: int) -> None:
        if stream is None:
            return
        while data := await stream.read(_CHUNK):
            with contextlib.suppress(ConnectionError, RuntimeError):  # the client left: keep draining
                await self.send(channel, data)


async def _until_client_leaves(ws: web.WebSocketResponse) -> None:
    async for msg in ws:
        if msg.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
            break


async def handle_exec(request: web.Request, kubelet: Kubelet, namespace: str,
                      name: str) -> web.StreamResponse:
    argv = request.query.getall("command", [])
    rt, c = kubelet.target(namespace, name, request.query.get("container"), for_exec=True)
    if not argv:
        raise bad_request("you must specify at least 1 command")
    if _flag(request, "stdin") or _flag(request, "tty"):
        raise bad_request("the fake cluster's exec supports neither stdin nor tty: "
                          "use stdin=false, tty=false")
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise bad_request("Upgrade request required")
    protocol = choose_protocol(request)
    ws = web.WebSocketResponse(protocols=(protocol,) if protocol else (), timeout=2.0, autoping=True)
    await ws.prepare(request)
    session = ExecSession(ws, protocol)
    try:
        code, note = await _run(rt, c, argv, session)
    except OSError as e:  # could not start: the shell's "command not found" code
        code, note = 127, f"exec: {argv[0]!r}: {e.strerror or e}"
        with contextlib.suppress(ConnectionError, RuntimeError):
            await session.send(STDERR, (note + "\n").encode())
    payload = status_message(protocol, code, argv, note)
    with contextlib.suppress(ConnectionError, RuntimeError):
        if payload is not None:
            await session.send(ERROR, payload)
        await ws.close()
    return ws


async def _exited(proc: asyncio.subprocess.Process) -> int:
    """The exit status as soon as the process has exited: `wait()` also waits for its pipes to close,
    which a background child of the command can hold open."""
    while proc.returncode is None:
        await asyncio.sleep(_EXIT_POLL_S)
    return proc.returncode


async def _run(rt: PodRuntime, c: ContainerRun, argv: list[str], session: ExecSession) -> tuple[int, str]:
    proc = await spawn([c.paths.translate(a) for a in argv], c.env, c.cwd,
                       asyncio.subprocess.PIPE, asyncio.subprocess.PIPE)
    rt.exec_groups.add(proc.pid)
    loop = asyncio.get_running_loop()
    watcher = loop.create_task(_until_client_leaves(session.ws))
    waiter = loop.create_task(_exited(proc))
    pumps = asyncio.gather(session.pump(proc.stdout, STDOUT), session.pump(proc.stderr, STDERR))
    note = ""
    try:
        done, _ = await asyncio.wait({waiter, watcher}, timeout=EXEC_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            note = "the client went away" if watcher in done else f"timed out after {EXEC_TIMEOUT_S:g} s"
            killpg(proc.pid, signal.SIGKILL)
        code = exit_code(await waiter)
        # What is still in the pipes comes through; a background child holding them open is killed.
        _, pending = await asyncio.wait({pumps}, timeout=DRAIN_S)
        if pending:
            killpg(proc.pid, signal.SIGKILL)
            await pumps
        return code, note
    finally:
        watcher.cancel()
        pumps.cancel()
        await asyncio.wait({watcher})  # (wait, not await: a cancellation of ours is not swallowed)
        killpg(proc.pid, signal.SIGKILL)  # what the command left behind ends with the session
        if proc.returncode is None:
            await proc.wait()
        rt.exec_groups.discard(proc.pid)
