"""Stop strings the router applies to text it builds from token ids (gRPC): cut where the first one begins."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pdchaos.stop_strings import cut_at_stop, stop_strings
from reference_router.core import StopCutter


def test_the_request_s_stop_strings_in_either_form() -> None:
    assert stop_strings({"stop": "end"}) == ("end",)
    assert stop_strings({"stop": ["a", "", "b"]}) == ("a", "b")
    assert stop_strings({}) == () == stop_strings({"stop": None}) == stop_strings({"stop": ""})


def test_the_text_ends_where_the_first_stop_string_begins() -> None:
    assert cut_at_stop(" alpha bravo charlie", ("charlie", "bravo")) == " alpha "
    assert cut_at_stop(" alpha", ("zulu",)) == " alpha"
    assert cut_at_stop(" alpha", ()) == " alpha"
    # The one that completes first ends the output, even if another would have begun earlier.
    assert cut_at_stop("aba", ("aba", "b")) == "a"


def test_a_stream_holds_back_what_may_start_a_stop_string() -> None:
    cutter = StopCutter(("bravo",))
    # " alpha br" may be the start of "bravo": the last 4 characters wait.
    assert cutter.push(" alpha br") == " alph"
    assert cutter.push("avo charlie") == "a "
    assert cutter.stopped and cutter.push(" delta") == "" and cutter.flush() == ""
    # Without a stop string nothing waits.
    free = StopCutter(())
    assert free.push(" alpha") == " alpha" and free.flush() == ""


@given(st.lists(st.text("ab ", max_size=6), max_size=8), st.lists(st.text("ab", min_size=1, max_size=3),
                                                                   max_size=2))
def test_streamed_or_whole_the_client_gets_the_same_text(deltas: list[str], stops: list[str]) -> None:
    cutter = StopCutter(stops)
    sent = "".join(cutter.push(d) for d in deltas) + cutter.flush()
    assert sent == cut_at_stop("".join(deltas), stops)
