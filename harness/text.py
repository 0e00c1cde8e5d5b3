"""Shortening text for a table or a terminal line without cutting a word or a clause in half."""

from __future__ import annotations

import re


def clauses(text: str) -> list[str]:
    """`text` split at its top-level "; " (a separator inside brackets does not split)."""
    out: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith("; ", i):
            out.append(text[start:i])
            start = i + 2
            i += 1
        i += 1
    out.append(text[start:])
    return [c.strip() for c in out if c.strip()]


def _words(text: str, width: int) -> str:
    """At most `width` characters, ending at a word boundary, with "..." when something was cut."""
    if len(text) <= width:
        return text
    cut = text[: max(0, width - 3)]
    space = cut.rfind(" ")
    # One word longer than the width stays whole: a cut word reads as another word.
    cut = cut[:space] if space > 0 else text.split(" ", 1)[0]
    return (cut.rstrip(" ,;:(") or cut) + "..."


def clip(text: str, width: int) -> str:
    """`text` in at most about `width` characters: whole clauses, then "(+N more)" for the ones left out.

    A first clause longer than `width` alone is cut at a word boundary ("..."), never mid-word.
    """
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    parts = clauses(text)
    kept: list[str] = []
    for i, part in enumerate(parts):
        more = len(parts) - i - 1
        tail = f" (+{more} more)" if more else ""
        candidate = "; ".join([*kept, part])
        if len(candidate) + len(tail) > width:
            break
        kept.append(part)
    if not kept:
        rest = len(parts) - 1
        tail = f" (+{rest} more)" if rest else ""
        return _words(parts[0], max(16, width - len(tail))) + tail
    rest = len(parts) - len(kept)
    return "; ".join(kept) + (f" (+{rest} more)" if rest else "")


# SGR colour codes, as smg, vllm-router and vLLM put them in their logs.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def one_line(message: str) -> str:
    """A usage error is one line on stderr, whatever the message it quotes spans."""
    return " ".join(message.split())
