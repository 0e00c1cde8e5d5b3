"""Scenario objects as readable Python source: a constructor call per dataclass, fields left at their
defaults omitted, one field per line. Only types the scenario model uses (dataclasses, tuples, lists,
mappings, strings, numbers, booleans, None) are written; anything else is a ValueError, never a repr that
would not load."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import harness.scenario as scenario_module

INDENT = "    "


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def to_source(value: Any, names: set[str], depth: int = 0) -> str:
    """`value` as Python source; `names` collects the classes it uses (to import)."""
    pad, inner = INDENT * depth, INDENT * (depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        names.add(cls.__name__)
        parts = []
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "source":
                continue
            d = _default(f)
            if d is not dataclasses.MISSING and d == v:
                continue
            parts.append(f"{inner}{f.name}={to_source(v, names, depth + 1)},")
        if not parts:
            return f"{cls.__name__}()"
        flat = f"{cls.__name__}(" + " ".join(p.strip() for p in parts).rstrip(",") + ")"
        if len(flat) + len(pad) < 100 and "\n" not in flat:
            return flat
        return f"{cls.__name__}(\n" + "\n".join(parts) + f"\n{pad})"
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return repr(value)
    if isinstance(value, float):
        return repr(round(value, 6))
    if isinstance(value, tuple | list):
        items = [to_source(v, names, depth + 1) for v in value]
        if not items:
            return "()" if isinstance(value, tuple) else "[]"
        flat = ", ".join(items)
        close = "," if isinstance(value, tuple) and len(items) == 1 else ""
        opening, closing = ("(", ")") if isinstance(value, tuple) else ("[", "]")
        if len(flat) < 70 and "\n" not in flat:
            return opening + flat + close + closing
        body = "\n".join(f"{inner}{it}," for it in items)
        return opening + "\n" + body + f"\n{pad}" + closing
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        body = "\n".join(
            f"{inner}{to_source(k, names, depth + 1)}: {to_source(v, names, depth + 1)},"
            for k, v in value.items()
        )
        return "{\n" + body + f"\n{pad}}}"
    raise ValueError(f"cannot write {type(value).__name__} as scenario source: {value!r}")


def module_head(names: set[str]) -> list[str]:
    """The lines that close a scenario file's docstring and import the classes its source uses (`names`
    from `to_source`): every one must be exported by harness.scenario, or the file would not load."""
    unknown = sorted(n for n in names if n not in scenario_module.__all__)
    if unknown:
        raise ValueError(f"scenario classes not exported by harness.scenario: {unknown}")
    return [
        '"""',
        "",
        "from __future__ import annotations",
        "",
        f"from harness.scenario import {', '.join(sorted(names))}",
        "",
    ]
