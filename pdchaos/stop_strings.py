"""vLLM's stop strings, one rule for the fake engines and the router: the output ends with the first stop
string that completes in it, and its text ends where that stop string begins (the stop string is not part of
it). The engine applies it as it generates; the router, to text it builds from token ids (gRPC)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def stop_strings(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The request's `stop` (a string or a list of strings; the shared request check refused any other
    form); an empty one stops nothing."""
    raw = body.get("stop")
    if isinstance(raw, str):
        return (raw,) if raw else ()
    if isinstance(raw, list):
        return tuple(s for s in raw if isinstance(s, str) and s)
    return ()


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` up to where the stop string that completes first in it begins (all of it when none occurs):
    generation ends as soon as one completes, so one that would end later never does."""
    first: tuple[int, int] | None = None
    for s in stops:
        i = text.find(s) if s else -1
        if i >= 0 and (first is None or (i + len(s), i) < first):
            first = (i + len(s), i)
    return text if first is None else text[: first[1]]
