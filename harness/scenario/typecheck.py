"""Scenario objects checked against their own type annotations.

A scenario file is user input: `Scenario(name=5)`, `expect=("recovery", 5)` or `Restart(mode="bogus")` must
be one clear line naming the field before anything runs, not a traceback (or a silent default) later. The
annotations of the dataclasses are the one description of what each field takes, so the check reads them
instead of repeating them.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

_MAX_SHOWN = 60
# Field metadata key: the field's owner checks it itself (with more to say of where it is than its path).
CHECKED_APART = "pdchaos.typecheck.checked_apart"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple of {_name(args[0])}"
        return f"tuple ({', '.join(_name(a) for a in args)})"
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def type_problems(value: Any, tp: Any, where: str) -> list[str]:
    """What is wrong with `value` as a `tp` (an annotation); `where` names it in the messages."""
    if tp is Any or tp is object:
        return []
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(tp)
        # A dataclass value is judged against its own arm, so the message names the field that is wrong.
        for arm in arms:
            if isinstance(arm, type) and dataclasses.is_dataclass(arm) and type(value) is arm:
                return type_problems(value, arm, where)
        if any(not type_problems(value, arm, where) for arm in arms):
            return []
        return [f"{where}: expected {_name(tp)}, got {_show(value)}"]
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if any(type(value) is type(a) and value == a for a in allowed):
            return []
        return [f"{where}: must be one of {', '.join(repr(a) for a in allowed)}, got {_show(value)}"]
    if origin is tuple:
        return _sequence_problems(value, tp, where)
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return _mapping_problems(value, tp, where)
    return _plain_problems(value, tp, where)


def _sequence_problems(value: Any, tp: Any, where: str) -> list[str]:
    # A list is as good as a tuple in a hand-written file; a string is never a sequence of things here.
    if not isinstance(value, tuple | list):
        return [f"{where}: expected {_name(tp)}, got {_show(value)}"]
    args = typing.get_args(tp)
    if not args:
        return []
    if len(args) == 2 and args[1] is Ellipsis:
        return [p for i, item in enumerate(value) for p in type_problems(item, args[0], f"{where}[{i}]")]
    if len(value) != len(args):
        return [f"{where}: expected {_name(tp)}, got {_show(value)}"]
    return [p for i, (item, a) in enumerate(zip(value, args, strict=True))
            for p in type_problems(item, a, f"{where}[{i}]")]


def _mapping_problems(value: Any, tp: Any, where: str) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"{where}: expected a mapping, got {_show(value)}"]
    args = typing.get_args(tp)
    if len(args) != 2:
        return []
    out = []
    for k, v in value.items():
        out += type_problems(k, args[0], f"{where} key")
        out += type_problems(v, args[1], f"{where}[{k!r}]")
    return out


def _plain_problems(value: Any, tp: Any, where: str) -> list[str]:
    if tp is type(None):
        return [] if value is None else [f"{where}: expected None, got {_show(value)}"]
    if tp is float or tp is int:
        wanted = (int, float) if tp is float else (int,)
        if isinstance(value, bool) or not isinstance(value, wanted):
            return [f"{where}: expected {'a number' if tp is float else 'an integer'}, got {_show(value)}"]
        if isinstance(value, float) and not math.isfinite(value):
            return [f"{where}: must be a finite number, got {_show(value)}"]
        return []
    if not isinstance(tp, type):
        return []
    if not isinstance(value, tp):
        return [f"{where}: expected {_name(tp)}, got {_show(value)}"]
    if dataclasses.is_dataclass(tp):
        return fields_problems(value, where)
    return []


def fields_problems(obj: Any, where: str = "") -> list[str]:
    """Every field of a dataclass instance against its annotation (nested dataclasses included), but those
    marked `CHECKED_APART`."""
    hints = _hints(type(obj))
    out: list[str] = []
    prefix = f"{where}." if where else ""
    for f in dataclasses.fields(obj):
        if f.metadata.get(CHECKED_APART):
            continue
        out += type_problems(getattr(obj, f.name), hints.get(f.name, Any), f"{prefix}{f.name}")
    return out
