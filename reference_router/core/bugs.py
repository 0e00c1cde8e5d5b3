"""Test-only switches that put a zoo bug back into the router (DESIGN §6): scenarios show they catch it."""

from __future__ import annotations

STALE_ENGINE_ID = "stale_engine_id"
"""#1/#13: the engine id is read only while none is known; never re-read, no identity check."""

PARTIAL_READ_CLEARS_ID = "partial_read_clears_id"
"""#3: a partial metadata read (server info failed) clears the known engine id."""

METADATA_NO_DEADLINE = "metadata_no_deadline"
"""#2: the re-read inside the probe has no deadline; the planner never frees a probe slot that overran."""

KNOWN_BUGS: frozenset[str] = frozenset({STALE_ENGINE_ID, PARTIAL_READ_CLEARS_ID, METADATA_NO_DEADLINE})


def validate_bugs(names: frozenset[str] | set[str] | list[str] | tuple[str, ...]) -> frozenset[str]:
    """Return the names as a frozenset; ValueError naming the unknown ones."""
    bugs = frozenset(names)
    unknown = sorted(bugs - KNOWN_BUGS)
    if unknown:
        raise ValueError(f"unknown bug name(s) {unknown}; known: {sorted(KNOWN_BUGS)}")
    return bugs
