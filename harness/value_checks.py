"""Predicates on a JSON value's kind, for the documented shapes of records (`harness.evidence_schema`,
`harness.contract.event_schema`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]


def text(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def text_or_null(v: Any) -> bool:
    return v is None or isinstance(v, str)


def flag(v: Any) -> bool:
    return isinstance(v, bool)


def whole(v: Any) -> bool:
    """A count: a non-negative int (a bool is not one)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0


def number_or_none(v: Any) -> float | None:
    """A JSON number as a float (a bool is not one); None for anything else."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def one_of(values: frozenset[str], null: bool = False) -> Check:
    return lambda v: (null and v is None) or v in values


def error_body_problem(body: Any) -> str | None:
    """What keeps an error answer's body from the OpenAI shape `{"error": {"message", "type", "code"}}`
    (CONTRACTS §2): None when it has it. A client reads the message to learn what went wrong and the type
    to tell its own mistake from the server's."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return "its body is not a JSON object with an `error` object"
    for name in ("message", "type"):
        if not text(err.get(name)):
            return f"its error.{name} is {err.get(name)!r}, not a text"
    code = err.get("code")
    if not (code is None or (isinstance(code, str | int) and not isinstance(code, bool))):
        return f"its error.code is {code!r}"
    return None


def object_or_null(v: Any) -> bool:
    return v is None or isinstance(v, dict)


def shape_problems(fields: Mapping[str, Check], record: Mapping[str, Any],
                   optional: Mapping[str, Check] | None = None) -> list[str]:
    """`lacks NAME` or `has NAME=VALUE` for each field not as `fields` says (and each `optional` one present
    but not as it says)."""
    out = [f"has {name}={record[name]!r}" if name in record else f"lacks {name}"
           for name, ok in fields.items() if not ok(record.get(name))]
    out += [f"has {name}={record[name]!r}" for name, ok in (optional or {}).items()
            if name in record and not ok(record[name])]
    return out
