"""A simulated fake engine: the fake engines' own core (`EngineState`, `RequestFlow`) driven in virtual time.

The process around the core is modelled: listening or not (down, loading, crashed), frozen (SIGSTOP:
connections are accepted, nothing is answered until it is resumed), dying (health 503, then gone). Every
answer passes the same fault gates as the real servers (`FaultState.gate_delay`); generation follows the
request flow step by step, its KV handoff crossing the simulated network to the prefill's bootstrap server
and side channel.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from fake_engines.core.bootstrap import query_engine_ids
from fake_engines.core.calls import (
    BOOTSTRAP_QUERY,
    CLIENT_GONE,
    HARNESS,
    HEALTH,
    MODEL_INFO,
    ROUTER,
    SERVER_INFO,
    engine_caller,
    leg_of_openai,
    tag_of_openai,
)
from fake_engines.core.engine_config import EngineConfig
from fake_engines.core.engine_state import EngineState
from fake_engines.core.gen_request import GenRequest, GenResult, RequestError
from fake_engines.core.handoff import Handshake, PullFrom, QueryBootstrap, WaitUntil
from fake_engines.core.records import find_tag
from fake_engines.core.request_flow import AwaitGate, Finish, Reject, RequestFlow, Sleep
from fake_engines.core.timing import PROCESS_START_S, SHUTDOWN_GRACE_S
from fake_engines.core.wire import HandshakeRequest, PullRequest
from harness.scenario.links import LinkRef
from harness.topology import EngineSpec
from harness.worlds.sim.cell import CellView
from harness.worlds.sim.network import (
    CUT,
    HOP_S,
    CallResult,
    Deadline,
    Refused,
    Reply,
    SimNetwork,
    cut_work,
    wait,
    wait_event,
)

CONNECTOR_NAMES = {"mooncake": "MooncakeConnector", "nixl": "NixlConnector", "none": ""}
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}
# Bytes per prompt token of the fakes' KV payload (what a pull carries back).
KV_BYTES_PER_TOKEN = 64
@dataclass
class StreamMarks:
    """A streamed generation leg's progress, in simulated time: when its answer started (an HTTP stream's
    200 and headers go out before generation) and when its first token left the engine, each with when it
    reached the caller (`reach(sent_at)`, asked as it is sent: the link's faults of that moment; None: it
    never does)."""

    reach: Callable[[float], float | None]
    started_reached: float | None = None
    first_token_reached: float | None = None

    def started(self, now: float) -> None:
        self.started_reached = self.reach(now)

    def first_token(self, now: float) -> None:
        self.first_token_reached = self.reach(now)


# The links a call reaches an engine's servers by (`SimNetwork.call`).
SERVER_LINKS = ("serve", "bootstrap", "side_channel")
# A new engine process takes PROCESS_START_S to serve, an in-process restart this long to close and reopen
# its listeners.
LISTENERS_RESTART_S = 0.02


class SimEngine:
    def __init__(
        self,
        cell: CellView,
        spec: EngineSpec,
        settings: dict[str, Any],
        new_id: Callable[[], uuid.UUID],
        first_pid: int,
    ) -> None:
        self.cell = cell
        self.env: simpy.Environment = cell.env
        self.net: SimNetwork = cell.net
        self.spec = spec
        self.name = spec.name
        connector = spec.engine_connector(cell.topology.connector)
        self.config = EngineConfig(
            name=spec.name,
            role=spec.engine_role,
            connector=connector,
            host=spec.host,
            http_port=spec.http_port,
            grpc_port=spec.grpc_port,
            control_port=spec.control_port,
            bootstrap_port=spec.bootstrap_port if connector == "mooncake" and spec.role == "prefill" else 0,
            nixl_port=spec.nixl_port if connector == "nixl" else 0,
            transfer_timeout_s=float(settings["transfer_timeout_s"]),
            kv_abort_timeout_s=float(settings["kv_abort_timeout_s"]),
            handshake_timeout_s=float(settings["handshake_timeout_s"]),
            load_failure_policy=str(settings["load_failure_policy"]),
            ttft_ms=float(settings.get("ttft_ms") or 0.0),
            itl_ms=float(settings.get("itl_ms") or 0.0),
            bugs=frozenset(settings.get("inject_bugs") or ()),
        )
        self.state = EngineState(
            self.config, self.env.now, new_id=new_id, on_record=cell.add_engine_record, keep_records=False
        )
        self.listening = False
        self.frozen = False
        self.exists = False  # a process is there (alive, maybe frozen or dying)
        self.pid = first_pid
        self.started_wall: float | None = None
        self.side_port = 0
        self._thawed = self.env.event()
        self._faults_changed = self.env.event()
        # Succeeds when a request ends or a pull is served: what a graceful stop waits on.
        self._activity = self.env.event()
        # The processes inside this engine's handlers, per link they came in on (insertion-ordered: the order
        # work is cut in must not depend on memory addresses), and the interrupt cause that says "this engine
        # stopped".
        self._work: dict[str, dict[object, simpy.Process]] = {link: {} for link in SERVER_LINKS}
        self._stop = ("stop", spec.name)
        # Servers closed while the process lives on (their work finishing, the rest still serving), and per
        # server a count of its closes: a connection made before a close reaches no server of a later start.
        self._closed: set[str] = set()
        self._epochs: dict[str, int] = dict.fromkeys(SERVER_LINKS, 0)
        # Succeed when a handler ends, for the closes waiting for their servers' work to finish.
        self._work_waiters: list[simpy.Event] = []
        self._exit: simpy.Process | None = None
        self._caller = engine_caller(spec.name)
        # How the last process ended: its pid and exit status (a signal as its negative number).
        self.last_exit: tuple[int, int] | None = None

    # ------------------------------------------------------------------ the process

    def control_state(self) -> dict[str, Any]:
        """What the engine's control API would say of it (CONTRACTS §1 STATE)."""
        s = self.state
        return {
            "name": self.name,
            "pid": self.pid if self.exists else None,
            "role": self.spec.role,
            "connector": self.config.connector,
            "engine_id": s.engine_id,
            "generation": s.identity.generation,
            "started_at": self.started_wall,
            "http_port": self.spec.http_port,
            "grpc_port": self.spec.grpc_port,
            "bootstrap_port": self.config.bootstrap_port or None,
            "side_channel_port": self.side_port or None,
            "nixl_port": self.config.nixl_port or None,
            "serving": self.listening and not self._closed,
            "dead": s.dead,
            "draining": s.draining,
            "faults": s.faults.as_dict(),
        }

    def accepting(self, link: str = "serve") -> bool:
        """Whether a connection to the server behind `link` is accepted now."""
        return self.listening and link not in self._closed

    def epoch(self, link: str) -> int:
        """Which run of the server behind `link` a connection made now reaches (`serve` resets a connection
        whose server closed since)."""
        return self._epochs[link]

    def start(
        self,
        refuse_s: float = 0.0,
        restart: bool = False,
        engine_id: str | None = None,
        new_process: bool = True,
    ) -> Generator[Any, Any, None]:
        """Start (or restart) the engine: listeners refuse for `refuse_s` (plus a new process's start-up),
        then serve with a new identity; nothing when the process was killed or replaced meanwhile."""
        self.exists = True
        pid = self.pid
        wait = refuse_s + (PROCESS_START_S if new_process else LISTENERS_RESTART_S)
        if wait > 0:
            yield self.env.timeout(wait)
        if not self.exists or self.pid != pid:
            return
        now = self.env.now
        if restart:
            self.state.restart(now, engine_id)
        else:
            self.state.start(now)
        self.started_wall = self.cell.wall(now)
        if self.config.connector == "mooncake" and self.spec.role == "prefill":
            self.side_port = self.cell.new_side_port(self.name)
        elif self.config.connector == "nixl" and self.spec.role == "prefill":
            self.side_port = self.config.nixl_port
        self.state.side_channel_ports = [self.side_port] if self.side_port else []
        self._closed.clear()
        self.listening = True
        self._wake_gates()

    def stop(self, exists: bool = False) -> None:
        """Listeners closed, work in progress cut (its connections reset); `exists`: the process is still
        there (a restart in progress) or gone."""
        self.listening = False
        self.exists = exists
        self.state.side_channel_ports = []
        self.side_port = 0
        for link, work in self._work.items():
            self._epochs[link] += 1
            cut_work(self.env, work, self._stop)
        if self.frozen:
            self.thaw()
        if not exists:
            self._poke()  # a graceful stop waiting on this process sees it go
            # The process is gone, and its exit timer with it; a restart in place keeps the timer (the real
            # engine's exit task lives on in the same process).
            if self._exit is not None and self._exit.is_alive:
                self._exit.interrupt("gone")
            self._exit = None

    def kill(self, exit_code: int = -9) -> None:
        """The process is gone (by SIGKILL unless `exit_code` says it exited itself); a respawn brings a new
        one."""
        if self.exists:
            self.last_exit = (self.pid, exit_code)
        self.stop(exists=False)

    def exit_code(self, pid: int) -> int | None:
        """How process `pid` ended, if it was the last to end."""
        return self.last_exit[1] if self.last_exit is not None and self.last_exit[0] == pid else None

    def restart(self, down_s: float, engine_id: str | None = None) -> Generator[Any, Any, None]:
        pid = self.pid
        yield from self._close_servers()
        if not self.exists or self.pid != pid:
            return  # killed or replaced while its servers closed
        self.stop(exists=True)
        yield from self.start(refuse_s=down_s, restart=True, engine_id=engine_id, new_process=False)

    def _close_servers(self, deadline: float | None = None) -> Generator[Any, Any, bool]:
        """Close the servers one after the other, as the real engine does before a restart in place or an
        exit (runtime `_stop_serving`): the gRPC server, the side channels, the bootstrap app, the serving
        app. A server closed refuses new connections; its work in progress may finish within the grace
        (the side channels' is cut at once), then is cut; the servers not yet closed serve on meanwhile.
        Only the cell's transport carries serving work: it is the gRPC server in a gRPC cell, the serving
        app in an HTTP one. `deadline`: cut whatever is left then (a SIGKILL after a grace); returns False
        when it did."""
        grpc = self.cell.topology.transport == "grpc"
        order = ("serve", "side_channel", "bootstrap") if grpc else ("side_channel", "bootstrap", "serve")
        in_time = True
        for link in order:
            self._closed.add(link)
            self._epochs[link] += 1
            if link == "side_channel":
                self.state.side_channel_ports = []
                self.side_port = 0
                cut_work(self.env, self._work[link], self._stop)
            else:
                in_time = (yield from self._grace(link, deadline)) and in_time
        return in_time

    def _grace(self, link: str, deadline: float | None) -> Generator[Any, Any, bool]:
        """Wait until the work that came in on `link` is done, at most SHUTDOWN_GRACE_S (and not past
        `deadline`), then cut the rest. False when the deadline cut work."""
        work = self._work[link]
        grace_end = self.env.now + SHUTDOWN_GRACE_S
        end = grace_end if deadline is None else max(self.env.now, min(grace_end, deadline))
        cut_short = end < grace_end
        while work and self.env.now < end:
            left = self.env.event()
            self._work_waiters.append(left)
            yield left | self.env.timeout(end - self.env.now)
        late = bool(work) and cut_short
        cut_work(self.env, work, self._stop)
        return not late

    def wait_gone(self, timeout_s: float) -> Generator[Any, Any, bool]:
        """Wait until the process ends by itself (a death's exit, a drained graceful stop), at most
        `timeout_s`; whether it did."""
        end = self.env.now + timeout_s
        while self.exists and self.env.now < end:
            yield self._activity | self.env.timeout(end - self.env.now)
        return not self.exists

    def respawn(self) -> Generator[Any, Any, None]:
        self.pid += 1
        yield from self.start(restart=True)

    def die(self, exit_after_s: float) -> dict[str, Any]:
        changed = self.state.die()
        self._exit = self.env.process(self._exit_later(exit_after_s, self.pid))
        return changed

    def _exit_later(self, delay: float, pid: int) -> Generator[Any, Any, None]:
        """A dying engine's exit: its servers close (each with its grace), then the process `pid` ends
        (nothing when it already went another way)."""
        try:
            yield self.env.timeout(delay)
            while self.frozen:  # a stopped process runs no timer until it is resumed
                yield self._thawed
            if self.pid != pid or not self.exists:
                return
            yield from self._close_servers()
        except simpy.Interrupt:
            return
        if self._exit is self.env.active_process:
            self._exit = None
        if self.pid == pid and self.exists:
            self.kill(exit_code=1)

    def graceful_stop(self, grace_s: float, since: float | None = None) -> Generator[Any, Any, bool | None]:
        """SIGTERM, sent at `since` (default now): the process's handler begins the drain (a stopped process
        runs it once resumed), waits until the core's drain says the process may end (running requests
        and pending pulls done), then exits; killed when that takes longer than `grace_s` from the signal.
        Returns whether it was killed; None when the process went another way first (crash, respawn, a
        death's exit), noticed as it happens."""
        start = self.env.now if since is None else since
        pid = self.pid
        killed = False
        handled = False
        while True:
            if self.pid != pid or not self.exists or (handled and not self.state.draining):
                return None
            if self.frozen:
                # A stopped process handles no signal until it is resumed: only the SIGKILL reaches it.
                if self.env.now >= start + grace_s:
                    killed = True
                    break
                yield self._thawed | self.env.timeout(start + grace_s - self.env.now)
                continue
            if not handled:
                self.state.begin_drain(self.env.now)
                handled = True
            if self.state.drained(self.env.now):
                break
            if self.env.now >= start + grace_s:
                killed = True
                break
            wake = min(self.state.drain_wake(self.env.now), start + grace_s)
            # Never a zero wait: the loop must move the clock, or it would spin at one instant.
            yield self.env.any_of([self._activity, self.env.timeout(max(1e-6, wake - self.env.now))])
        if not killed:
            # Drained: the process closes its servers (the streams still going out get the grace), unless
            # the SIGKILL after `grace_s` comes first.
            in_time = yield from self._close_servers(deadline=start + grace_s)
            if self.pid != pid or not self.exists:
                return None
            killed = not in_time
        self.kill(exit_code=-9 if killed else 0)
        return killed

    def _poke(self) -> None:
        # Most requests end with nobody waiting: an event without callbacks would only cost a step.
        if self._activity.callbacks:
            event, self._activity = self._activity, self.env.event()
            event.succeed()

    def freeze(self) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False
        event, self._thawed = self._thawed, self.env.event()
        event.succeed()

    def set_fault(self, spec: dict[str, Any]) -> dict[str, Any]:
        changed = self.state.faults.apply_spec(spec)
        return changed

    def clear_faults(self, kind: str | None) -> dict[str, Any]:
        changed = self.state.faults.clear_all() if kind is None else self.state.faults.clear(kind)
        self._wake_gates()
        return changed

    def _wake_gates(self) -> None:
        event, self._faults_changed = self._faults_changed, self.env.event()
        event.succeed()

    # ------------------------------------------------------------------ serving

    def serve(
        self,
        handler: Callable[[float | None], Generator[Any, Any, Reply]],
        deadline: float | None,
        link: str = "serve",
        epoch: int | None = None,
    ) -> Generator[Any, Any, Reply]:
        """Run a handler in the caller's process (`SimNetwork.call`), for a call that came in on `link`
        (connected to the `epoch` run of its server): registered while it runs, so a stop of this engine
        cuts it (the connection resets); paused while the process is frozen; every wait of it bounded by
        the caller's `deadline`."""
        if epoch is not None and epoch != self._epochs[link]:
            # Its server closed while the request was on its way: the connection is reset.
            return Reply(CUT, 0)
        proc = self.env.active_process
        token = object()
        work = self._work[link]
        if proc is not None:
            work[token] = proc
        try:
            if self.frozen:
                yield from self._awake(deadline)
            return (yield from handler(deadline))
        except simpy.Interrupt as stop:
            if stop.cause is not self._stop:
                raise
            return Reply(CUT, 0)
        except Refused:
            return Reply(CUT, 0)
        finally:
            work.pop(token, None)
            if self._work_waiters:
                waiters, self._work_waiters = self._work_waiters, []
                for left in waiters:
                    if not left.triggered:
                        left.succeed()

    def _awake(self, deadline: float | None) -> Generator[Any, Any, None]:
        # Hot paths test `self.frozen` before calling this: most waits find the process running.
        while self.frozen:
            yield from wait_event(self.env, self._thawed, deadline)

    def _gate(self, surface: str, deadline: float | None) -> Generator[Any, Any, None]:
        """The real servers' fault gate: park while the surface is wedged, then its added latency."""
        while True:
            if self.frozen:
                yield from self._awake(deadline)
            delay = self.state.faults.gate_delay(surface)
            if delay is None:
                yield from wait_event(self.env, self._faults_changed, deadline)
                continue
            if delay > 0:
                yield from wait(self.env, delay, deadline)
                if self.frozen:
                    yield from self._awake(deadline)
            return

    # Every call below leaves an engine call record, as the real surfaces do (`fake_engines.core.calls`):
    # stamped when its handler starts (a frozen process starts it once resumed), ended when it answers or
    # its caller gives up (CLIENT_GONE); a call the engine's stop cuts leaves none, as a killed process.

    def _recorded(
        self,
        call: str,
        caller: str,
        work: Generator[Any, Any, Reply],
        answer: Callable[[Reply], tuple[int, dict[str, Any]]],
    ) -> Generator[Any, Any, Reply]:
        """Run a handler's `work` and record it: `answer(reply)` gives the status and detail."""
        start = self.env.now
        reply: Reply | None = None
        try:
            reply = yield from work
            return reply
        except simpy.Interrupt as cut:
            if cut.cause is not self._stop:
                self._record_call(call, caller, start, CLIENT_GONE, {})
            raise
        except Deadline:
            self._record_call(call, caller, start, CLIENT_GONE, {})
            raise
        finally:
            if reply is not None:
                self._record_call(call, caller, start, *answer(reply))

    def _record_call(self, call: str, caller: str, start: float, status: int, detail: dict[str, Any]) -> None:
        self.state.add_call(self.cell.wall(start), call, status, self.env.now - start, caller, detail)

    def health(
        self, deadline: float | None, caller: str = HARNESS, call: str = HEALTH
    ) -> Generator[Any, Any, Reply]:
        """`call`: HEALTH (`GET /health`: 503 when unhealthy) or GRPC_HEALTH (`HealthCheck`: an answer
        saying healthy or not)."""

        def work() -> Generator[Any, Any, Reply]:
            yield from self._gate("health", deadline)
            return Reply(self.state.healthy, 64)

        def answer(reply: Reply) -> tuple[int, dict[str, Any]]:
            status = 200 if reply.value or call != HEALTH else 503
            return status, {"healthy": bool(reply.value)}

        return (yield from self._recorded(call, caller, work(), answer))

    def server_info(self, deadline: float | None, caller: str = ROUTER) -> Generator[Any, Any, Reply]:
        """GetServerInfo: ("error", None) under fail_server_info, else the fields a router reads."""

        def work() -> Generator[Any, Any, Reply]:
            yield from self._gate("server_info", deadline)
            s = self.state
            if s.faults.fail_server_info:
                return Reply(("error", None), 64)
            info = {
                "kv_engine_id": s.reported_engine_id() if self.config.connector != "none" else "",
                "kv_connector": CONNECTOR_NAMES[self.config.connector],
                "kv_role": KV_ROLES[self.spec.role] if self.config.connector != "none" else "",
                "uptime_seconds": s.identity.uptime_s(self.env.now),
                "data_parallel_size": 1,
            }
            return Reply(("ok", info), 256)

        def answer(reply: Reply) -> tuple[int, dict[str, Any]]:
            outcome, info = reply.value
            return (503, {}) if outcome == "error" else (200, {"kv_engine_id": info["kv_engine_id"]})

        return (yield from self._recorded(SERVER_INFO, caller, work(), answer))

    def model_info(self, deadline: float | None, caller: str = ROUTER) -> Generator[Any, Any, Reply]:
        def work() -> Generator[Any, Any, Reply]:
            yield from self._gate("metadata", deadline)
            return Reply("ok", 256)

        return (yield from self._recorded(MODEL_INFO, caller, work(), lambda _: (200, {})))

    def bootstrap_query(self, deadline: float | None, caller: str = ROUTER) -> Generator[Any, Any, Reply]:
        def work() -> Generator[Any, Any, Reply]:
            yield from self._gate("side_channel", deadline)
            return Reply(self.state.bootstrap_answer(), 256)

        def answer(reply: Reply) -> tuple[int, dict[str, Any]]:
            return 200, {"engine_ids": query_engine_ids(reply.value)}

        return (yield from self._recorded(BOOTSTRAP_QUERY, caller, work(), answer))

    def side_channel(self, msg: Any, port: int, deadline: float | None) -> Generator[Any, Any, Reply]:
        if port != self.side_port or not self.side_port:
            raise Refused("side channel of an earlier start")
        yield from self._gate("side_channel", deadline)
        answer = self.state.answer_side_channel(msg, self.state.engine_id, self.env.now)
        self._poke()
        payload = KV_BYTES_PER_TOKEN * int(getattr(answer, "n_tokens", 0) or 0)
        return Reply(answer, 128 + payload)

    def generate(
        self, req: GenRequest, deadline: float | None, marks: StreamMarks | None = None
    ) -> Generator[Any, Any, Reply]:
        """One generation leg through the request flow, answered as the HTTP/gRPC surfaces do: the reply is
        the flow's final step (Finish or Reject), and it leaves once the last token is out. A streamed leg
        (`marks`) keeps its connection while its tokens go out, so a stop, a freeze or a dropped link
        mid-stream reaches it; `marks` says when the answer started (an HTTP stream's headers go out before
        generation) and when the first token left. A caller gone or a stop aborts the flow (no record, as
        a cancelled request)."""
        start = self.env.now
        if marks is not None:
            marks.started(start)
        flow = RequestFlow(self.state, req)
        step = flow.next_step()
        try:
            while not isinstance(step, Finish | Reject):
                step = yield from self._perform(flow, step, deadline)
        except (simpy.Interrupt, Deadline) as cut:
            gone = flow.abort()
            if not (isinstance(cut, simpy.Interrupt) and cut.cause is self._stop):
                self._refused_leg(req, start, CLIENT_GONE, gone.message)
            raise
        finally:
            self._poke()
        if isinstance(step, Reject):
            if step.record is None:
                self._refused_leg(req, start, step.status, step.message)
            return Reply(step, 256)
        result: GenResult = step.result
        if marks is not None:
            marks.first_token(self.env.now)
        rest = result.itl_s * max(0, len(result.token_ids) - 1)
        if rest > 0:
            yield from wait(self.env, rest, deadline)
            if self.frozen:
                yield from self._awake(deadline)
        return Reply(result, 512 + 8 * len(result.token_ids))

    def refuse(
        self, body: dict[str, Any], chat: bool, error: RequestError, deadline: float | None, grpc: bool
    ) -> Generator[Any, Any, Reply]:
        """A leg whose body the engine's surface refuses before generating (the real servers' 400s)."""
        start = self.env.now
        yield from self._awake(deadline)
        self.state.add_refused_leg(
            self.cell.wall(start), error.status, self.env.now - start, ROUTER, request_id=None,
            tag=tag_of_openai(body), leg=leg_of_openai(body, chat, grpc=grpc), error=error.message,
        )
        return Reply(Reject(error.status, error.message, error.err_type), 256)

    def _refused_leg(self, req: GenRequest, start: float, status: int, error: str) -> None:
        self.state.add_refused_leg(
            self.cell.wall(start), status, self.env.now - start, ROUTER, request_id=req.request_id,
            tag=find_tag(req.prompt_text), leg=req.leg, error=error,
        )

    def _perform(self, flow: RequestFlow, step: Any, deadline: float | None) -> Generator[Any, Any, Any]:
        env, cell = self.env, self.cell
        if isinstance(step, AwaitGate):
            yield from self._gate(step.surface, deadline)
            return flow.on_gate_passed(env.now, cell.wall(env.now))
        if isinstance(step, Sleep):
            yield from wait(env, step.seconds, deadline)
            if self.frozen:
                yield from self._awake(deadline)
            return flow.on_slept(env.now, cell.wall(env.now))
        if isinstance(step, WaitUntil):
            yield from wait(env, step.deadline - env.now, deadline)
            yield from self._awake(deadline)
            return flow.on_deadline(env.now, cell.wall(env.now))
        if isinstance(step, QueryBootstrap):
            prefill = cell.engine_at_url(step.url)
            lookup = self._caller
            result = yield from self._call_prefill(
                prefill, "bootstrap", lambda p, d: p.bootstrap_query(d, lookup), step.timeout_s, deadline
            )
            yield from self._awake(deadline)
            error = None if result.ok else _transport_error(result.error)
            return flow.on_query_result(
                result.value if result.ok else None, env.now, cell.wall(env.now), error=error
            )
        if isinstance(step, Handshake | PullFrom):
            prefill = cell.engine_at_port(step.port)
            msg = (
                HandshakeRequest(step.engine_id)
                if isinstance(step, Handshake)
                else PullRequest(step.engine_id, step.transfer_key)
            )
            result = yield from self._call_prefill(
                prefill,
                "side_channel",
                lambda p, d: p.side_channel(msg, step.port, d),
                step.timeout_s,
                deadline,
            )
            if self.frozen:
                yield from self._awake(deadline)
            value = result.value if result.ok else None
            error = None if result.ok else _transport_error(result.error)
            if isinstance(step, Handshake):
                return flow.on_handshake_result(value, env.now, cell.wall(env.now), error=error)
            return flow.on_pull_result(value, env.now, cell.wall(env.now), error=error)
        raise RuntimeError(f"unknown request flow step {step!r}")

    def _call_prefill(
        self,
        prefill: SimEngine | None,
        link: str,
        handler: Callable[[SimEngine, float | None], Generator[Any, Any, Reply]],
        timeout_s: float,
        deadline: float | None,
    ) -> Generator[Any, Any, CallResult]:
        if prefill is None:
            yield from wait(self.env, HOP_S, deadline)
            return CallResult(error="refused")
        return (
            yield from self.net.call(
                LinkRef(prefill.name, link), prefill, lambda d: handler(prefill, d), 128, timeout_s, deadline
            )
        )


def _transport_error(error: str | None) -> str:
    """How the real decode's transport names a failed call (the plans tell a timeout from the rest)."""
    if error == "timeout":
        return "timeout"
    return {
        "refused": "ConnectionRefusedError: connection refused",
        "reset": "ConnectionResetError: connection reset by peer",
        "closed": "IncompleteReadError: connection closed",
    }.get(error or "", error or "error")
