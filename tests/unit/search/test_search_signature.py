"""Failure signatures: the reason class keeps the mechanism and drops what varies between runs."""

from __future__ import annotations

from harness.search.signature import Signature, reason_class, signatures
from harness.verdict import Verdict


def test_reason_class_drops_counts_names_and_ids() -> None:
    a = reason_class("recovery", "f3_crash: prefill-1 not seen Ready within 4.6s of heal; f4_wedge: x")
    b = reason_class("recovery", "f0_restart: decode-7 not seen Ready within 3s of heal")
    assert a == b == "<engine> not seen ready within #s of heal"
    assert reason_class("nothing_lost", "3 of 40 request(s) lost") == "# of # request lost"


def test_handoff_is_classed_by_its_worst_problem() -> None:
    nums = {"problems": {"timed_out": 4, "stale_engine_id": 1}}
    assert reason_class("handoff", "bad handoffs outside grace windows: ...", nums) == "stale_engine_id"


def test_only_router_checkers_make_signatures() -> None:
    vs = [Verdict.fail("faults", "could not apply"),
          Verdict.fail("output", "2 completion(s) with wrong output"),
          Verdict.ok("handoff"), Verdict.unknown_("recovery", "run ended")]
    assert signatures(vs) == [Signature("output", "# completion with wrong output")]
