"""Value checks of a scenario whose types are right: ranges of settings, workload, actions and checker
parameters. A negative outage, a zero probe interval or `max_recovery_s=-3` must be refused up front (exit 3),
not found at run time (a crash, or worse a FAIL that says nothing about the router)."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any

from fake_engines.core.fault_state import FaultState
from fake_engines.core.gen_request import MAX_MODEL_LEN
from harness.scenario.actions import Action, Die, EngineFault, Restart, SlowStart
from harness.scenario.settings import EngineSettings, RouterSettings, Workload
from harness.scenario.typecheck import type_problems
from reference_router.core.policies import POLICY_NAMES

# Checker parameters that are ratios (availability thresholds), and those that name timeline steps.
_RATIO_PARAMS = frozenset({"before", "during", "after"})
_STEP_PARAMS = frozenset({"faults", "from_fault", "until_fault"})
# Worst case of the fake tokenizer for one plain prompt word (the word, its space, a split).
_TOKENS_PER_WORD = 4
_PROMPT_OVERHEAD_TOKENS = 64
# Engine settings the harness itself adds per engine (a proxied side channel).
_HARNESS_ENGINE_KEYS = frozenset({"advertise_side_channel_port"})


def _at_least(where: str, value: float | None, low: float, strict: bool = False) -> list[str]:
    if value is None:
        return []
    bad = value <= low if strict else value < low
    if bad:
        return [f"{where} must be {'>' if strict else '>='} {low:g}, got {value!r}"]
    return []


def router_problems(r: RouterSettings) -> list[str]:
    out = _at_least("router.health_interval_s", r.health_interval_s, 0, strict=True)
    out += _at_least("router.health_timeout_s", r.health_timeout_s, 0, strict=True)
    out += _at_least("router.failure_threshold", r.failure_threshold, 1)
    out += _at_least("router.success_threshold", r.success_threshold, 1)
    out += _at_least("router.max_concurrent_health_checks", r.max_concurrent_health_checks, 1)
    out += _at_least("router.identity_check_interval_s", r.identity_check_interval_s, 0, strict=True)
    out += _at_least("router.request_timeout_s", r.request_timeout_s, 0, strict=True)
    out += _at_least("router.circuit_breaker_failures", r.circuit_breaker_failures, 1)
    out += _at_least("router.circuit_breaker_open_s", r.circuit_breaker_open_s, 0, strict=True)
    for leg, policy in (("prefill_policy", r.prefill_policy), ("decode_policy", r.decode_policy)):
        if policy not in POLICY_NAMES:
            out.append(f"router.{leg} {policy!r} (known: {', '.join(POLICY_NAMES)})")
    return out


_ENGINE_RULES: dict[str, tuple[float, bool]] = {
    # field: (lower bound, strictly above it)
    "transfer_timeout_s": (0, True),
    "kv_abort_timeout_s": (0, True),
    "handshake_timeout_s": (0, True),
    "load_time_s": (0, False),
    "ttft_ms": (0, False),
    "itl_ms": (0, False),
}


def engine_problems(e: EngineSettings, engines: set[str]) -> list[str]:
    out: list[str] = []
    for name, (low, strict) in _ENGINE_RULES.items():
        out += _at_least(f"engines.{name}", getattr(e, name), low, strict)
    known = {f.name for f in dataclasses.fields(EngineSettings)} - {"per_engine"}
    hints = typing.get_type_hints(EngineSettings)
    for engine, over in e.per_engine.items():
        if engine not in engines:
            out.append(f"engines.per_engine names {engine!r}, which no topology of the scenario has")
        for key, value in over.items():
            where = f"engines.per_engine[{engine!r}].{key}"
            if key in _HARNESS_ENGINE_KEYS:
                continue
            if key not in known:
                out.append(f"{where}: unknown engine setting (known: {', '.join(sorted(known))})")
                continue
            typed = type_problems(value, hints[key], where)
            if typed:
                out += typed
            elif key in _ENGINE_RULES:
                low, strict = _ENGINE_RULES[key]
                out += _at_least(where, value, low, strict)
    return out


def workload_problems(w: Workload) -> list[str]:
    out: list[str] = []
    if w.duration_s <= 0 or w.deadline_s <= 0:
        out.append("workload duration and deadline must be positive")
    if w.mode == "open" and w.rate_rps <= 0:
        out.append("open-loop workload needs rate_rps > 0")
    if w.after_heal_s is not None and (w.mode != "closed" or w.after_heal_s <= 0):
        out.append("workload.after_heal_s must be positive, and needs a closed-loop workload (open-loop "
                   "arrivals are drawn before the run)")
    if w.mode == "closed" and w.concurrency < 1:
        out.append("closed-loop workload needs concurrency >= 1")
    if not (0 <= w.stream_fraction <= 1 and 0 <= w.chat_fraction <= 1):
        out.append("stream_fraction and chat_fraction must be within [0, 1]")
    if not 0 <= w.mistake_fraction <= 1:
        out.append(f"workload.mistake_fraction must be within [0, 1], got {w.mistake_fraction}")
    if not 0 <= w.completion_tokens_fraction <= 1:
        out.append("workload.completion_tokens_fraction must be within [0, 1], got "
                   f"{w.completion_tokens_fraction}")
    for name in ("stop_fraction", "eos_fraction"):
        share = getattr(w, name)
        if not 0 <= share <= 1:
            out.append(f"workload.{name} must be within [0, 1], got {share}")
    if w.prompt_words[0] < 1 or w.prompt_words[0] > w.prompt_words[1]:
        out.append(f"bad prompt_words range {w.prompt_words}")
    out += _at_least("workload.max_tokens", w.max_tokens, 1)
    out += _at_least("workload.think_time_s", w.think_time_s, 0)
    longest = w.max_tokens + w.prompt_words[1] * _TOKENS_PER_WORD + _PROMPT_OVERHEAD_TOKENS
    if w.max_tokens >= 1 and longest > MAX_MODEL_LEN:
        out.append(f"workload requests of up to {longest} tokens (max_tokens {w.max_tokens} plus the "
                   f"prompt) do not fit the engines' context of {MAX_MODEL_LEN} tokens")
    return out


def action_value_problems(action: Action) -> list[str]:
    """Ranges of an engine action's own numbers (type checks come first: `typecheck`)."""
    if isinstance(action, Restart):
        return _at_least("down_s", action.down_s, 0)
    if isinstance(action, SlowStart):
        return _at_least("refuse_s", action.refuse_s, 0)
    if isinstance(action, Die):
        return _at_least("exit_after_s", action.exit_after_s, 0)
    if isinstance(action, EngineFault):
        # The engines' own parser decides what a fault's parameters may be: one source of truth.
        try:
            FaultState().apply(action.kind, dict(action.params))
        except ValueError as exc:
            return [f"fault {action.kind!r}: {exc}"]
    return []


def expect_problems(checker: str, params: Mapping[str, Any], steps: set[str]) -> list[str]:
    """Checker parameters: known names and types (the checkers' own check), then ranges and references."""
    from harness.checkers import CHECKERS, validate_expect

    own = validate_expect(checker, params)
    if own:
        return own
    hints = typing.get_type_hints(CHECKERS[checker].params)
    out: list[str] = []
    for key, value in params.items():
        where = f"{checker}: {key}"
        if value is None:
            continue
        wants_tuple = any(typing.get_origin(a) is tuple for a in (hints[key], *typing.get_args(hints[key])))
        if wants_tuple and not isinstance(value, tuple | list):
            out.append(f"{where} must be a list of names, got {value!r}")
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                out.append(f"{where} must be a finite number, got {value!r}")
            elif key in _RATIO_PARAMS and not 0 <= value <= 1:
                out.append(f"{where} is a ratio within [0, 1], got {value!r}")
            else:
                out += _at_least(where, value, 0)
        if key in _STEP_PARAMS:
            names = value if isinstance(value, tuple | list) else [value]
            out += [f"{where} names no timeline step {n!r}" for n in names if n not in steps]
    return out
