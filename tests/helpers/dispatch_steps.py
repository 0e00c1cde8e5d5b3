"""Driving a reference_router.core DispatchFlow through the steps it hands out, as the shells do, with
scripted leg results on a virtual clock: the router-core tests' one driver."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from reference_router.core import (
    Answer,
    AwaitIdRead,
    Backoff,
    DispatchFlow,
    DispatchStep,
    Effects,
    ErrorAnswer,
    LegDone,
    LegResult,
    Prepare,
    RunLeg,
    Worker,
)

OK = LegDone()
S = TypeVar("S")


def steps_to_decode(
    flow: DispatchFlow, now: float = 0.0, kv_transfer_params: Mapping[str, Any] | None = None
) -> tuple[Prepare, RunLeg, RunLeg]:
    """A PD request up to its decode leg: the Prepare, the prefill leg, and the decode leg handed out once the
    prefill answered with `kv_transfer_params`. Fails the test when any other step comes."""
    prepare = flow.start(now)
    assert isinstance(prepare, Prepare), prepare
    prefill = flow.on_prepared(None, now)
    assert isinstance(prefill, RunLeg) and not prefill.final, prefill
    decode = flow.on_leg_done(LegDone(kv_transfer_params), now)
    assert isinstance(decode, RunLeg) and decode.final, decode
    return prepare, prefill, decode


def first_leg(flow: DispatchFlow, now: float = 0.0) -> RunLeg:
    """start, then the prompt prepared: the request's first leg (a PD request's prefill, a regular one's only
    leg). Fails the test when the pick refuses or an id read is waited for."""
    prepare = flow.start(now)
    assert isinstance(prepare, Prepare), prepare
    leg = flow.on_prepared(None, now)
    assert isinstance(leg, RunLeg), leg
    return leg


def decode_leg(
    flow: DispatchFlow, now: float = 0.0, kv_transfer_params: Mapping[str, Any] | None = None
) -> RunLeg:
    """A PD request's decode leg, its prefill having answered with `kv_transfer_params`."""
    return steps_to_decode(flow, now, kv_transfer_params)[2]


def answer_leg(
    flow: DispatchFlow, result: LegResult, now: float = 0.0, *, after_headers: bool = False
) -> Answer:
    """The final leg just handed out ends with `result`: the request's Answer."""
    answer = flow.on_leg_done(result, now, after_headers=after_headers)
    assert isinstance(answer, Answer), answer
    return answer


def run(
    flow: DispatchFlow,
    now: float = 0.0,
    legs: Sequence[LegResult] = (),
    *,
    problem: ErrorAnswer | None = None,
    after_headers: bool = False,
    step: DispatchStep | None = None,
) -> list[DispatchStep]:
    """The steps the flow hands out until its Answer (the last): from start(now), or after `step` (one it
    handed out already). Each RunLeg is answered by the next of `legs` (a final one with `after_headers`),
    Prepare with `problem`, AwaitIdRead and Backoff at once, all at `now`. Fails the test when a leg has no
    scripted result or a result is left over."""
    script = list(legs)
    steps: list[DispatchStep] = []
    if step is None:
        step = flow.start(now)
        steps.append(step)
    while not isinstance(step, Answer):
        if isinstance(step, Prepare):
            step = flow.on_prepared(problem, now)
        elif isinstance(step, AwaitIdRead):
            step = flow.on_id_read_waited(now)
        elif isinstance(step, RunLeg):
            assert script, f"no result scripted for the leg to {step.worker.id} (step {len(steps)})"
            step = flow.on_leg_done(script.pop(0), now, after_headers=after_headers and step.final)
        else:
            assert isinstance(step, Backoff), step
            step = flow.on_backoff_done(now)
        steps.append(step)
    assert not script, f"{len(script)} scripted leg result(s) left over"
    return steps


def of_kind(steps: Iterable[DispatchStep], kind: type[S]) -> list[S]:
    return [s for s in steps if isinstance(s, kind)]


def effects_of(steps: Iterable[DispatchStep]) -> Effects:
    """Every Effects the steps carried, in order."""
    out = Effects()
    for s in steps:
        out.extend(s.effects)
    return out


def idle_of(steps: Iterable[DispatchStep]) -> list[Worker]:
    """The workers the steps reported idle, in order."""
    return [w for s in steps for w in s.idle]
