"""Reasons shortened at a clause, never mid-word, with what was left out counted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from harness.text import clauses, clip


def test_short_text_is_unchanged() -> None:
    assert clip("recovery: no handoff", 80) == "recovery: no handoff"


def test_long_text_keeps_whole_clauses_and_counts_the_rest() -> None:
    text = "legs_once: 8 legs ran twice; handoff: 3 stale (router side: 3; first: decode-0); availability: x"
    assert clip(text, 40) == "legs_once: 8 legs ran twice (+2 more)"


def test_a_separator_inside_brackets_does_not_split() -> None:
    assert clauses("a (b; c); d") == ["a (b; c)", "d"]


def test_one_long_clause_ends_at_a_word() -> None:
    text = "handoff: " + " ".join(["word"] * 60) + "; next: x"
    out = clip(text, 50)
    assert out.endswith("... (+1 more)") and "wor..." not in out


@given(st.lists(st.text(alphabet="abc xyz;()", min_size=1, max_size=30), min_size=1, max_size=8),
       st.integers(min_value=20, max_value=120))
def test_clipping_never_cuts_a_word(parts: list[str], width: int) -> None:
    text = " ".join("; ".join(parts).split())
    out = clip(text, width)
    strip = ";,:()."
    words = {w.strip(strip) for w in text.split()}
    kept = out.rsplit(" (+", 1)[0] if out != text else out
    for w in kept.split():
        assert w.strip(strip) in words, (text, out)
